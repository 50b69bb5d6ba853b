//! The wall clock every part reads (event times, TTLs, windows' close, asOf), in one place so
//! that tests can move it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Added to the system clock; only tests move it (see [`advance`]).
static SKEW_MS: AtomicI64 = AtomicI64::new(0);

/// Wall clock, Unix ms.
pub fn now_ms() -> i64 {
    let system = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    system + SKEW_MS.load(Ordering::Relaxed)
}

/// Moves this process's clock forward by `by` (a horizon or a TTL passes at once). Test
/// builds only: the product never bends its own clock.
#[cfg(any(test, feature = "failpoints"))]
pub fn advance(by: std::time::Duration) {
    SKEW_MS.fetch_add(by.as_millis() as i64, Ordering::Relaxed);
}
