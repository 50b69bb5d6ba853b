//! Stage 1's decoder: any key and value on `likes.events` is either a valid event or a reason
//! (a dead letter), never a panic; a valid event's bucket and key agree with its ids.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: how much of the rest is the key.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (key, value) = rest.split_at((n as usize).min(rest.len()));
    if let Ok(v) = likes::dedupe::event::parse(Some(key), Some(value), 16) {
        assert!(v.event.op_id >= 1);
        assert_eq!(
            key,
            likes::hash::event_key(&v.event.item_id, v.event.bucket).as_bytes()
        );
    }
    let _ = likes::dedupe::event::parse(None, Some(value), 16);
    let _ = likes::dedupe::event::parse(Some(key), None, 16);
});
