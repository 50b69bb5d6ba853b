//! A chaos run on the replicated stack (`make up-cluster`, stack/cluster.sh): three brokers and
//! three Cassandra nodes on loopback addresses of their own, and the faults only such a stack
//! can take: a partition leader's broker killed mid-transaction, one Cassandra node of three
//! killed under the LWTs, a process cut off from every node, a process frozen, a clock off.
//!
//! A partition drops packets (nftables, table `likes_chaos`), it does not kill: the process
//! keeps running and its connections stall. Every process of the run has a group id of its own
//! (its user stays root: it reads what the tool's files are), so a rule matches one process's
//! packets (`meta skgid`) on the loopback the nodes share — the way Jepsen cuts links with
//! iptables. (A network namespace per process, the other way, cannot reach nodes bound to
//! loopback addresses.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use likes::config::Settings;
use likes::topology::Topology;

/// The brokers' and the Cassandra nodes' addresses (stack/cluster.sh).
pub const BROKERS: &str = "127.0.1.1:9092,127.0.1.2:9092,127.0.1.3:9092";
pub const CQL_NODES: [&str; 3] = ["127.0.2.1:9042", "127.0.2.2:9042", "127.0.2.3:9042"];
const NODE_NETS: &str = "{ 127.0.1.0/24, 127.0.2.0/24 }";
const TABLE: &str = "likes_chaos";

/// The group id a run's process runs with: one per process name, above the system's range.
pub fn gid_of(process: &str) -> u32 {
    let names = ["api", "api-2", "api-3", "dedupe", "dedupe-2", "count"];
    64_100
        + names
            .iter()
            .position(|n| *n == process)
            .unwrap_or(names.len()) as u32
}

/// The settings of a run on the replicated stack: its nodes, three replicas of everything,
/// and a clock bound wide enough for the skews (the relay's margin widened to match, as
/// `Settings::validate` requires).
pub fn settings(mut s: Settings, max_skew: Duration) -> Settings {
    s.kafka.brokers = BROKERS.to_string();
    s.kafka.replication_factor = 3;
    s.cql.nodes = CQL_NODES.iter().map(|n| n.to_string()).collect();
    s.cql.replication.factor = 3;
    s.cql.max_clock_skew = max_skew;
    s.api.relay_min_age = s
        .api
        .relay_min_age
        .max(s.api.write_deadline + s.cql.request_timeout + max_skew * 2 + Duration::from_secs(1));
    s
}

/// The same, for the processes' environment.
pub fn env(s: &Settings) -> Vec<(String, String)> {
    let nodes = s
        .cql
        .nodes
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        ("LIKES__KAFKA__BROKERS".into(), s.kafka.brokers.clone()),
        ("LIKES__KAFKA__REPLICATION_FACTOR".into(), "3".into()),
        ("LIKES__CQL__NODES".into(), format!("[{nodes}]")),
        ("LIKES__CQL__REPLICATION__FACTOR".into(), "3".into()),
        (
            "LIKES__CQL__MAX_CLOCK_SKEW".into(),
            format!("{}ms", s.cql.max_clock_skew.as_millis()),
        ),
        (
            "LIKES__API__RELAY_MIN_AGE".into(),
            format!("{}ms", s.api.relay_min_age.as_millis()),
        ),
        // Admission at its fixed bound: six JVMs and the run on two cores put the LWTs' p99
        // past the 150 ms target from the first second, and the adaptive bound shed half the
        // writes at 40/s (seen: 1,666 of 3,415 `overloaded`), leaving less history to check.
        // The run is about what faults do to answers, not about the latency goal.
        ("LIKES__API__WRITE_LATENCY_TARGET".into(), "0s".into()),
    ]
}

/// The environment that runs a process `by_s` seconds off: the product's one clock
/// (`likes::runtime::clock`, which every event time, outbox age, window, asOf and the clock
/// bound read) moved by that much from its start, in fail-point builds. Not libfaketime: it
/// deadlocks the process at its first allocation (seen: `likes --version` hung under
/// LD_PRELOAD=libfaketime, gdb showed jemalloc's init_lock held), so the skew lives in-process.
pub fn skew_env(by_s: i64) -> Vec<(&'static str, String)> {
    vec![("LIKES_TEST_CLOCK_SKEW_MS", (by_s * 1000).to_string())]
}

/// What a run on the replicated stack needs of the machine, checked before it starts.
pub fn preflight() -> Result<()> {
    nft(&format!("add table inet {TABLE}"))
        .context("the partition faults need nftables as root (`make prereqs` installs nft)")?;
    heal()?;
    Ok(())
}

/// Drops every packet `process` sends to a node until [`heal`].
pub fn partition(process: &str) -> Result<()> {
    nft(&format!(
        "add rule inet {TABLE} out meta skgid {} ip daddr {NODE_NETS} drop comment \"{process}\"",
        gid_of(process)
    ))
}

/// Drops every packet to or from `node`'s address (but its own to itself) until [`heal`].
pub fn isolate(node: &str) -> Result<()> {
    let address = address_of(node)?;
    nft(&format!(
        "add rule inet {TABLE} out ip saddr {address} ip daddr != {address} drop comment \"{node}\"; \
         add rule inet {TABLE} out ip daddr {address} ip saddr != {address} drop comment \"{node}\""
    ))
}

/// A node's loopback address (stack/cluster.sh).
fn address_of(node: &str) -> Result<String> {
    let k = node
        .rsplit('-')
        .next()
        .and_then(|k| k.parse::<u8>().ok())
        .filter(|k| (1..=3).contains(k));
    match (
        node.starts_with("cluster-kafka-"),
        node.starts_with("cluster-cassandra-"),
        k,
    ) {
        (true, _, Some(k)) => Ok(format!("127.0.1.{k}")),
        (_, true, Some(k)) => Ok(format!("127.0.2.{k}")),
        _ => Err(anyhow!("no node {node} in the replicated stack")),
    }
}

/// Removes every partition rule.
pub fn heal() -> Result<()> {
    nft(&format!(
        "delete table inet {TABLE}; add table inet {TABLE}; add chain inet {TABLE} out {{ type filter hook output priority 0; }}"
    ))
}

/// Removes the table at the end of a run.
pub fn teardown() {
    let _ = nft(&format!("delete table inet {TABLE}"));
}

fn nft(script: &str) -> Result<()> {
    let out = Command::new("nft")
        .arg(script)
        .output()
        .map_err(|e| anyhow!("nft: {e}"))?;
    if !out.status.success() {
        return Err(anyhow!(
            "nft {script}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The broker (1-3) leading most partitions of the run's events and deltas topics.
pub fn busiest_leader(settings: &Settings, topology: &Topology) -> Result<i32> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.brokers)
        .create()
        .map_err(|e| anyhow!("metadata client: {e}"))?;
    let mut led: HashMap<i32, usize> = HashMap::new();
    for topic in [&topology.topics.events.name, &topology.topics.deltas.name] {
        let name = settings.topic(topic);
        let md = consumer
            .fetch_metadata(Some(&name), Duration::from_secs(10))
            .map_err(|e| anyhow!("metadata of {name}: {e}"))?;
        for t in md.topics() {
            for p in t.partitions() {
                if p.leader() >= 0 {
                    *led.entry(p.leader()).or_default() += 1;
                }
            }
        }
    }
    led.into_iter()
        .max_by_key(|(id, n)| (*n, -id))
        .map(|(id, _)| id)
        .ok_or_else(|| anyhow!("no partition of the run's topics has a leader"))
}

/// The cluster's script (stack/cluster.sh beside the given stack script).
pub fn script(stack_script: &Path) -> PathBuf {
    stack_script.with_file_name("cluster.sh")
}
