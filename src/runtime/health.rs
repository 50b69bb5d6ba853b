//! A stage's liveness, as `/healthz` reports it (runtime/metrics.rs serves it; the stages and
//! their supervision beat it).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A stage's liveness. The stage beats when it commits input or finds none waiting; a
/// stage that has not beaten for `stall_after` has input it cannot get through (a commit
/// failing in a loop, a dependency gone for long), and `/healthz` answers 503 so that the
/// supervisor (Kubernetes' liveness probe) restarts it.
#[derive(Clone)]
pub struct Health {
    inner: Arc<HealthInner>,
}

struct HealthInner {
    stage: &'static str,
    stall_after: Duration,
    started: Instant,
    last_beat_ms: AtomicI64,
}

/// What `/healthz` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Ok,
    Stalled { stage: &'static str, for_: Duration },
}

impl Health {
    pub fn new(stage: &'static str, stall_after: Duration) -> Self {
        Self {
            inner: Arc::new(HealthInner {
                stage,
                stall_after,
                started: Instant::now(),
                last_beat_ms: AtomicI64::new(0),
            }),
        }
    }

    /// Progress made, or no input waiting.
    pub fn beat(&self) {
        let ms = self.inner.started.elapsed().as_millis() as i64;
        self.inner.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    pub fn liveness(&self) -> Liveness {
        let since_ms = self.inner.started.elapsed().as_millis() as i64
            - self.inner.last_beat_ms.load(Ordering::Relaxed);
        let since = Duration::from_millis(since_ms.max(0) as u64);
        if since > self.inner.stall_after {
            Liveness::Stalled {
                stage: self.inner.stage,
                for_: since,
            }
        } else {
            Liveness::Ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_that_stops_beating_is_stalled() {
        // A threshold no pause of a loaded box reaches between two lines, for the "Ok" half...
        let h = Health::new("dedupe", Duration::from_secs(30));
        h.beat();
        assert_eq!(h.liveness(), Liveness::Ok);
        // ...and one any sleep passes, for the "Stalled" half: neither depends on the box.
        let h = Health::new("dedupe", Duration::from_millis(1));
        h.beat();
        std::thread::sleep(Duration::from_millis(20));
        assert!(matches!(
            h.liveness(),
            Liveness::Stalled {
                stage: "dedupe",
                ..
            }
        ));
    }
}
