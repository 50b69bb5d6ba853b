//! Recovery of each stage after kill -9 and after a graceful restart (SIGTERM, then start: a
//! rolling update), under the live load: the stage is stopped and started again at once (as a
//! pod's restart policy does), and the bench measures how long until it
//! processes again (its first committed transaction, or its first applied window) and until
//! the staleness of what the sink applies is back under the live phase's p99 (each second's
//! p99, from the count stage's histogram).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::harness::{spawn_stage, COUNT_PORT, DEDUPE_PORT};
use super::scrape::{buckets, diff, quantile, scrape};
use likes::config::Settings;
use likes::runtime::metrics as m;
use likes_testkit::procs::Proc;

/// Steady load before the kill.
const BEFORE_KILL: Duration = Duration::from_secs(5);
/// How long recovery may take before the bench gives up on it (reported as NaN).
pub(super) const GIVE_UP: Duration = Duration::from_secs(45);

/// How a stage goes down before its restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Restart {
    /// SIGKILL: a crash, an OOM kill, a lost node.
    Kill9,
    /// SIGTERM and its drain: a rolling update.
    Graceful,
}

impl Restart {
    pub fn label(self) -> &'static str {
        match self {
            Restart::Kill9 => "kill -9",
            Restart::Graceful => "graceful restart",
        }
    }
}

/// One stage's recovery, seconds from the signal.
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub stage: &'static str,
    pub how: Restart,
    pub processing_again_s: f64,
    pub staleness_back_s: f64,
    /// Stage 1's own account of its start (`dedupe processing` in its log).
    pub start_phases: String,
}

/// Stops `stage` (running as `proc`) as `how` says, starts it again, and measures.
pub(super) async fn measure(
    stage: &'static str,
    how: Restart,
    proc: &mut Proc,
    settings: &Settings,
    dir: &Path,
    live_p99_s: f64,
) -> Result<Recovery> {
    tokio::time::sleep(BEFORE_KILL).await;
    let killed = Instant::now();
    match how {
        Restart::Kill9 => {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
        }
        // Timed from the signal: a drain is part of what a rolling update costs.
        Restart::Graceful => likes_testkit::procs::stop(proc),
    }
    let (port, progress) = match stage {
        "dedupe" => (DEDUPE_PORT, m::EVENTS_IN),
        _ => (COUNT_PORT, m::DELTAS_APPLIED),
    };
    // The log is appended across starts: this start's lines are those past its length now.
    let log_path = dir.join(format!("{stage}.log"));
    let log_from = std::fs::metadata(&log_path).map_or(0, |m| m.len() as usize);
    *proc = spawn_stage(stage, settings, port, dir)?;
    let mut r = Recovery {
        stage,
        how,
        processing_again_s: f64::NAN,
        staleness_back_s: f64::NAN,
        start_phases: String::new(),
    };
    let staleness = || buckets(&scrape(COUNT_PORT), m::STALENESS_SECONDS);
    let mut prev = staleness();
    let mut next_slice = Instant::now() + Duration::from_secs(1);
    while killed.elapsed() < GIVE_UP && r.staleness_back_s.is_nan() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if r.processing_again_s.is_nan() && scrape(port).get(progress).copied().unwrap_or(0.0) > 0.0
        {
            r.processing_again_s = killed.elapsed().as_secs_f64();
        }
        if Instant::now() < next_slice {
            continue;
        }
        next_slice += Duration::from_secs(1);
        let cur = staleness();
        let total = |b: &[(f64, f64)]| b.last().map(|x| x.1).unwrap_or(0.0);
        // A restarted count stage's histogram starts again from zero.
        let slice = if total(&cur) >= total(&prev) {
            diff(&cur, &prev)
        } else {
            cur.clone()
        };
        prev = cur;
        if !r.processing_again_s.is_nan()
            && total(&slice) > 0.0
            && quantile(&slice, 0.99) <= live_p99_s
        {
            r.staleness_back_s = killed.elapsed().as_secs_f64();
        }
    }
    if stage == "dedupe" {
        // Where the restart's time went, as the stage logged it.
        let log = std::fs::read(&log_path).unwrap_or_default();
        let log = String::from_utf8_lossy(log.get(log_from..).unwrap_or_default());
        if let Some(line) = log.lines().find(|l| l.contains("dedupe processing")) {
            let phases = line.split_once("total_ms=").map_or(line, |(_, p)| p);
            eprintln!(
                "bench: {} of dedupe: its start: total_ms={phases}",
                how.label()
            );
            r.start_phases = phases.to_string();
        }
    }
    eprintln!(
        "bench: {} of {stage}: processing again after {:.1} s, staleness back under {live_p99_s:.2} s after {:.1} s",
        how.label(),
        r.processing_again_s,
        r.staleness_back_s
    );
    Ok(r)
}
