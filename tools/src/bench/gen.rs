//! The topology benchmark's input: a zipf mix of items plus one viral item, new likes and
//! unlikes of earlier ones, with the ground truth kept alongside.

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

/// Generates events and keeps the ground truth.
pub(crate) struct Generator {
    pub(crate) rng: StdRng,
    pub(crate) zipf: Zipf,
    pub(crate) viral_share: f64,
    pub(crate) next_user: u64,
    pub(crate) liked: Vec<(u32, u64)>,
    pub(crate) truth: HashMap<String, i64>,
    /// The topology's bucket count.
    pub(crate) buckets: u32,
}

const VIRAL: u32 = u32::MAX;

impl Generator {
    fn item_name(i: u32) -> String {
        if i == VIRAL {
            "item-viral".into()
        } else {
            format!("item-{i}")
        }
    }

    pub(crate) fn next(&mut self, now_ms: i64) -> (String, Vec<u8>) {
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
            source: Source::Test,
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
}
