//! The clock bound (docs/exactness.md, "The clock bound"). Three margins assume that the
//! clocks of any two processes differ by less than twice `cql.max_clock_skew`: the relay
//! judges an outbox entry old by its own clock and the writer stamped it by its own
//! (`api.relay_min_age` must cover a write's deadline, one CQL timeout and that difference);
//! a cut waits `api.relay_min_age` past K by the ops host's clock; the relay's floor moves
//! past minutes that are two minutes old. So every process that talks to the database holds
//! its clock to the database's: at connect (`check`), and the long-running writers and relays
//! again every `cql.clock_check_every` (`ClockWatch`), refusing to stamp or judge while off.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use scylla::client::session::Session;

use crate::error::{Error, Result};

/// This host's clock minus the database's, in ms, and the round trip that bounds the
/// measure's error; None if the database did not say.
pub async fn skew_ms(session: &Session) -> Result<Option<(i64, i64)>> {
    let before = crate::runtime::clock::now_ms();
    let rows = session
        .query_unpaged("SELECT toTimestamp(now()) FROM system.local", ())
        .await?
        .into_rows_result()?;
    let after = crate::runtime::clock::now_ms();
    let Some((Some(db),)) = rows.maybe_first_row::<(Option<scylla::value::CqlTimestamp>,)>()?
    else {
        return Ok(None);
    };
    Ok(Some(((before + after) / 2 - db.0, after - before)))
}

/// Whether a measured skew is past the bound (the round trip is the measure's error).
fn beyond(skew: i64, rtt: i64, max: Duration) -> bool {
    skew.abs() > max.as_millis() as i64 + rtt
}

fn refusal(skew: i64, max: Duration) -> Error {
    Error::Config(format!(
        "this host's clock is {skew} ms off the database's, more than cql.max_clock_skew \
         ({max:?}): the relay's and the cut's margins hold only within it (docs/exactness.md, \
         \"The clock bound\"). Fix the host's time sync (NTP/chrony)"
    ))
}

/// The check at connect: refuses a process whose clock is off by more than `max`.
pub async fn check(session: &Session, max: Duration) -> Result<()> {
    if let Some((skew, rtt)) = skew_ms(session).await? {
        metrics::gauge!(crate::runtime::metrics::CLOCK_SKEW).set(skew as f64);
        if beyond(skew, rtt, max) {
            return Err(refusal(skew, max));
        }
        if skew.abs() > max.as_millis() as i64 / 2 {
            tracing::warn!(
                skew_ms = skew,
                ?max,
                "this host's clock is off the database's"
            );
        }
    }
    Ok(())
}

/// The clock checked again while the process runs: a clock that steps or drifts past the
/// bound after the start check closes the writes and relay passes of this process until it
/// is back. A failed measure (the database away) keeps the last verdict.
#[derive(Clone, Default)]
pub struct ClockWatch {
    off: Arc<AtomicBool>,
    skew: Arc<AtomicI64>,
}

impl ClockWatch {
    /// Checks every `every` while any handle to it lives (never when `every` is zero: tests
    /// that move their own clock to pass a horizon turn it off).
    pub fn spawn(session: Arc<Session>, max: Duration, every: Duration) -> ClockWatch {
        let watch = ClockWatch::default();
        if every.is_zero() {
            return watch;
        }
        let w = Arc::downgrade(&watch.off);
        let skew = watch.skew.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(off) = w.upgrade() else { return };
                let w = ClockWatch {
                    off,
                    skew: skew.clone(),
                };
                match skew_ms(&session).await {
                    Ok(Some((s, rtt))) => w.record(s, beyond(s, rtt, max), max),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "clock check: the database did not answer")
                    }
                }
            }
        });
        watch
    }

    fn record(&self, skew: i64, off: bool, max: Duration) {
        metrics::gauge!(crate::runtime::metrics::CLOCK_SKEW).set(skew as f64);
        self.skew.store(skew, Ordering::Relaxed);
        let was = self.off.swap(off, Ordering::Relaxed);
        match (was, off) {
            (false, true) => tracing::error!(skew_ms = skew, ?max, "this host's clock is off the database's past cql.max_clock_skew: writes and relay passes refused until it is back"),
            (true, false) => tracing::info!(skew_ms = skew, "this host's clock is back within cql.max_clock_skew"),
            _ => {}
        }
    }

    /// None while the clock is within the bound; else why this process must not stamp or
    /// judge time now.
    pub fn refusal(&self, max: Duration) -> Option<Error> {
        self.off
            .load(Ordering::Relaxed)
            .then(|| refusal(self.skew.load(Ordering::Relaxed), max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_round_trip_widens_the_bound() {
        let max = Duration::from_secs(2);
        assert!(!beyond(2_000, 0, max));
        assert!(beyond(2_001, 0, max));
        assert!(!beyond(-2_300, 400, max));
        assert!(beyond(-9_000, 400, max));
    }

    #[test]
    fn a_watch_closes_and_reopens_with_the_clock() {
        let w = ClockWatch::default();
        let max = Duration::from_secs(2);
        assert!(w.refusal(max).is_none());
        w.record(10_000, true, max);
        let why = w.refusal(max).unwrap().to_string();
        assert!(
            why.contains("10000 ms off") && why.contains("cql.max_clock_skew"),
            "{why}"
        );
        w.record(100, false, max);
        assert!(w.refusal(max).is_none());
    }
}
