//! How long a write waits for its event's ack: the whole `api.publish_wait` while the broker
//! is trusted, [`SHORT_WAIT`] once it is suspect (docs/design.md, "Publishing without losing
//! an event").
//!
//! A publish that waits the whole wait in vain makes the broker suspect. It is trusted again
//! only when a probe makes it: [`SUSPECT_FOR`] after the last miss, one write at a time waits
//! the whole wait while the others keep the short one. Not at the first ack, as before: a
//! broker just back acks some events at once and others after seconds (leaders moving, the
//! outage's abandoned sends flushing), and every write then waited the whole wait (`bench
//! overload`'s broker outage, 2026-12-02: 78 % answered in the 15 s after the broker's
//! return). Not by letting the window run out either: then every write of the probe's second
//! waited it (p99 1 s after the return in the first `make bench` with it).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// The wait while the broker is suspect: a healthy broker acknowledges in a few ms.
pub const SHORT_WAIT: Duration = Duration::from_millis(50);
/// How long after a miss the broker is not probed.
pub const SUSPECT_FOR: Duration = Duration::from_secs(5);

/// The broker's standing, shared by a process's writes.
pub struct Suspicion {
    /// Monotonic: a wall clock stepped back would hold the suspicion.
    started: Instant,
    /// The last miss, ms after `started`; `i64::MIN`: trusted.
    last_miss_ms: AtomicI64,
    probing: AtomicBool,
}

/// One publish's wait; [`Ticket::ended`] says how it went. A probe dropped unended (its
/// write cancelled) lets the next write probe.
pub struct Ticket<'a> {
    suspicion: &'a Suspicion,
    pub wait: Duration,
    probe: bool,
    full: bool,
}

impl Default for Suspicion {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            last_miss_ms: AtomicI64::new(i64::MIN),
            probing: AtomicBool::new(false),
        }
    }
}

impl Suspicion {
    fn now_ms(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
    }

    /// The wait for the next publish, out of `full` (`api.publish_wait`).
    pub fn ticket(&self, full: Duration) -> Ticket<'_> {
        let last = self.last_miss_ms.load(Ordering::Relaxed);
        let (probe, whole) = if last == i64::MIN {
            (false, true)
        } else if self.now_ms().saturating_sub(last) < SUSPECT_FOR.as_millis() as i64 {
            (false, false)
        } else {
            let probe = self
                .probing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            (probe, probe)
        };
        Ticket {
            suspicion: self,
            wait: if whole { full } else { full.min(SHORT_WAIT) },
            probe,
            full: whole,
        }
    }

    /// Whether the broker is trusted with the whole wait.
    pub fn trusted(&self) -> bool {
        self.last_miss_ms.load(Ordering::Relaxed) == i64::MIN
    }
}

impl Ticket<'_> {
    /// The publish was acknowledged (`acked`), or not within the wait, or failed with the
    /// broker away (`broker_error`).
    pub fn ended(self, acked: bool, broker_error: bool) {
        let s = self.suspicion;
        if acked {
            if self.probe {
                s.last_miss_ms.store(i64::MIN, Ordering::Relaxed);
            }
        } else if self.full || broker_error {
            s.last_miss_ms.fetch_max(s.now_ms(), Ordering::Relaxed);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.suspicion.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: Duration = Duration::from_secs(1);

    fn miss_long_ago(s: &Suspicion) {
        s.last_miss_ms.store(
            s.now_ms() - SUSPECT_FOR.as_millis() as i64 - 1,
            Ordering::Relaxed,
        );
    }

    #[test]
    fn a_missed_whole_wait_makes_the_broker_suspect_and_a_short_miss_does_not_extend_it() {
        let s = Suspicion::default();
        let t = s.ticket(FULL);
        assert_eq!(t.wait, FULL);
        t.ended(false, false);
        assert!(!s.trusted());
        let before = s.last_miss_ms.load(Ordering::Relaxed);
        let t = s.ticket(FULL);
        assert_eq!(t.wait, SHORT_WAIT);
        std::thread::sleep(Duration::from_millis(5));
        t.ended(false, false);
        assert_eq!(s.last_miss_ms.load(Ordering::Relaxed), before);
        // An ack of a short wait proves little: still suspect until a probe makes it.
        s.ticket(FULL).ended(true, false);
        assert!(!s.trusted());
    }

    #[test]
    fn after_the_window_one_write_probes_and_its_ack_restores_trust() {
        let s = Suspicion::default();
        s.ticket(FULL).ended(false, false);
        miss_long_ago(&s);
        let probe = s.ticket(FULL);
        assert_eq!(probe.wait, FULL);
        // Meanwhile the others keep the short wait.
        assert_eq!(s.ticket(FULL).wait, SHORT_WAIT);
        probe.ended(true, false);
        assert!(s.trusted());
        assert_eq!(s.ticket(FULL).wait, FULL);
    }

    #[test]
    fn a_failed_or_dropped_probe_leaves_the_broker_suspect_and_lets_another_probe_later() {
        let s = Suspicion::default();
        s.ticket(FULL).ended(false, false);
        miss_long_ago(&s);
        s.ticket(FULL).ended(false, false);
        assert_eq!(s.ticket(FULL).wait, SHORT_WAIT, "a new window began");
        miss_long_ago(&s);
        drop(s.ticket(FULL));
        assert_eq!(s.ticket(FULL).wait, FULL, "a dropped probe frees the next");
    }
}
