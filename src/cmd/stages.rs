//! `likes dedupe`, `likes count` and `likes topology` (both stages in one process, for
//! development; production runs them as separate processes that scale by partitions).
//!
//! Each runs until SIGINT or SIGTERM, then finishes its current batch and exits 0. A Kafka or
//! Cassandra error starts the stage over inside the process (see [`crate::runtime::supervise`]); a
//! fatal error (configuration, topology, local state) exits non-zero with the reason in one
//! line. The stages recover on restart (that is their design), so the right supervisor
//! action is always "restart"; `/healthz` answers 503 when a stage is stuck, to ask for one.

use tracing::info;

use crate::config::Settings;
use crate::error::Result;
use crate::runtime::metrics;
use crate::runtime::shutdown::{self, Tasks};
use crate::runtime::supervise::Health;
use crate::topology::Topology;
use crate::{count, dedupe};

/// `likes api`: serves HTTP (and /metrics when `metrics.listen` is set) until a signal.
pub async fn run_api(settings: &Settings, topology: &Topology) -> Result<()> {
    let roles: &[&'static str] = if settings.api.relay {
        &["api", "relay"]
    } else {
        &["api"]
    };
    metrics::serve_configured(settings, vec![], roles).await?;
    crate::api::serve(settings, topology).await
}

fn health(settings: &Settings, stage: &'static str) -> Health {
    Health::new(stage, settings.metrics.stall_after)
}

/// Adds stage 1 to `tasks`, on a thread of its own (its transactional calls block).
fn spawn_dedupe(tasks: &mut Tasks, settings: &Settings, topology: &Topology, health: Health) {
    let (s, t, stop) = (settings.clone(), topology.clone(), tasks.token());
    tasks.spawn_blocking("dedupe", move || {
        let stats = dedupe::run(&s, &t, stop, health)?;
        info!(?stats, "dedupe stopped");
        Ok(())
    });
}

/// Adds stage 2 to `tasks`.
fn spawn_count(tasks: &mut Tasks, settings: &Settings, topology: &Topology, health: Health) {
    let (s, t, stop) = (settings.clone(), topology.clone(), tasks.token());
    tasks.spawn("count", async move {
        let stats = count::run(&s, &t, stop, health).await?;
        info!(?stats, "count stopped");
        Ok(())
    });
}

/// `likes dedupe`
pub async fn run_dedupe(settings: &Settings, topology: &Topology) -> Result<()> {
    let h = health(settings, "dedupe");
    metrics::serve_configured(settings, vec![h.clone()], &["dedupe"]).await?;
    let mut tasks = Tasks::new(shutdown::on_signal());
    spawn_dedupe(&mut tasks, settings, topology, h);
    tasks.join().await
}

/// `likes count`
pub async fn run_count(settings: &Settings, topology: &Topology) -> Result<()> {
    let h = health(settings, "count");
    metrics::serve_configured(settings, vec![h.clone()], &["count"]).await?;
    let mut tasks = Tasks::new(shutdown::on_signal());
    spawn_count(&mut tasks, settings, topology, h);
    tasks.join().await
}

/// `likes topology`: both stages; either ending stops the other, and both are joined.
pub async fn run_topology(settings: &Settings, topology: &Topology) -> Result<()> {
    let (hd, hc) = (health(settings, "dedupe"), health(settings, "count"));
    metrics::serve_configured(settings, vec![hd.clone(), hc.clone()], &["dedupe", "count"]).await?;
    let mut tasks = Tasks::new(shutdown::on_signal());
    spawn_dedupe(&mut tasks, settings, topology, hd);
    spawn_count(&mut tasks, settings, topology, hc);
    tasks.join().await
}
