//! One definition per record of likes.events and likes.deltas: how it is built, keyed and
//! read (the dead letter is kafka/dlq.rs's). The API, stage 1, the tools and the tests all build a LikeEvent here, so its key
//! and its bucket (from the topology's bucket count, never a literal) cannot drift apart.

use prost::Message as _;

use crate::hash;
use crate::schema::v1::{
    self, delta_record, ClientPlatform, Delta, DeltaRecord, EdgeState, LikeEvent, Source, Tick,
};

/// How many flip times before the previous one an event carries and the edge row keeps
/// (`earlier_event_times_ms`, `edges.earlier_at`): with the previous flip's, 16 in all.
pub const EARLIER_FLIPS: usize = 15;

/// The longest item or user id a record may carry, in bytes (the stages dead-letter longer
/// ones; the API accepts 128).
pub const MAX_ID_BYTES: usize = 256;

/// A flip of the edge (item, user) to liked or unliked: what a LikeEvent says.
#[derive(Debug, Clone, Copy)]
pub struct Flip<'a> {
    pub item: &'a str,
    pub user: &'a str,
    /// The edge's version: 1 for its first flip, one more for each later one.
    pub op_id: u64,
    pub liked: bool,
    /// When the flip happened (the edge's `updated_at`).
    pub event_time_ms: i64,
    /// When the flip before it happened (0 for the first).
    pub prev_event_time_ms: i64,
    /// When the flips before that one happened, newest first (at most [`EARLIER_FLIPS`]).
    pub earlier_event_times_ms: &'a [i64],
    pub source: Source,
    /// The client the flip's request came from (analytics only).
    pub platform: ClientPlatform,
}

impl Flip<'_> {
    /// The event, its user's bucket taken among `buckets` (the topology's bucket count).
    pub fn event(&self, buckets: u32) -> LikeEvent {
        LikeEvent {
            item_id: self.item.to_string(),
            user_id: self.user.to_string(),
            bucket: hash::bucket_of(self.user, buckets),
            op_id: self.op_id,
            state: if self.liked {
                EdgeState::Liked
            } else {
                EdgeState::Unliked
            } as i32,
            event_time_ms: self.event_time_ms,
            epoch: 0,
            source: self.source as i32,
            prev_event_time_ms: self.prev_event_time_ms,
            earlier_event_times_ms: self.earlier_event_times_ms
                [..self.earlier_event_times_ms.len().min(EARLIER_FLIPS)]
                .to_vec(),
            client_platform: self.platform as i32,
            home_since_ms: 0,
        }
    }

    /// The record for the events topic of a flip written by the item's home region (with
    /// home regions): the range's epoch and when it came home travel with the event.
    pub fn record_at_home(&self, buckets: u32, home: Home) -> (String, Vec<u8>) {
        let mut event = self.event(buckets);
        event.epoch = home.epoch.max(0) as u64;
        event.home_since_ms = home.since_ms;
        (
            hash::event_key(self.item, event.bucket),
            event.encode_to_vec(),
        )
    }

    /// The record for the events topic: key `item#bucket` and the encoded event.
    pub fn record(&self, buckets: u32) -> (String, Vec<u8>) {
        let event = self.event(buckets);
        (
            hash::event_key(self.item, event.bucket),
            event.encode_to_vec(),
        )
    }
}

/// The range an item's flip was written under, as the writing region saw it: its epoch and
/// when it last came home there (`ranges.home_since`). Both 0 without home regions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Home {
    pub epoch: i64,
    pub since_ms: i64,
}

/// How many flips a delta record combines, and their mean event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weight {
    pub events: u64,
    pub mean_event_time_ms: i64,
}

impl Weight {
    /// One flip at `at_ms` (a correction, a test record).
    pub fn one(at_ms: i64) -> Weight {
        Weight {
            events: 1,
            mean_event_time_ms: at_ms,
        }
    }
}

/// A reconcile correction, as stage 2 applies it: through the window fence like any delta
/// of its window, and through the correction fence (`cut_ms` follows `after_ms`, see
/// sink.rs), so a correction sent twice or overtaken by a newer recount is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Correction {
    pub id: String,
    pub delta: i64,
    pub cut_ms: i64,
    pub after_ms: i64,
}

/// The `likes.deltas` value of stage 1's sum for one item and second.
pub fn delta_value(item: &str, delta: i64, event_time_ms: i64, weight: Weight) -> Vec<u8> {
    DeltaRecord {
        record: Some(delta_record::Record::Delta(Delta {
            item_id: item.to_string(),
            delta,
            event_time_ms,
            events: weight.events.min(u64::from(u32::MAX)) as u32,
            mean_event_time_ms: weight.mean_event_time_ms,
        })),
    }
    .encode_to_vec()
}

/// The `likes.deltas` value of a tick: stage 1's log clock moving on every partition.
pub fn tick_value(produced_at_ms: i64) -> Vec<u8> {
    DeltaRecord {
        record: Some(delta_record::Record::Tick(Tick { produced_at_ms })),
    }
    .encode_to_vec()
}

/// The `likes.deltas` value of a reconcile correction of `item`.
pub fn correction_value(item: &str, c: &Correction, reason: &str) -> Vec<u8> {
    DeltaRecord {
        record: Some(delta_record::Record::Correction(v1::Correction {
            item_id: item.to_string(),
            delta: c.delta,
            correction_id: c.id.clone(),
            reason: reason.to_string(),
            snapshot_time_ms: c.cut_ms,
            after_snapshot_time_ms: c.after_ms,
        })),
    }
    .encode_to_vec()
}

/// The most a single record may move a count: stage 1 emits at most one per event of a
/// batch, and a correction at most an item's likes. Beyond it a record is corrupt or hostile,
/// and summing it could overflow a window's total.
pub const MAX_ABS_DELTA: i64 = 1 << 40;

/// One record of `likes.deltas`, decoded and validated (stage 2 applies it; the operations
/// jobs read it to tell what a counter row has applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaInput {
    Delta {
        item: String,
        delta: i64,
        event_time_ms: i64,
        /// The flips combined and their mean event time (staleness per event).
        weight: Weight,
    },
    Correction {
        item: String,
        reason: String,
        correction: Correction,
    },
    Tick,
}

/// Decodes a `likes.events` value (or a dead letter's copy of one). Stage 1 then checks it
/// against the topology (dedupe/event.rs); the recount queue only reads its item and time.
pub fn decode_event(payload: Option<&[u8]>) -> std::result::Result<LikeEvent, String> {
    let v = payload.ok_or_else(|| "record has no value".to_string())?;
    LikeEvent::decode(v).map_err(|e| format!("undecodable LikeEvent: {e}"))
}

/// Decodes a `likes.deltas` value; a reason when it is not one stage 2 may apply (a dead
/// letter).
pub fn decode_deltas(payload: Option<&[u8]>) -> std::result::Result<DeltaInput, String> {
    let v = payload.ok_or_else(|| "record has no value".to_string())?;
    let r = DeltaRecord::decode(v).map_err(|e| format!("undecodable DeltaRecord: {e}"))?;
    let check = |item: &str, delta: i64| -> std::result::Result<(), String> {
        if item.is_empty() || item.len() > MAX_ID_BYTES {
            return Err(format!("item_id must be 1-{} bytes", MAX_ID_BYTES));
        }
        if delta.unsigned_abs() > MAX_ABS_DELTA as u64 {
            return Err(format!("delta {delta} is beyond ±{MAX_ABS_DELTA}"));
        }
        Ok(())
    };
    match r.record {
        Some(delta_record::Record::Delta(d)) => {
            check(&d.item_id, d.delta)?;
            Ok(DeltaInput::Delta {
                weight: Weight {
                    events: u64::from(d.events.max(1)),
                    mean_event_time_ms: if d.mean_event_time_ms == 0 {
                        d.event_time_ms
                    } else {
                        d.mean_event_time_ms
                    },
                },
                item: d.item_id,
                delta: d.delta,
                event_time_ms: d.event_time_ms,
            })
        }
        Some(delta_record::Record::Correction(c)) => {
            check(&c.item_id, c.delta)?;
            Ok(DeltaInput::Correction {
                item: c.item_id,
                reason: c.reason,
                correction: Correction {
                    id: c.correction_id,
                    delta: c.delta,
                    cut_ms: c.snapshot_time_ms,
                    after_ms: c.after_snapshot_time_ms,
                },
            })
        }
        Some(delta_record::Record::Tick(_)) => Ok(DeltaInput::Tick),
        None => Err("DeltaRecord holds no record".into()),
    }
}

/// The answer a CQL conditional write (LWT) gives: `Some(true)` when the `[applied]` column
/// says it applied, `Some(false)` when it did not, `None` when the result has no such column.
pub fn lwt_applied(names: &[String], row: &[Option<scylla::value::CqlValue>]) -> Option<bool> {
    let i = names.iter().position(|n| n == "[applied]")?;
    Some(matches!(
        row.get(i),
        Some(Some(scylla::value::CqlValue::Boolean(true)))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_item_and_the_users_bucket() {
        let flip = Flip {
            item: "item-1",
            user: "u-7",
            op_id: 2,
            liked: false,
            event_time_ms: 2_000,
            prev_event_time_ms: 1_000,
            earlier_event_times_ms: &[],
            source: Source::Api,
            platform: ClientPlatform::Web,
        };
        let (key, payload) = flip.record(64);
        let event = LikeEvent::decode(payload.as_slice()).unwrap();
        assert_eq!(event.bucket, hash::bucket_of("u-7", 64));
        assert_eq!(key, hash::event_key("item-1", event.bucket));
        assert_eq!(event.state, EdgeState::Unliked as i32);
        assert_eq!((event.op_id, event.prev_event_time_ms), (2, 1_000));
        assert_eq!(event.client_platform, ClientPlatform::Web as i32);
        assert!(
            flip.event(8).bucket < 8,
            "the bucket is taken among the count given"
        );
    }

    #[test]
    fn a_delta_beyond_the_bound_is_refused_not_summed() {
        let rec = |delta| delta_value("i", delta, 1, Weight::one(1));
        assert!(decode_deltas(Some(&rec(i64::MAX))).is_err());
        assert!(decode_deltas(Some(&rec(-MAX_ABS_DELTA - 1))).is_err());
        assert!(decode_deltas(Some(&rec(3))).is_ok());
        assert!(decode_deltas(None).is_err());
    }

    #[test]
    fn a_delta_from_a_writer_without_the_mean_weighs_one_flip_at_its_earliest_time() {
        let old = DeltaRecord {
            record: Some(delta_record::Record::Delta(Delta {
                item_id: "i".into(),
                delta: 2,
                event_time_ms: 1_000,
                events: 0,
                mean_event_time_ms: 0,
            })),
        }
        .encode_to_vec();
        match decode_deltas(Some(&old)) {
            Ok(DeltaInput::Delta { weight, .. }) => assert_eq!(weight, Weight::one(1_000)),
            _ => panic!("a delta"),
        }
    }

    #[test]
    fn a_correction_round_trips() {
        let c = Correction {
            id: "c1".into(),
            delta: -2,
            cut_ms: 5_000,
            after_ms: 4_000,
        };
        match decode_deltas(Some(&correction_value("i", &c, "drift"))) {
            Ok(DeltaInput::Correction {
                item,
                reason,
                correction,
            }) => assert_eq!(
                (item.as_str(), reason.as_str(), correction),
                ("i", "drift", c)
            ),
            other => panic!("a correction: {other:?}"),
        }
        assert_eq!(decode_deltas(Some(&tick_value(9))), Ok(DeltaInput::Tick));
    }
}
