//! Removing a namespace (a keyspace and the topics under a prefix) that a benchmark, a chaos
//! run or a test created for itself. No subcommand runs it: deleting a deployment's data is
//! never one command away.

use crate::config::Settings;
use crate::error::Result;
use crate::kafka;
use crate::topology::Topology;

/// Drops the keyspace and deletes the topics of `settings`.
pub async fn drop(
    session: &scylla::client::session::Session,
    settings: &Settings,
    topology: &Topology,
) -> Result<()> {
    session
        .query_unpaged(
            format!("DROP KEYSPACE IF EXISTS {}", settings.cql.keyspace),
            (),
        )
        .await?;
    let names: Vec<String> = topology
        .topics()
        .iter()
        .map(|(_, t)| settings.topic(&t.name))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    kafka::admin(&settings.kafka)?
        .delete_topics(&refs, &rdkafka::admin::AdminOptions::new())
        .await?;
    Ok(())
}
