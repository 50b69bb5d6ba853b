//! Validating one `likes.events` record (decoded by `records::decode_event`). Anything that fails here goes to the
//! dead-letter topic with the reason; it never stops the stage and never vanishes.

use super::rule::Flip;
use crate::hash;
use crate::records::{EARLIER_FLIPS, MAX_ID_BYTES};
use crate::schema::v1::{ClientPlatform, EdgeState, LikeEvent};

/// A LikeEvent that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidEvent {
    pub event: LikeEvent,
    pub flip: Flip,
}

/// The metric label of each client platform, by [`ValidEvent::platform_index`].
pub const PLATFORM_LABELS: [&str; 5] = ["unspecified", "web", "ios", "android", "other"];

impl ValidEvent {
    /// The client platform's index in [`PLATFORM_LABELS`] (0, `unspecified`, for a value
    /// this version does not know, as from a newer writer).
    pub fn platform_index(&self) -> usize {
        match ClientPlatform::try_from(self.event.client_platform) {
            Ok(ClientPlatform::Web) => 1,
            Ok(ClientPlatform::Ios) => 2,
            Ok(ClientPlatform::Android) => 3,
            Ok(ClientPlatform::Other) => 4,
            _ => 0,
        }
    }
}

/// Decodes and validates a record's key and value against the topology's bucket count.
pub fn parse(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    buckets: u32,
) -> Result<ValidEvent, String> {
    let event = crate::records::decode_event(payload)?;
    for (name, id) in [("item_id", &event.item_id), ("user_id", &event.user_id)] {
        if id.is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
            return Err(format!(
                "{name} must be 1-{MAX_ID_BYTES} bytes without control characters"
            ));
        }
    }
    if event.op_id == 0 {
        return Err("op_id must be at least 1".into());
    }
    let liked = match EdgeState::try_from(event.state) {
        Ok(EdgeState::Liked) => true,
        Ok(EdgeState::Unliked) => false,
        _ => {
            return Err(format!(
                "state {} is neither LIKED nor UNLIKED",
                event.state
            ))
        }
    };
    // Flips alternate from "never liked": odd ops like, even ops unlike. Anything else is a
    // producer bug that would corrupt the count, so it is rejected, not guessed at.
    if liked != (event.op_id % 2 == 1) {
        return Err(format!(
            "state {} contradicts op_id {} (odd op_ids are likes, even ones unlikes)",
            if liked { "LIKED" } else { "UNLIKED" },
            event.op_id
        ));
    }
    let bucket = hash::bucket_of(&event.user_id, buckets);
    if event.bucket != bucket {
        return Err(format!(
            "bucket {} is not hash(user_id) % {buckets} = {bucket}",
            event.bucket
        ));
    }
    let expected_key = hash::event_key(&event.item_id, bucket);
    if key != Some(expected_key.as_bytes()) {
        return Err(format!("record key is not {expected_key:?} (item#bucket)"));
    }
    // A newer writer may carry more earlier times than this version reads: the newest
    // EARLIER_FLIPS are the ones that matter.
    let mut earlier = [0; EARLIER_FLIPS];
    for (slot, &t) in earlier.iter_mut().zip(&event.earlier_event_times_ms) {
        *slot = t;
    }
    let flip = Flip {
        op_id: event.op_id,
        liked,
        event_time_ms: event.event_time_ms,
        prev_event_time_ms: event.prev_event_time_ms,
        earlier_event_times_ms: earlier,
        home_since_ms: event.home_since_ms,
    };
    Ok(ValidEvent { event, flip })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn event(op_id: u64, state: EdgeState) -> LikeEvent {
        LikeEvent {
            item_id: "item-1".into(),
            user_id: "user-7".into(),
            op_id,
            state: state as i32,
            event_time_ms: 1,
            epoch: 0,
            bucket: hash::bucket_of("user-7", 64),
            source: 0,
            prev_event_time_ms: 0,
            earlier_event_times_ms: vec![],
            client_platform: 0,
            home_since_ms: 0,
        }
    }

    fn key(e: &LikeEvent) -> Vec<u8> {
        hash::event_key(&e.item_id, e.bucket).into_bytes()
    }

    #[test]
    fn a_good_event_parses() {
        let e = event(1, EdgeState::Liked);
        let v = parse(Some(&key(&e)), Some(&e.encode_to_vec()), 64).unwrap();
        assert!(v.flip.liked);
        assert_eq!(v.event, e);
    }

    #[test]
    fn every_bad_input_class_has_a_reason() {
        let good = event(2, EdgeState::Unliked);
        let k = key(&good);
        type Case = (Option<Vec<u8>>, Option<Vec<u8>>, &'static str);
        let cases: Vec<Case> = vec![
            (Some(k.clone()), None, "no value"),
            (Some(k.clone()), Some(vec![0xff, 0xff, 0xff]), "undecodable"),
            (
                Some(k.clone()),
                Some(event(0, EdgeState::Liked).encode_to_vec()),
                "op_id",
            ),
            (
                Some(k.clone()),
                Some(event(2, EdgeState::Liked).encode_to_vec()),
                "contradicts",
            ),
            (
                Some(k.clone()),
                Some(event(1, EdgeState::Unspecified).encode_to_vec()),
                "neither",
            ),
            (
                Some(b"item-1#0".to_vec()),
                Some(good.encode_to_vec()),
                "record key",
            ),
            (None, Some(good.encode_to_vec()), "record key"),
            (
                Some(k.clone()),
                Some(
                    LikeEvent {
                        bucket: 99,
                        ..good.clone()
                    }
                    .encode_to_vec(),
                ),
                "bucket",
            ),
            (
                Some(k.clone()),
                Some(
                    LikeEvent {
                        user_id: String::new(),
                        ..good.clone()
                    }
                    .encode_to_vec(),
                ),
                "user_id",
            ),
        ];
        for (key, value, needle) in cases {
            let err = parse(key.as_deref(), value.as_deref(), 64).unwrap_err();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}
