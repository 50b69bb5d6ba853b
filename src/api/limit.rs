//! The adaptive bound on writes in flight (docs/architecture.md, the write path).
//!
//! A fixed bound cannot know how many writes the database takes this second: set high, the
//! writes it admits queue behind each other (256 in flight at the ~1,100/s issue 26 measured
//! at 3,000/s offered is ~230 ms each, past the 150 ms SLO); set low, it sheds load the database could serve. This bound moves with
//! the latency of the writes it admitted, in the family of TCP Vegas and Netflix's gradient
//! limiters: every window (200 ms with at least 50 writes, or 1 s), the window's p99 is
//! compared with `api.write_latency_target`. The p99, not a lower quantile: the SLO is on the
//! p99, and a p95 target let the p99 run 30-90% past it under 4x overload (`bench overload`).
//!
//! - Over the target, with at least half the limit in flight at some point of the window:
//!   the limit shrinks in proportion (limit × target / p99, at most halved): the queue the
//!   writes waited in is what shrinks. A slow write at light load (a pause, a contended row)
//!   says nothing about the limit, and must not ratchet it down window after window.
//! - Under it, and the limit was reached in the window (a write was refused, or the writes in
//!   flight touched it): the limit grows by its square root (fast from a low limit, a few
//!   percent from a high one).
//! - Otherwise nothing moves; an idle API keeps the limit it learned.
//!
//! A write past the limit is refused at once (503 + Retry-After), never queued: a client's
//! retry finds a limit that has had time to move, and the writes admitted stay inside the
//! SLO whatever the offered load.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::runtime::metrics as m;

/// The shortest window the limit moves on, if it holds [`MIN_SAMPLES`] writes.
const WINDOW: Duration = Duration::from_millis(200);
/// Writes a window needs for its p99 to mean something, unless it has lasted [`MAX_WINDOW`].
const MIN_SAMPLES: usize = 50;
const MAX_WINDOW: Duration = Duration::from_secs(1);
/// The limit never goes under this: a database slow even for one write at a time still gets
/// writes (and the limit, latencies to move by); past the target it is slow, not down.
pub const MIN_LIMIT: f64 = 4.0;

/// The bound on writes in flight.
pub struct Limit {
    in_flight: AtomicUsize,
    /// The limit now, rounded: read on every admission without the lock.
    now: AtomicUsize,
    /// Whether the limit was reached since the window began.
    reached: AtomicBool,
    /// The most writes in flight at once since the window began.
    peak: AtomicUsize,
    /// `None`: the limit stays at `max` (`api.write_latency_target = 0`).
    target: Option<Duration>,
    max: f64,
    window: Mutex<Window>,
}

struct Window {
    limit: f64,
    began: Instant,
    samples: Vec<Duration>,
}

/// An admitted write; its drop ends it and gives the limit its latency.
pub struct Permit {
    limit: Arc<Limit>,
    started: Instant,
    learn: bool,
}

impl Permit {
    /// Ends the write's place in flight without teaching the limit its latency: a write
    /// forwarded to another region measures that region, not this one's database.
    pub fn forget(mut self) {
        self.learn = false;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.learn {
            self.limit.in_flight.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let latency = self.started.elapsed();
        metrics::histogram!(m::API_ADMITTED_WRITE_SECONDS).record(latency.as_secs_f64());
        self.limit.release(latency, Instant::now());
    }
}

impl Limit {
    /// At most `max` writes in flight; with a non-zero `target`, the limit starts at a
    /// quarter of `max` (at least [`MIN_LIMIT`]) and moves to keep the admitted writes' p99
    /// under `target`.
    pub fn new(max: usize, target: Duration) -> Self {
        let max = max.max(1) as f64;
        let target = (!target.is_zero()).then_some(target);
        let start = if target.is_some() {
            (max / 4.0).max(MIN_LIMIT).min(max)
        } else {
            max
        };
        let limit = Self {
            in_flight: AtomicUsize::new(0),
            now: AtomicUsize::new(start as usize),
            reached: AtomicBool::new(false),
            peak: AtomicUsize::new(0),
            target,
            max,
            window: Mutex::new(Window {
                limit: start,
                began: Instant::now(),
                samples: Vec::new(),
            }),
        };
        limit.publish(start);
        limit
    }

    /// Admits a write if fewer than the limit are in flight.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let limit = self.now.load(Ordering::Relaxed);
        // A compare-and-swap, not add-then-undo: a refused write never counts as in flight,
        // so it cannot make another, admissible one look over the limit.
        let mut before = self.in_flight.load(Ordering::Acquire);
        loop {
            if before >= limit {
                self.reached.store(true, Ordering::Relaxed);
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                before,
                before + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => before = now,
            }
        }
        if before + 1 >= limit {
            self.reached.store(true, Ordering::Relaxed);
        }
        self.peak.fetch_max(before + 1, Ordering::Relaxed);
        Some(Permit {
            limit: self.clone(),
            started: Instant::now(),
            learn: true,
        })
    }

    /// The limit now.
    pub fn current(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    fn release(&self, latency: Duration, at: Instant) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let Some(target) = self.target else {
            return;
        };
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        w.samples.push(latency);
        let age = at.saturating_duration_since(w.began);
        if (age >= WINDOW && w.samples.len() >= MIN_SAMPLES) || age >= MAX_WINDOW {
            let load = Load {
                reached: self.reached.swap(false, Ordering::Relaxed),
                busy: self.peak.swap(0, Ordering::Relaxed) as f64 >= w.limit / 2.0,
            };
            let limit = next_limit(w.limit, p99(&mut w.samples), target, load, self.max);
            w.limit = limit;
            w.began = at;
            w.samples.clear();
            self.now.store(limit.round() as usize, Ordering::Relaxed);
            self.publish(limit);
        }
    }

    fn publish(&self, limit: f64) {
        metrics::gauge!(m::API_WRITE_LIMIT).set(limit.round());
    }
}

/// How hard a window pressed on the limit.
#[derive(Clone, Copy)]
struct Load {
    /// The limit was reached (a write refused, or the writes in flight touched it).
    reached: bool,
    /// At least half the limit was in flight at once.
    busy: bool,
}

/// The window's verdict (see the module's doc).
fn next_limit(limit: f64, p99: Duration, target: Duration, load: Load, max: f64) -> f64 {
    let next = if p99 > target && load.busy {
        let shrink = (target.as_secs_f64() / p99.as_secs_f64()).max(0.5);
        limit * shrink
    } else if p99 <= target && load.reached {
        limit + limit.sqrt().max(1.0)
    } else {
        limit
    };
    next.clamp(MIN_LIMIT.min(max), max)
}

fn p99(samples: &mut [Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let k = (samples.len() * 99 / 100).min(samples.len() - 1);
    *samples.select_nth_unstable(k).1
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Duration = Duration::from_millis(100);
    const PRESSED: Load = Load {
        reached: true,
        busy: true,
    };

    #[test]
    fn over_the_target_it_shrinks_under_it_grows_only_when_reached() {
        let ms = Duration::from_millis;
        assert_eq!(next_limit(100.0, ms(200), TARGET, PRESSED, 256.0), 50.0);
        assert_eq!(next_limit(100.0, ms(125), TARGET, PRESSED, 256.0), 80.0);
        assert_eq!(
            next_limit(100.0, ms(10_000), TARGET, PRESSED, 256.0),
            50.0,
            "at most halved"
        );
        assert_eq!(
            next_limit(3.0, ms(10_000), TARGET, PRESSED, 256.0),
            MIN_LIMIT
        );
        assert_eq!(next_limit(100.0, ms(50), TARGET, PRESSED, 256.0), 110.0);
        assert_eq!(
            next_limit(250.0, ms(50), TARGET, PRESSED, 256.0),
            256.0,
            "never past max"
        );
        let idle = Load {
            reached: false,
            busy: false,
        };
        assert_eq!(next_limit(100.0, ms(50), TARGET, idle, 256.0), 100.0);
        assert_eq!(
            next_limit(100.0, ms(900), TARGET, idle, 256.0),
            100.0,
            "a slow write at light load does not move it"
        );
        assert_eq!(
            next_limit(100.0, ms(900), TARGET, PRESSED, 2.0),
            2.0,
            "never past max"
        );
    }

    /// A database that serves 20 writes at once in 10 ms and queues the rest (latency grows
    /// with the writes in flight past 20): the limit settles where the p99 meets the target
    /// (200 in flight), from below and from above, and comes back down when the database
    /// slows tenfold.
    #[test]
    fn the_limit_settles_where_the_latency_meets_the_target() {
        let latency = |in_flight: f64, slow: f64| {
            Duration::from_secs_f64(0.010 * slow * (in_flight / 20.0).max(1.0))
        };
        let run = |mut limit: f64, slow: f64, windows: usize| {
            let mut seen = Vec::new();
            for _ in 0..windows {
                // Offered load past any limit: every window reaches it.
                limit = next_limit(limit, latency(limit, slow), TARGET, PRESSED, 1000.0);
                seen.push(limit);
            }
            (limit, seen)
        };
        let (up, _) = run(MIN_LIMIT, 1.0, 100);
        assert!((150.0..=230.0).contains(&up), "from below: {up}");
        let (down, _) = run(1000.0, 1.0, 100);
        assert!((150.0..=230.0).contains(&down), "from above: {down}");
        let (slowed, seen) = run(up, 10.0, 100);
        assert!(
            (15.0..=25.0).contains(&slowed),
            "database 10x slower: {slowed}"
        );
        assert!(
            seen.iter().take(5).any(|l| *l < 40.0),
            "it comes down within 5 windows: {seen:?}"
        );
        let (back, _) = run(slowed, 1.0, 100);
        assert!((150.0..=230.0).contains(&back), "and goes back up: {back}");
    }

    #[test]
    fn past_the_limit_a_write_is_refused_and_a_finished_one_frees_its_place() {
        let l = Arc::new(Limit::new(3, Duration::ZERO));
        let held: Vec<Permit> = (0..3)
            .map(|_| l.try_acquire().expect("under the limit"))
            .collect();
        assert!(l.try_acquire().is_none(), "the fourth is refused");
        drop(held);
        assert!(l.try_acquire().is_some());
        assert_eq!(l.current(), 3, "no target: the limit stays at max");
    }

    #[test]
    fn with_a_target_the_limit_moves_on_the_admitted_writes_latency() {
        let l = Arc::new(Limit::new(256, TARGET));
        assert_eq!(l.current(), 64, "starts at a quarter of max");
        let t0 = Instant::now();
        l.reached.store(true, Ordering::Relaxed);
        l.peak.store(64, Ordering::Relaxed);
        for i in 0..MIN_SAMPLES {
            l.in_flight.fetch_add(1, Ordering::AcqRel);
            l.release(
                Duration::from_millis(300),
                t0 + WINDOW + Duration::from_micros(i as u64),
            );
        }
        assert_eq!(l.current(), 32, "p99 300 ms vs 100: halved");
        assert_eq!(l.in_flight.load(Ordering::Acquire), 0);
    }
}
