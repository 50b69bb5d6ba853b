//! `likes-tools prune`: deletes what test runs left on the local stack. A passing test drops
//! its keyspace and topics; a failed or killed one cannot, and thousands of leftover
//! partitions make the broker's start slow enough to miss `make up`'s readiness wait. Only
//! namespaces named by `likes_testkit::names::unique` whose process has exited are touched:
//! a run beside this one, a demo or a chaos run's kept namespace are left alone.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use rdkafka::consumer::{BaseConsumer, Consumer};

use likes::config::Settings;
use likes_testkit::names::is_left_behind;

/// What a prune deleted.
pub struct Pruned {
    pub topics: usize,
    pub keyspaces: usize,
}

pub async fn run(settings: &Settings) -> Result<Pruned> {
    // A process's liveness is read from this machine's /proc: only a stack on this machine
    // can say whether the run that named a namespace is gone.
    let local =
        |addr: &str| addr.trim().starts_with("127.") || addr.trim().starts_with("localhost");
    let brokers = &settings.kafka.brokers;
    if !brokers.split(',').all(local) || !settings.cql.nodes.iter().all(|n| local(n)) {
        anyhow::bail!(
            "prune works on a stack on this machine only (kafka {brokers}, cql {:?}): \
             whether another machine's test run is gone cannot be told from here",
            settings.cql.nodes
        );
    }
    let consumer: BaseConsumer = likes::kafka::client_config(&settings.kafka).create()?;
    let metadata =
        tokio::task::block_in_place(|| consumer.fetch_metadata(None, Duration::from_secs(30)))?;
    let topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|name| is_left_behind(name))
        .collect();
    let admin = likes::kafka::admin(&settings.kafka)?;
    let options =
        rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(60)));
    for chunk in topics.chunks(500) {
        let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
        admin.delete_topics(&names, &options).await?;
    }

    let session = likes::cql::connect(&settings.cql).await?;
    let rows = session
        .query_unpaged("SELECT keyspace_name FROM system_schema.keyspaces", ())
        .await?
        .into_rows_result()?;
    let keyspaces: BTreeSet<String> = rows
        .rows::<(String,)>()?
        .filter_map(|r| r.ok().map(|(k,)| k))
        .filter(|k| is_left_behind(k))
        .collect();
    eprintln!(
        "prune: {} leftover topics deleted; dropping {} leftover keyspaces",
        topics.len(),
        keyspaces.len()
    );
    for (i, ks) in keyspaces.iter().enumerate() {
        session
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {ks}"), ())
            .await?;
        if (i + 1) % 50 == 0 {
            eprintln!("prune: {}/{} keyspaces dropped", i + 1, keyspaces.len());
        }
    }
    Ok(Pruned {
        topics: topics.len(),
        keyspaces: keyspaces.len(),
    })
}
