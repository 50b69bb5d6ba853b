//! The clock seam: a test build moves the process's wall clock forward, and every reader of
//! `runtime::clock` (stage 1's horizon, windows, TTLs, asOf) sees it. Its own test binary:
//! the skew is process-wide and must not leak into other tests.

#![cfg(feature = "failpoints")]

use std::time::Duration;

use likes::runtime::clock::{advance, now_ms};

#[test]
fn advance_moves_every_reader_of_the_clock_forward() {
    let before = now_ms();
    advance(Duration::from_secs(3600));
    let after = now_ms();
    assert!(after - before >= 3_600_000, "{before} -> {after}");
    // Stage 1's rule reads the same clock: an event stamped before the jump is now past a
    // 30-minute horizon, with no test waiting for it.
    assert!(likes::dedupe::rule::expired(before, now_ms(), 30 * 60_000));
}
