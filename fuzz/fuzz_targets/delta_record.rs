//! Stage 2's decoder and windows: any value on `likes.deltas`, at any log time, is a record
//! the windows take or a reason (a dead letter), never a panic or an overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First 8 bytes: the record's log-append time; the rest: its value.
    if data.len() < 8 {
        return;
    }
    let (ts, value) = data.split_at(8);
    let ts = i64::from_le_bytes(ts.try_into().unwrap());
    let mut windows = likes::count::window::Windows::new(1000);
    windows.assign(0, None);
    for (offset, at) in [(0, ts), (1, ts), (2, ts.saturating_add(5000))] {
        match likes::records::decode_deltas(Some(value)) {
            Ok(likes::records::DeltaInput::Delta {
                item,
                delta,
                event_time_ms,
                weight,
            }) => windows.observe(0, offset, at, Some((&item, delta, event_time_ms, weight))),
            Ok(likes::records::DeltaInput::Correction {
                item, correction, ..
            }) => windows.observe_correction(0, offset, at, &item, correction),
            Ok(likes::records::DeltaInput::Tick) => windows.observe(0, offset, at, None),
            Err(_) => {}
        }
    }
    for w in windows.take_closed() {
        for d in w.items.values() {
            let _ = d.mean_event_time_ms();
        }
    }
    let _ = windows.resume_points();
});
