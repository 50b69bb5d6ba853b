//! The operations jobs an on-call engineer runs: `erase`, `drift`, `reconcile`, `rebuild`,
//! `replay`, `region`, `compare`.
//! Each is safe to run twice and to kill halfway, and says what it is doing. Each owns its
//! command: its flags (`Args`, with their help) and `command(args, ctx)`, which runs the job
//! as `likes <job>` does and returns what it prints ([`Done`]); `main` only dispatches.

pub mod compare;
pub mod cut;
pub mod dead_letters;
pub mod drift;
pub mod erase;
pub mod gauges;
pub mod progress;
pub mod rebuild;
pub mod reconcile;
pub mod region;
pub mod replay;

use std::future::Future;
use std::time::{Duration, Instant};

use crate::config::Settings;
use crate::error::Result;
use crate::runtime::supervise::Backoff;
use crate::topology::Topology;

/// What every command runs with: the effective settings and topology (runtime::Boot).
pub struct Ctx {
    pub settings: Settings,
    pub topology: Topology,
}

/// What a command leaves when it ends: the report it prints on stdout, and the reason the run
/// fails after it (exit 1), when the report is not the end of the work (items left in
/// flight: run it again).
#[derive(Debug, Default)]
pub struct Done {
    pub report: String,
    pub failure: Option<String>,
}

impl Done {
    /// A report, and the run succeeded.
    pub fn report(report: impl std::fmt::Display) -> Self {
        Done {
            report: report.to_string(),
            failure: None,
        }
    }

    /// The run fails with `e` (after its report is printed) when `after` failed: the gauges
    /// left after the work, whose report must not be lost to a Pushgateway's refusal.
    pub fn failing_on(mut self, after: Result<()>) -> Self {
        if let Err(e) = after {
            self.fail(e.to_string());
        }
        self
    }

    /// The run fails with `why` (after its report is printed) when `failed`.
    pub fn failing_if(mut self, failed: bool, why: impl Into<String>) -> Self {
        if failed {
            self.fail(why.into());
        }
        self
    }

    /// Several reasons are all said, in order.
    fn fail(&mut self, why: String) {
        self.failure = Some(match self.failure.take() {
            Some(before) => format!("{before}; {why}"),
            None => why,
        });
    }
}

/// Runs a whole operations job again when a dependency failed it (a broker or database
/// restarting: an error worth retrying), with backoff, until `deadline` has passed; every job
/// here is safe to run again from the start (its writes are fenced or idempotent). On giving
/// up, the error says so and names the command to run.
pub async fn retrying<T, F, Fut>(job: &str, deadline: Duration, mut run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        match run().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && started.elapsed() + backoff.peek() < deadline => {
                let wait = backoff.wait();
                tracing::warn!(error = %e, retry_in = ?wait,
                    "{job}: a dependency failed the job; running it again (safe: what it wrote is fenced)");
                tokio::time::sleep(wait).await;
            }
            Err(e) if e.is_retryable() => {
                return Err(crate::error::Error::Timeout(
                    deadline,
                    format!(
                        "{job}: a dependency kept failing it ({e}); nothing it wrote is half-done \
                         (corrections and rows are fenced): run `likes {job} ...` again with the \
                         same arguments once Kafka and CQL answer"
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Done;
    use crate::error::Error;

    /// A Pushgateway's refusal fails the run but keeps the report, and a second reason is
    /// said too, not lost.
    #[test]
    fn a_failure_after_the_work_keeps_the_report_and_every_reason() {
        let d = Done::report("3 items compared")
            .failing_on(Err(Error::Unavailable(
                "the Pushgateway answered 500".into(),
            )))
            .failing_if(true, "2 items differ");
        assert_eq!(d.report, "3 items compared");
        assert_eq!(
            d.failure.as_deref(),
            Some("unavailable: the Pushgateway answered 500; 2 items differ")
        );
        assert!(Done::report("ok").failing_on(Ok(())).failure.is_none());
    }
}
