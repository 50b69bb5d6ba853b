//! How a stage lives through its dependencies' restarts: which errors end the process and
//! which only end an incarnation of the stage (rebuilt in-process, after a backoff, from the
//! committed position), and the liveness signal that tells Kubernetes a stage is stuck.
//!
//! A broker or Cassandra restart is routine (rolling upgrades). Exiting on one turns it into
//! a crash loop, and a process that is alive but stuck hides it; both are worse than
//! starting over in-process, which is what a restart would do anyway: every stage recovers
//! from its committed position by design.

use super::shutdown::CancellationToken;
use std::time::{Duration, Instant};

use crate::error::Result;

/// The one retry policy of the crate: exponential backoff from `first`, doubling to `max`,
/// back to `first` on [`Backoff::reset`]. What is retried is decided by the error
/// ([`crate::error::Error::is_retryable`], [`crate::error::Error::ends_process`]); how long
/// to wait, here. The default is a stage's between incarnations: 1 s doubling to 10 s (a
/// dependency back must not wait long for its stage), reset once an incarnation made
/// progress. The jobs retry whole runs on 1 s to 30 s (ops::retrying), the cut's reads on
/// 200 ms to 5 s (ops::cut::retry_transient).
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(10))
    }
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next try; doubles the one after.
    pub fn wait(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// The wait the next [`Backoff::wait`] returns.
    pub fn peek(&self) -> Duration {
        self.next
    }

    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// What follows an incarnation of `stage` that ended with `result`: `Ok(None)` to stop
    /// (done, or `stop` set), `Err` to end the process (a fatal error), `Ok(Some(wait))` to
    /// start a new incarnation after `wait` (logged and counted here).
    pub fn after(
        &mut self,
        stage: &'static str,
        result: Result<()>,
        progressed: bool,
        stop: &CancellationToken,
    ) -> Result<Option<Duration>> {
        let e = match result {
            Ok(()) => return Ok(None),
            Err(e) if e.ends_process() => return Err(e),
            Err(e) => e,
        };
        if stop.is_cancelled() {
            tracing::warn!(stage, error = %e, "stopping: the last batch did not finish");
            return Ok(None);
        }
        if progressed {
            self.reset();
        }
        let wait = self.wait();
        metrics::counter!(crate::runtime::metrics::STAGE_RESTARTS, "stage" => stage).increment(1);
        tracing::warn!(stage, error = %e, retry_in = ?wait,
            "a dependency failed the stage; starting it over from the committed position in this process");
        Ok(Some(wait))
    }
}

/// Runs `connect` until it succeeds, waiting out a store or broker that is restarting (the
/// backoff above, a warn line each) instead of exiting into a crash loop; what no wait can
/// fix (configuration, schema, topology) is returned at once.
pub async fn connect_patiently<T, F, Fut>(what: &str, mut connect: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut backoff = Backoff::default();
    loop {
        match connect().await {
            Ok(t) => return Ok(t),
            Err(e) if e.is_retryable() => {
                let wait = backoff.wait();
                tracing::warn!(error = %e, retry_in = ?wait, "{what}: a dependency is not answering yet");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sleeps `d` in short slices on a blocking thread; returns early (false) once `stop` is
/// cancelled.
pub fn sleep_unless_stopped(d: Duration, stop: &CancellationToken) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.is_cancelled() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
    }
    !stop.is_cancelled()
}

/// Sleeps `d`; returns early (false) once `stop` is cancelled.
pub async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => !stop.is_cancelled(),
        _ = stop.cancelled() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..7).map(|_| b.wait().as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10, 10]);
        b.reset();
        assert_eq!(b.wait(), Duration::from_secs(1));
        let mut job = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let waits: Vec<u128> = (0..7).map(|_| job.wait().as_millis()).collect();
        assert_eq!(waits, vec![200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn dependency_errors_restart_the_stage_and_the_rest_end_the_process() {
        use crate::error::Error;
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode as C;
        let broker_away = Error::Kafka(KafkaError::MessageConsumption(C::AllBrokersDown));
        assert!(!broker_away.ends_process());
        assert!(!Error::Timeout(Duration::ZERO, "x".into()).ends_process());
        assert!(Error::Config("x".into()).ends_process());
        assert!(Error::Injected("x").ends_process());
        assert!(Error::State("x".into()).ends_process());
    }
}
