//! The one stable hash of the project: Kafka's murmur2, as the Java client computes it.
//!
//! It decides an edge's bucket (`hash(user_id) % B`) and a key's partition. Both must be the
//! same in every process, every release and every language, so this is never Rust's randomly
//! seeded std hasher. Using the Java client's function also means a tool written against the
//! Java client lands a key on the same partition as we do.

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), seed 0x9747b28c.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// `Utils.toPositive`: clears the sign bit (not `abs`, which overflows on `i32::MIN`).
fn to_positive(h: i32) -> u32 {
    (h & 0x7fff_ffff) as u32
}

/// The partition the Java client's default partitioner (and librdkafka's `murmur2_random`)
/// picks for a non-empty key.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    to_positive(murmur2(key)) % partitions
}

/// The bucket of an edge: spreads one item's edges over `buckets` CQL partitions and Kafka
/// keys, deterministically by user, so an edge always lands in the same bucket.
pub fn bucket_of(user_id: &str, buckets: u32) -> u32 {
    to_positive(murmur2(user_id.as_bytes())) % buckets
}

/// The key of a LikeEvent on `likes.events`: `item#bucket`.
pub fn event_key(item_id: &str, bucket: u32) -> String {
    format!("{item_id}#{bucket}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by `org.apache.kafka.common.utils.Utils.murmur2` (kafka-clients 4.1.1),
    /// with the bucket for B = 64.
    #[test]
    fn matches_the_java_client() {
        let cases: &[(&str, i32, u32)] = &[
            ("21", -973_932_308, 44),
            ("foobar", -790_332_482, 62),
            ("a-little-bit-long-string", -985_981_536, 32),
            ("abc", 479_470_107, 27),
            ("item-42", 464_612_118, 22),
            ("user-7", 696_778_364, 60),
        ];
        for &(input, hash, bucket) in cases {
            assert_eq!(murmur2(input.as_bytes()), hash, "murmur2({input})");
            assert_eq!(bucket_of(input, 64), bucket, "bucket_of({input})");
        }
    }

    #[test]
    fn partition_is_in_range_and_stable() {
        for i in 0..1000 {
            let key = event_key(&format!("item-{i}"), i % 64);
            let p = partition_for(key.as_bytes(), 16);
            assert!(p < 16);
            assert_eq!(p, partition_for(key.as_bytes(), 16));
        }
    }

    #[test]
    fn event_key_format() {
        assert_eq!(event_key("item-1", 7), "item-1#7");
    }
}
