//! The long-running processes, each assembled one way: its named tasks under one
//! cancellation token (SIGINT/SIGTERM), joined before it exits ([`Tasks`]). `likes api` (with
//! the relay and the erasure gauges beside it), `likes relay`, `likes dedupe`, `likes count`
//! and `likes topology` (both stages in one process, for development; production runs them as
//! separate processes that scale by partitions).
//!
//! Each runs until SIGINT or SIGTERM, then finishes its current batch and exits 0. A Kafka or
//! Cassandra error starts the stage over inside the process (see [`crate::runtime::supervise`]); a
//! fatal error (configuration, topology, local state) exits non-zero with the reason in one
//! line. The stages recover on restart (that is their design), so the right supervisor
//! action is always "restart"; `/healthz` answers 503 when a stage is stuck, to ask for one.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::api::{self, App};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::relay::{self, Relay};
use crate::runtime::health::Health;
use crate::runtime::metrics;
use crate::runtime::shutdown::{self, CancellationToken, Tasks};
use crate::runtime::supervise::connect_patiently;
use crate::topology::Topology;
use crate::{count, dedupe};

/// How long a stopping process waits for the relay's pass in flight.
const RELAY_DRAIN: Duration = Duration::from_secs(10);

/// How often the API refreshes the pending-erasure gauges.
const ERASURE_GAUGES_EVERY: Duration = Duration::from_secs(30);

/// `likes api`: serves HTTP (and /metrics when `metrics.listen` is set) until a signal; with
/// `api.relay`, the relay runs beside on the same CQL session. The pending-erasure gauges
/// are set here, so the 30-day deadline alerts from a process that is always scraped.
pub async fn run_api(settings: &Settings, topology: &Topology) -> Result<()> {
    let roles: &[&'static str] = if settings.api.relay {
        &["api", "relay"]
    } else {
        &["api"]
    };
    metrics::serve_configured(settings, vec![], roles).await?;
    let (app, relay) = connect_patiently("api", || async {
        let app = App::connect(settings, topology).await?;
        let relay = if settings.api.relay {
            let (session, events) = (app.session.clone(), app.events.clone());
            let routes = app.writer.routes().cloned();
            Some(Relay::prepare(session, events, routes, settings, topology).await?)
        } else {
            None
        };
        Ok((app, relay))
    })
    .await?;
    let listener = tokio::net::TcpListener::bind(&settings.api.listen)
        .await
        .map_err(Error::io(format!(
            "binding api.listen {}",
            settings.api.listen
        )))?;
    let bounds = api::serve::Bounds::of(settings)?;
    let mut tasks = Tasks::new(shutdown::on_signal());
    let stop = tasks.token();
    let (store, listen) = (app.store.clone(), settings.api.listen.clone());
    let writer = app.writer.clone();
    let publish_wait = settings.api.publish_wait;
    tasks.spawn("http", async move {
        info!(listen = %listen, "api serving");
        let served = api::serve::serve(listener, api::router(app), bounds, stop)
            .await
            .map_err(Error::io(format!("serving api.listen {listen}")));
        // The last answers' acks and outbox entries, so that the relay does not publish them
        // again.
        if !writer.settle(publish_wait).await {
            info!("stopping with event acks still owed: the relay publishes those flips");
        }
        served
    });
    if let Some(relay) = relay {
        spawn_relay(&mut tasks, relay, settings);
    }
    let stop = tasks.token();
    tasks.spawn("erasure-gauges", async move {
        crate::ops::erase::export_pending(store, ERASURE_GAUGES_EVERY, stop).await;
        Ok(())
    });
    tasks.join().await
}

/// `likes relay` on its own: passes until a signal. Needs CQL and Kafka, nothing of the API.
pub async fn run_relay(settings: &Settings, topology: &Topology) -> Result<()> {
    metrics::serve_configured(settings, vec![], &["relay"]).await?;
    let relay = connect_patiently("relay", || Relay::connect(settings, topology)).await?;
    let mut tasks = Tasks::new(shutdown::on_signal());
    spawn_relay(&mut tasks, relay, settings);
    tasks.join().await
}

/// Adds the relay to `tasks`. At a stop, a pass in flight finishes (its entries are deleted
/// only after their events are published); one that outlasts [`RELAY_DRAIN`] is dropped: its
/// entries stay for the next pass.
fn spawn_relay(tasks: &mut Tasks, relay: Relay, settings: &Settings) {
    let stop = tasks.token();
    let (every, min_age) = (settings.api.relay_interval, settings.api.relay_min_age);
    tasks.spawn("relay", async move {
        let passes = relay::run(Arc::new(relay), every, min_age, stop.clone());
        tokio::select! {
            () = passes => {}
            () = drained(&stop) => {
                warn!(wait = ?RELAY_DRAIN, "relay pass still running at shutdown; its entries stay for the next pass");
            }
        }
        Ok(())
    });
}

/// Resolves [`RELAY_DRAIN`] after `stop` is cancelled.
async fn drained(stop: &CancellationToken) {
    stop.cancelled().await;
    tokio::time::sleep(RELAY_DRAIN).await;
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
