//! The dead-letter record: what a stage writes for input it cannot use, instead of stopping
//! or dropping it.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use sha2::Digest as _;

/// The most of a record's key and value a dead letter carries verbatim. A record the broker
/// took can still be too large to send again with headers added (the producer's
/// `message.max.bytes` counts uncompressed bytes); such a dead letter would fail, the stage
/// would stop, restart, read it again, forever.
pub const DLQ_MAX_ORIGINAL_BYTES: usize = 256 * 1024;

/// What a dead letter keeps of an oversized original: its first bytes, to look at.
pub const DLQ_PREFIX_BYTES: usize = 1024;

/// A record for `likes.dlq`: the original key and value untouched, the reason, its kind
/// (`likes.kind`: one of `runtime::metrics::DLQ_KINDS`, so the recount queue tells a writer's
/// bad record from a flip to recount) and the source position in headers (`likes.error`,
/// `likes.source.topic|partition|offset`).
/// When key and value together exceed [`DLQ_MAX_ORIGINAL_BYTES`], only the first
/// [`DLQ_PREFIX_BYTES`] of each are kept, with each one's size and SHA-256 in headers
/// (`likes.payload.bytes|sha256`, `likes.key.bytes|sha256`), so a dead letter always fits.
pub fn dead_letter<'a>(
    dlq_topic: &'a str,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
    reason: &str,
    kind: &str,
    source: (&str, i32, i64),
) -> BaseRecord<'a, [u8], [u8]> {
    let (topic, partition, offset) = source;
    let size = key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len);
    let oversized = size > DLQ_MAX_ORIGINAL_BYTES;
    let mut headers = OwnedHeaders::new();
    let (mut key, mut payload) = (key, payload);
    if oversized {
        for (name, part) in [("key", &mut key), ("payload", &mut payload)] {
            if let Some(bytes) = *part {
                let digest: String = sha2::Sha256::digest(bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                headers = headers
                    .insert(Header {
                        key: &format!("likes.{name}.bytes"),
                        value: Some(&bytes.len().to_string()),
                    })
                    .insert(Header {
                        key: &format!("likes.{name}.sha256"),
                        value: Some(&digest),
                    });
                *part = Some(&bytes[..bytes.len().min(DLQ_PREFIX_BYTES)]);
            }
        }
    }
    let headers = headers
        .insert(Header {
            key: "likes.error",
            value: Some(reason),
        })
        .insert(Header {
            key: "likes.kind",
            value: Some(kind),
        })
        .insert(Header {
            key: "likes.source.topic",
            value: Some(topic),
        })
        .insert(Header {
            key: "likes.source.partition",
            value: Some(&partition.to_string()),
        })
        .insert(Header {
            key: "likes.source.offset",
            value: Some(&offset.to_string()),
        });
    let mut r = BaseRecord::to(dlq_topic).headers(headers);
    if let Some(k) = key {
        r = r.key(k);
    }
    if let Some(v) = payload {
        r = r.payload(v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;

    #[test]
    fn an_oversized_dead_letter_keeps_a_prefix_its_size_and_hash() {
        let big = vec![7u8; DLQ_MAX_ORIGINAL_BYTES + 1];
        let r = dead_letter("dlq", Some(b"k"), Some(&big), "why", "invalid", ("t", 1, 2));
        assert_eq!(r.payload.map(<[u8]>::len), Some(DLQ_PREFIX_BYTES));
        let h = r.headers.as_ref().unwrap();
        let get = |k: &str| {
            h.iter()
                .find(|x| x.key == k)
                .map(|x| String::from_utf8_lossy(x.value.unwrap()).into_owned())
        };
        assert_eq!(get("likes.payload.bytes"), Some(big.len().to_string()));
        assert_eq!(get("likes.payload.sha256").map(|d| d.len()), Some(64));
        assert_eq!(get("likes.error").as_deref(), Some("why"));
        assert_eq!(get("likes.kind").as_deref(), Some("invalid"));
        let small = dead_letter("dlq", None, Some(b"abc"), "why", "invalid", ("t", 1, 2));
        assert_eq!(small.payload, Some(&b"abc"[..]));
    }
}
