//! `likes dedupe`, `likes count` and `likes topology` (both stages in one process, for
//! development; production runs them as separate processes that scale by partitions).
//!
//! Each runs until SIGINT or SIGTERM, then finishes its current batch and exits 0. A Kafka or
//! Cassandra error starts the stage over inside the process (see [`crate::runtime::supervise`]); a
//! fatal error (configuration, topology, local state) exits non-zero with the reason in one
//! line. The stages recover on restart (that is their design), so the right supervisor
//! action is always "restart"; `/healthz` answers 503 when a stage is stuck, to ask for one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::runtime::supervise::Health;
use crate::runtime::{metrics, shutdown};
use crate::topology::Topology;
use crate::{count, dedupe};

/// `likes api`: serves HTTP (and /metrics when `metrics.listen` is set) until a signal.
pub async fn run_api(settings: &Settings, topology: &Topology) -> Result<()> {
    start_metrics(settings, vec![]).await?;
    crate::api::serve(settings, topology).await
}

/// Serves /metrics, and /healthz for `health`, when `metrics.listen` is set.
async fn start_metrics(settings: &Settings, health: Vec<Health>) -> Result<()> {
    if settings.metrics.listen.is_empty() {
        return Ok(());
    }
    let addr = settings
        .metrics
        .listen
        .parse()
        .map_err(|e| Error::Config(format!("metrics.listen: {e}")))?;
    metrics::install(addr, health).await?;
    info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(())
}

fn health(settings: &Settings, stage: &'static str) -> Health {
    Health::new(stage, settings.metrics.stall_after)
}

async fn spawn_dedupe(
    settings: &Settings,
    topology: &Topology,
    stop: Arc<AtomicBool>,
    health: Health,
) -> Result<dedupe::DedupeStats> {
    let (s, t) = (settings.clone(), topology.clone());
    tokio::task::spawn_blocking(move || dedupe::run(&s, &t, stop, health))
        .await
        .map_err(|e| Error::Config(format!("dedupe thread: {e}")))?
}

/// `likes dedupe`
pub async fn run_dedupe(settings: &Settings, topology: &Topology) -> Result<()> {
    let h = health(settings, "dedupe");
    start_metrics(settings, vec![h.clone()]).await?;
    let stats = spawn_dedupe(settings, topology, shutdown::flag_on_signal(), h).await?;
    info!(?stats, "dedupe stopped");
    Ok(())
}

/// `likes count`
pub async fn run_count(settings: &Settings, topology: &Topology) -> Result<()> {
    let h = health(settings, "count");
    start_metrics(settings, vec![h.clone()]).await?;
    let stats = count::run(settings, topology, shutdown::flag_on_signal(), h).await?;
    info!(?stats, "count stopped");
    Ok(())
}

/// `likes topology`: both stages; either failing stops the other.
pub async fn run_topology(settings: &Settings, topology: &Topology) -> Result<()> {
    let (hd, hc) = (health(settings, "dedupe"), health(settings, "count"));
    start_metrics(settings, vec![hd.clone(), hc.clone()]).await?;
    let stop = shutdown::flag_on_signal();
    let dedupe = spawn_dedupe(settings, topology, stop.clone(), hd);
    let count = count::run(settings, topology, stop.clone(), hc);
    tokio::pin!(dedupe, count);
    let first = tokio::select! {
        r = &mut dedupe => ("dedupe", r.map(|_| ())),
        r = &mut count => ("count", r.map(|_| ())),
    };
    stop.store(true, Ordering::Relaxed);
    if let (stage, Err(e)) = first {
        return Err(Error::Config(format!("{stage} failed: {e}")));
    }
    Ok(())
}
