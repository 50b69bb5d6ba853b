//! The API's decoders of request bytes: the write body, the batchGet body, the who-liked
//! cursor and the Idempotency-Key header. Each accepts or refuses (a 4xx), never panics; what
//! it accepts round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = likes::api::write::empty_body(data);
    let _ = serde_json::from_slice::<likes::api::read::BatchGet>(data);
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some((bucket, after)) = likes::api::read::decode_cursor(s, 16) {
            assert!((0..16).contains(&bucket));
            assert_eq!(
                likes::api::read::decode_cursor(
                    &likes::api::read::encode_cursor(bucket, &after),
                    16
                ),
                Some((bucket, after))
            );
        }
    }
    if let Ok(v) = http::HeaderValue::from_bytes(data) {
        let mut h = http::HeaderMap::new();
        h.insert("idempotency-key", v);
        if let Ok(k) = likes::api::write::request_key(&h) {
            assert!((1..=128).contains(&k.len()));
        }
    }
});
