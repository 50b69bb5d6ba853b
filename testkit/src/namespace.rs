//! A tool's own namespace on the stack (a keyspace and a topic prefix), created the way a
//! deployment creates its own: `likes migrate`, the recorded topology, `likes topics`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use scylla::client::session::Session;

use likes::config::Settings;
use likes::store::counts::Counts;
use likes::topology::Topology;
use likes::{cmd, cql};

/// Creates the keyspace, its tables and the topics of `settings` (idempotent), and records
/// `topology` in the keyspace (a benchmark may run another window than the last run there:
/// `accept_window_change`). Returns the session and what the recording said.
pub async fn create(
    settings: &Settings,
    topology: &Topology,
    accept_window_change: bool,
) -> Result<(Arc<Session>, Vec<String>)> {
    let session = cql::connect(&settings.cql).await?;
    let ctx = likes::ops::Ctx {
        settings: settings.clone(),
        topology: topology.clone(),
    };
    let (_, said) =
        match cmd::migrate::migrate_and_record(&session, &ctx, accept_window_change).await {
            Ok(done) => done,
            Err(e @ likes::error::Error::Schema(_)) => Err(e)
                .context("a keyspace from an older version? `make stack-reset` wipes the stack")?,
            Err(e) => Err(e)?,
        };
    cmd::topics::run(settings, topology).await?;
    Ok((session, said))
}

/// Drops the keyspace and deletes the topics of `settings`: a namespace a benchmark or a
/// chaos run created for itself. The product has no such command: deleting a deployment's
/// data is never one command away. The topics go even when the keyspace's drop failed (a
/// slow schema change); the first error is returned.
pub async fn drop(session: &Session, settings: &Settings, topology: &Topology) -> Result<()> {
    let keyspace = session
        .query_unpaged(
            format!("DROP KEYSPACE IF EXISTS {}", settings.cql.keyspace),
            (),
        )
        .await;
    let names: Vec<String> = topology
        .topics()
        .iter()
        .map(|(_, t)| settings.topic(&t.name))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let topics = match likes::kafka::admin(&settings.kafka) {
        Ok(admin) => admin
            .delete_topics(&refs, &rdkafka::admin::AdminOptions::new())
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from),
        Err(e) => Err(e.into()),
    };
    keyspace?;
    topics
}

/// Writes `topology` to `<dir>/topology.toml`, for the stages a tool starts to run exactly
/// that topology (which may differ from the file's window).
pub fn write_topology(dir: &Path, topology: &Topology) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("topology.toml");
    std::fs::write(&path, toml::to_string(topology)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// LIKED edges per item (what each count must converge to) and every counter row
/// (item → (count, asOf ms)), read through the product's stores.
pub async fn edges_and_counts(session: &Arc<Session>, ks: &str) -> Result<(Liked, Counted)> {
    let counts = Counts::prepare(session.clone(), ks).await?;
    Ok((
        crate::truth::liked_per_item(session, ks).await?,
        counts.all().await?,
    ))
}

/// LIKED edges per item.
pub type Liked = BTreeMap<String, i64>;
/// Counter rows: item → (count, asOf ms).
pub type Counted = BTreeMap<String, (i64, Option<i64>)>;
