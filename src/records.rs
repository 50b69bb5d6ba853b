//! One definition per record the pipeline carries between processes: how it is built, keyed
//! and read. The API, stage 1, the tools and the tests all build a LikeEvent here, so its key
//! and its bucket (from the topology's bucket count, never a literal) cannot drift apart.

use prost::Message as _;

use crate::hash;
use crate::schema::v1::{ClientPlatform, EdgeState, LikeEvent, Source};

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
        }
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
}
