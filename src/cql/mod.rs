//! The CQL side: one driver session per process, and the keyspace schema.
//!
//! Only CQL that both Apache Cassandra (dev, CI) and ScyllaDB (production) accept is used.

pub mod recorded;
pub mod schema;

use std::sync::Arc;

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;

use crate::config::CqlSettings;
use crate::error::Result;

/// Connects to the cluster (not to a keyspace: statements name theirs, so one session can
/// serve `migrate` before the keyspace exists).
pub async fn connect(settings: &CqlSettings) -> Result<Arc<Session>> {
    let profile = ExecutionProfile::builder()
        .request_timeout(Some(settings.request_timeout))
        .build();
    let session = SessionBuilder::new()
        .known_nodes(&settings.nodes)
        .connection_timeout(settings.request_timeout)
        .default_execution_profile_handle(profile.into_handle())
        .build()
        .await?;
    Ok(Arc::new(session))
}

/// The column names of a result, in order (conditional writes answer with `[applied]` and
/// the current values, whose columns differ by statement and database).
pub fn column_names(rows: &scylla::response::query_result::QueryRowsResult) -> Vec<String> {
    rows.column_specs()
        .iter()
        .map(|c| c.name().to_string())
        .collect()
}
