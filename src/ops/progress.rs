//! What a long job is doing: a progress line with rate and ETA on a terminal, a plain log
//! line every few seconds otherwise (a CronJob's log).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub struct Progress {
    what: String,
    total: Option<u64>,
    done: u64,
    started: Instant,
    shown: Instant,
    tty: bool,
}

const TTY_EVERY: Duration = Duration::from_millis(250);
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    pub fn new(what: impl Into<String>, total: Option<u64>) -> Self {
        let now = Instant::now();
        Self {
            what: what.into(),
            total,
            done: 0,
            started: now,
            shown: now,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// A new estimate of the total (a file read by bytes knows its rows only roughly).
    pub fn set_total(&mut self, total: Option<u64>) {
        self.total = total;
    }

    pub fn add(&mut self, n: u64) {
        self.done += n;
        let every = if self.tty { TTY_EVERY } else { LOG_EVERY };
        if self.shown.elapsed() >= every {
            self.shown = Instant::now();
            self.show();
        }
    }

    /// The line as shown: done/total, rate and ETA.
    pub fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = self.done as f64 / secs;
        match self.total {
            Some(t) if t > 0 => {
                let eta = if rate > 0.0 {
                    humantime::format_duration(Duration::from_secs(
                        (t.saturating_sub(self.done) as f64 / rate) as u64,
                    ))
                    .to_string()
                } else {
                    "?".into()
                };
                format!(
                    "{}: {}/{} ({:.0}%), {:.1}/s, ETA {eta}",
                    self.what,
                    self.done,
                    t,
                    100.0 * self.done as f64 / t as f64,
                    rate
                )
            }
            _ => format!("{}: {}, {:.1}/s", self.what, self.done, rate),
        }
    }

    fn show(&self) {
        if self.tty {
            eprint!("\r\x1b[2K{}", self.line());
        } else {
            tracing::info!("{}", self.line());
        }
    }

    pub fn finish(&self) {
        if self.tty {
            eprintln!("\r\x1b[2K{}", self.line());
        } else {
            tracing::info!("{} (done)", self.line());
        }
    }
}

/// Sleeps while telling a person (or a log) what the job waits for, every few seconds.
pub async fn waiting(what: &str, since: Instant) {
    if since.elapsed().as_secs().is_multiple_of(5) {
        tracing::info!(waited = ?Duration::from_secs(since.elapsed().as_secs()), "waiting: {what}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
}
