//! The API's adaptive write limit when Cassandra slows (issue 26, item 3: "the limit comes down
//! and goes back up"), a part of `likes-tools bench overload`'s rounds.
//!
//! Writes at ¾ of the API's capacity (comfortable as it is, past what a paused database
//! takes), open loop, for three stretches of [`STRETCH`]: Cassandra as
//! it is, then paused [`PAUSE`] of every [`PERIOD`] (SIGSTOP / SIGCONT: the stalls of a long
//! GC or a node's timeouts, on the real process), then as it is again. Each stretch reports
//! its goodput, the accepted writes' p99 at the server and the limit at its end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde::Serialize;

use super::harness::{p99, quantile_since, Client};

pub const STRETCH: u64 = 15;
pub const PAUSE: Duration = Duration::from_millis(100);
pub const PERIOD: Duration = Duration::from_millis(250);

/// One stretch's figures.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Stretch {
    pub goodput_per_s: f64,
    pub shed_share: f64,
    pub accepted_p99_ms: f64,
    pub accepted_server_p99_ms: f64,
    pub limit_at_end: f64,
}

/// What a run saw.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Slowdown {
    pub rate_per_s: f64,
    pub before: Stretch,
    pub slowed: Stretch,
    pub after: Stretch,
}

/// Ends the pauses and sends SIGCONT when dropped, whichever way the stretch ends (a panic
/// too), so that Cassandra is never left stopped. A bench killed mid-pause leaves it stopped:
/// `kill -CONT $(cat ~/.cache/likes/stack/cassandra.pid)`.
struct Resume {
    pid: u32,
    stop: Arc<AtomicBool>,
}

impl Drop for Resume {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        signal(self.pid, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// Runs the three stretches at `rate`; Cassandra runs freely again when it returns.
pub(super) async fn cassandra(client: &Client, tag: &str, rate: f64) -> Result<Slowdown> {
    let pid = super::harness::cassandra_pid()
        .ok_or_else(|| anyhow!("no cassandra.pid: is the stack up?"))?;
    let before = stretch(client, &format!("{tag}sb"), rate).await;
    let slowed = {
        let stop = Arc::new(AtomicBool::new(false));
        let resume = Resume {
            pid,
            stop: stop.clone(),
        };
        let pauses = {
            let stop = stop.clone();
            tokio::task::spawn_blocking(move || {
                while !stop.load(Ordering::Relaxed) {
                    signal(pid, "-STOP");
                    std::thread::sleep(PAUSE);
                    signal(pid, "-CONT");
                    std::thread::sleep(PERIOD - PAUSE);
                }
            })
        };
        let s = stretch(client, &format!("{tag}ss"), rate).await;
        resume.stop.store(true, Ordering::Relaxed);
        let _ = pauses.await;
        drop(resume);
        s
    };
    let after = stretch(client, &format!("{tag}sa"), rate).await;
    let o = Slowdown {
        rate_per_s: rate,
        before,
        slowed,
        after,
    };
    eprintln!(
        "bench overload: Cassandra paused {PAUSE:?} of every {PERIOD:?} at {rate:.0} writes/s: goodput {:.0}/s, server p99 {:.0} ms, limit {:.0} (before: {:.0}/s, {:.0} ms, limit {:.0}; after: {:.0}/s, {:.0} ms, limit {:.0})",
        o.slowed.goodput_per_s,
        o.slowed.accepted_server_p99_ms,
        o.slowed.limit_at_end,
        o.before.goodput_per_s,
        o.before.accepted_server_p99_ms,
        o.before.limit_at_end,
        o.after.goodput_per_s,
        o.after.accepted_server_p99_ms,
        o.after.limit_at_end
    );
    Ok(o)
}

async fn stretch(client: &Client, tag: &str, rate: f64) -> Stretch {
    let since = quantile_since();
    let mut seen = client.writes(tag, rate, STRETCH).await;
    let (server_p99, limit) = since.p99_and_limit();
    let total = (seen.ok.len() + seen.shed.len()) as f64 + seen.errors as f64;
    Stretch {
        goodput_per_s: seen.ok.len() as f64 / STRETCH as f64,
        shed_share: seen.shed.len() as f64 / total.max(1.0),
        accepted_p99_ms: p99(&mut seen.ok),
        accepted_server_p99_ms: server_p99 * 1000.0,
        limit_at_end: limit,
    }
}
