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
    #[cfg(feature = "failpoints")]
    skew_from_env();
    system + SKEW_MS.load(Ordering::Relaxed)
}

/// Test builds: `LIKES_TEST_CLOCK_SKEW_MS` sets this process's clock off by that much from
/// its start, as a pod whose clock is off (`likes-tools chaos` runs one API so).
#[cfg(feature = "failpoints")]
fn skew_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(ms) = std::env::var("LIKES_TEST_CLOCK_SKEW_MS")
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
        {
            SKEW_MS.fetch_add(ms, Ordering::Relaxed);
        }
    });
}

/// Moves this process's clock forward by `by` (a horizon or a TTL passes at once). Test
/// builds only: the product never bends its own clock.
#[cfg(any(test, feature = "failpoints"))]
pub fn advance(by: std::time::Duration) {
    SKEW_MS.fetch_add(by.as_millis() as i64, Ordering::Relaxed);
}

/// Moves this process's clock forward by `by` until the returned guard is dropped, which moves
/// it back: a test binary whose next test connects to Cassandra (whose start check refuses a
/// clock 30 s off) must get its clock back whether this test passes or fails. Test builds only.
#[cfg(any(test, feature = "failpoints"))]
#[must_use = "the clock goes back when the guard is dropped"]
pub fn advance_for_now(by: std::time::Duration) -> Advanced {
    advance(by);
    Advanced(by)
}

/// See [`advance_for_now`].
#[cfg(any(test, feature = "failpoints"))]
pub struct Advanced(std::time::Duration);

#[cfg(any(test, feature = "failpoints"))]
impl Drop for Advanced {
    fn drop(&mut self) {
        SKEW_MS.fetch_sub(self.0.as_millis() as i64, Ordering::Relaxed);
    }
}
