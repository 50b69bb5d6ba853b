//! `likes dedupe`, `likes count` and `likes topology` (both stages in one process, for
//! development; production runs them as separate processes that scale by partitions).
//!
//! Each runs until SIGINT or SIGTERM, then finishes its current batch and exits 0. A fatal
//! error exits non-zero; the stages recover on restart (that is their design), so the right
//! supervisor action is always "restart".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::{count, dedupe, metrics};

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    info!("signal received: finishing what is in flight");
}

/// Sets the returned flag on SIGINT or SIGTERM.
fn stop_on_signal() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        flag.store(true, Ordering::Relaxed);
    });
    stop
}

/// `likes api`: serves HTTP (and /metrics when `metrics.listen` is set) until a signal.
pub async fn run_api(settings: &Settings, topology: &Topology) -> Result<()> {
    start_metrics(settings)?;
    crate::api::serve(settings, topology).await
}

fn start_metrics(settings: &Settings) -> Result<()> {
    if settings.metrics.listen.is_empty() {
        return Ok(());
    }
    let addr = settings
        .metrics
        .listen
        .parse()
        .map_err(|e| Error::Config(format!("metrics.listen: {e}")))?;
    metrics::install(addr)?;
    info!(%addr, "serving /metrics");
    Ok(())
}

async fn spawn_dedupe(
    settings: &Settings,
    topology: &Topology,
    stop: Arc<AtomicBool>,
) -> Result<dedupe::DedupeStats> {
    let (s, t) = (settings.clone(), topology.clone());
    tokio::task::spawn_blocking(move || dedupe::run(&s, &t, stop))
        .await
        .map_err(|e| Error::Config(format!("dedupe thread: {e}")))?
}

/// `likes dedupe`
pub async fn run_dedupe(settings: &Settings, topology: &Topology) -> Result<()> {
    start_metrics(settings)?;
    let stats = spawn_dedupe(settings, topology, stop_on_signal()).await?;
    info!(?stats, "dedupe stopped");
    Ok(())
}

/// `likes count`
pub async fn run_count(settings: &Settings, topology: &Topology) -> Result<()> {
    start_metrics(settings)?;
    let stats = count::run(settings, topology, stop_on_signal()).await?;
    info!(?stats, "count stopped");
    Ok(())
}

/// `likes topology`: both stages; either failing stops the other.
pub async fn run_topology(settings: &Settings, topology: &Topology) -> Result<()> {
    start_metrics(settings)?;
    let stop = stop_on_signal();
    let dedupe = spawn_dedupe(settings, topology, stop.clone());
    let count = count::run(settings, topology, stop.clone());
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
