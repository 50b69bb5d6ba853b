//! The CQL side: one driver session per process, and the keyspace's table specs (`tables`).
//!
//! Only CQL that both Apache Cassandra (dev, CI) and ScyllaDB (production) accept is used.

pub mod clock;
pub mod tables;

use std::sync::Arc;

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::statement::SerialConsistency;

use crate::config::CqlSettings;
use crate::error::Result;

/// The serial consistency of every conditional write and SERIAL read, decided here once for
/// every process: SERIAL (Paxos across all datacenters), never the driver's default
/// LOCAL_SERIAL. Two LOCAL_SERIAL writers in two datacenters are not linearizable with each
/// other: tests/regions.rs races two datacenters' writers on one real two-DC cluster, and at
/// LOCAL_SERIAL both won a few rows of 300 in each run tried (docs/multi-region.md, "Paxos
/// scope"). No statement sets its own (a test holds the code to that).
pub const SERIAL_CONSISTENCY: SerialConsistency = SerialConsistency::Serial;

/// The execution profile every session uses.
pub fn profile(settings: &CqlSettings) -> ExecutionProfile {
    let builder = ExecutionProfile::builder()
        .request_timeout(Some(settings.request_timeout))
        .serial_consistency(Some(SERIAL_CONSISTENCY));
    match &settings.local_datacenter {
        // A region's processes coordinate through their own datacenter's nodes and never
        // fail over to another's: a write that cannot reach its home fails, it is not
        // coordinated from afar (docs/multi-region.md, "Forwarding and retries").
        Some(dc) => builder
            .load_balancing_policy(
                DefaultPolicy::builder()
                    .prefer_datacenter(dc.clone())
                    .permit_dc_failover(false)
                    .build(),
            )
            .build(),
        None => builder.build(),
    }
}

/// Connects to the cluster (not to a keyspace: statements name theirs, so one session can
/// serve `migrate` before the keyspace exists).
pub async fn connect(settings: &CqlSettings) -> Result<Arc<Session>> {
    let profile = profile(settings);
    let session = SessionBuilder::new()
        .known_nodes(&settings.nodes)
        .connection_timeout(settings.request_timeout)
        .default_execution_profile_handle(profile.into_handle())
        .pool_size(pool_size(settings))
        .build()
        .await?;
    Ok(Arc::new(session))
}

/// Connections to each shard of each node (Cassandra: one shard per node). One connection
/// multiplexes many requests; more spread a busy pod over several sockets, but on the 2-core
/// box four made the write tail 2.3x worse (docs/performance.md, "Side by side"): 1 by default.
fn pool_size(settings: &CqlSettings) -> scylla::client::PoolSize {
    let n = std::num::NonZeroUsize::new(settings.connections_per_shard.max(1)).expect("max(1)");
    scylla::client::PoolSize::PerShard(n)
}

/// The column names of a result, in order (conditional writes answer with `[applied]` and
/// the current values, whose columns differ by statement and database).
pub fn column_names(rows: &scylla::response::query_result::QueryRowsResult) -> Vec<String> {
    rows.column_specs()
        .iter()
        .map(|c| c.name().to_string())
        .collect()
}

/// A schema change waits for the cluster's schema agreement and, on a busy node, can take
/// longer than `cql.request_timeout` (seen: a CREATE TABLE past 5 s on the test stack while
/// other tests loaded it, and `likes migrate` failed). Schema changes are rare and sent one at
/// a time, so each gets a minute. Migrate's are idempotent (IF NOT EXISTS, and an ADD only
/// for a column the table lacks): running it again finishes one cut short.
pub const SCHEMA_CHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Sends one schema statement (CREATE, ALTER, DROP) with [`SCHEMA_CHANGE_TIMEOUT`].
pub async fn schema_change(session: &Session, cql: String) -> crate::error::Result<()> {
    let mut statement = scylla::statement::unprepared::Statement::new(cql);
    statement.set_request_timeout(Some(SCHEMA_CHANGE_TIMEOUT));
    session.query_unpaged(statement, ()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_session_runs_conditional_writes_at_serial() {
        let settings = crate::config::Settings::load(None).unwrap();
        assert_eq!(
            profile(&settings.cql).get_serial_consistency(),
            Some(SerialConsistency::Serial)
        );
    }

    /// One decision in one place: no statement overrides the session's serial consistency
    /// (the driver's per-statement default is LOCAL_SERIAL only where one is set).
    #[test]
    fn no_statement_sets_its_own_serial_consistency() {
        let root = likes_testkit::repo::root().join("src");
        let mut offenders = Vec::new();
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("cql/mod.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if text.contains("set_serial_consistency") || text.contains("LocalSerial") {
                        offenders.push(path.display().to_string());
                    }
                }
            }
        }
        assert!(offenders.is_empty(), "set per statement in {offenders:?}");
    }
}
