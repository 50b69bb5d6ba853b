//! The topology benchmark's input, shaped like production's: a zipf mix of items plus one
//! viral item; new likes, and unlikes of earlier ones; duplicates as the producer and the
//! relay make them (a recent record sent again), which arrive out of order within an edge
//! when the edge has flipped since (a like re-delivered after its unlike); a trickle of
//! records that are not LikeEvents; event times from the clock at each send. The ground truth
//! is kept alongside.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::Rng;

use likes::schema::v1::Source;

/// Zipf(s = 1) over `n` items by inverse CDF.
pub(crate) struct Zipf(Vec<f64>);

impl Zipf {
    pub(crate) fn new(n: u32) -> Self {
        let mut acc = 0.0;
        let cdf = (1..=n)
            .map(|k| {
                acc += 1.0 / k as f64;
                acc
            })
            .collect::<Vec<_>>();
        let total = acc;
        Zipf(cdf.into_iter().map(|c| c / total).collect())
    }
    pub(crate) fn sample(&self, rng: &mut StdRng) -> usize {
        let u: f64 = rng.random();
        self.0.partition_point(|&c| c < u).min(self.0.len() - 1)
    }
}

/// Share of records that re-send one of the recent records.
pub(crate) const DUPLICATE_SHARE: f64 = 0.03;
/// Share of records that are not a LikeEvent (dead-lettered by both stage 1 and the peer).
pub(crate) const INVALID_SHARE: f64 = 0.001;
/// How many recent records a duplicate may copy.
const RECENT: usize = 4096;

/// Generates records and keeps the ground truth.
pub(crate) struct Generator {
    rng: StdRng,
    zipf: Zipf,
    viral_share: f64,
    next_user: u64,
    liked: Vec<(u32, u64)>,
    pub(crate) truth: HashMap<String, i64>,
    /// The topology's bucket count.
    buckets: u32,
    recent: Vec<(String, Vec<u8>)>,
    pub(crate) duplicates: u64,
    pub(crate) invalid: u64,
}

const VIRAL: u32 = u32::MAX;

impl Generator {
    pub(crate) fn new(rng: StdRng, items: u32, viral_share: f64, buckets: u32) -> Self {
        Generator {
            rng,
            zipf: Zipf::new(items),
            viral_share,
            next_user: 0,
            liked: Vec::new(),
            truth: HashMap::new(),
            buckets,
            recent: Vec::with_capacity(RECENT),
            duplicates: 0,
            invalid: 0,
        }
    }

    fn item_name(i: u32) -> String {
        if i == VIRAL {
            "item-viral".into()
        } else {
            format!("item-{i}")
        }
    }

    /// The next record (key, payload), stamped `now_ms` if it is a new flip.
    pub(crate) fn next(&mut self, now_ms: i64) -> (String, Vec<u8>) {
        let roll: f64 = self.rng.random();
        if roll < INVALID_SHARE {
            self.invalid += 1;
            // Field 1 (item_id) claims 255 bytes and there are none: no protobuf reader
            // decodes it.
            return ("item-0#0".into(), vec![0x0a, 0xff, 0x01]);
        }
        if roll < INVALID_SHARE + DUPLICATE_SHARE && !self.recent.is_empty() {
            self.duplicates += 1;
            let j = self.rng.random_range(0..self.recent.len());
            return self.recent[j].clone();
        }
        let record = self.flip(now_ms);
        if self.recent.len() < RECENT {
            self.recent.push(record.clone());
        } else {
            let j = self.rng.random_range(0..RECENT);
            self.recent[j] = record.clone();
        }
        record
    }

    fn flip(&mut self, now_ms: i64) -> (String, Vec<u8>) {
        let unlike = !self.liked.is_empty() && self.rng.random_bool(0.1);
        let (item, user, op) = if unlike {
            let j = self.rng.random_range(0..self.liked.len());
            let (item, user) = self.liked.swap_remove(j);
            (item, user, 2)
        } else {
            let item = if self.rng.random_bool(self.viral_share) {
                VIRAL
            } else {
                self.zipf.sample(&mut self.rng) as u32
            };
            self.next_user += 1;
            self.liked.push((item, self.next_user));
            (item, self.next_user, 1)
        };
        let item_id = Self::item_name(item);
        *self.truth.entry(item_id.clone()).or_insert(0) += if op == 1 { 1 } else { -1 };
        let user_id = format!("u{user}");
        likes::records::Flip {
            item: &item_id,
            user: &user_id,
            op_id: op,
            liked: op == 1,
            event_time_ms: now_ms,
            prev_event_time_ms: if op == 2 { now_ms - 1 } else { 0 },
            earlier_event_times_ms: &[],
            source: Source::Test,
            platform: likes::schema::v1::ClientPlatform::Unspecified,
        }
        .record(self.buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn zipf_prefers_the_head() {
        let z = Zipf::new(1000);
        let mut rng = StdRng::seed_from_u64(1);
        let head = (0..10_000).filter(|_| z.sample(&mut rng) < 10).count();
        assert!(head > 3000, "{head}");
    }

    #[test]
    fn the_mix_has_duplicates_reorders_and_invalid_records_and_the_truth_ignores_them() {
        use prost::Message as _;
        let mut g = Generator::new(StdRng::seed_from_u64(7), 100, 0.1, 64);
        let mut latest: HashMap<(String, String), u64> = HashMap::new();
        let (mut stale, mut undecodable) = (0, 0);
        for i in 0..100_000 {
            let (_, v) = g.next(i);
            match likes::schema::v1::LikeEvent::decode(v.as_slice()) {
                Ok(e) => {
                    let seen = latest.entry((e.item_id, e.user_id)).or_insert(0);
                    stale += usize::from(e.op_id < *seen);
                    *seen = (*seen).max(e.op_id);
                }
                Err(_) => undecodable += 1,
            }
        }
        assert_eq!(undecodable as u64, g.invalid);
        assert!((50..200).contains(&g.invalid), "{}", g.invalid);
        assert!((2_000..4_000).contains(&g.duplicates), "{}", g.duplicates);
        assert!(
            stale > 0,
            "some duplicates arrive after a newer version of their edge"
        );
        let total: i64 = g.truth.values().sum();
        let liked = latest.len() as i64; // every edge liked once, some unliked since
        assert!(total > 0 && total < liked, "{total} of {liked}");
    }
}
