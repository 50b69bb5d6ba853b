//! `likes topics`: creates the topics of `topology/` with their partition counts and configs.
//!
//! Idempotent: existing topics with the right partition count are left alone, or get their
//! configs brought in line with the spec. It refuses to change the partition count of an
//! existing topic: that would move keys to other partitions and break per-key order, dedupe
//! locality and the windows of the count stage. The check runs for every topic before any
//! change, so a refusal changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka;
use crate::topology::Topology;

/// What happened to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicAction {
    Created {
        partitions: i32,
    },
    Unchanged,
    /// Configs set to the spec's values: (key, old value, new value).
    ConfigUpdated(Vec<(String, Option<String>, String)>),
}

/// The outcome for every topic of the topology, by cluster name.
#[derive(Debug, Default)]
pub struct TopicsReport {
    pub topics: BTreeMap<String, TopicAction>,
}

impl TopicsReport {
    /// True when the run changed nothing.
    pub fn is_noop(&self) -> bool {
        self.topics.values().all(|a| *a == TopicAction::Unchanged)
    }
}

impl std::fmt::Display for TopicsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, action) in &self.topics {
            match action {
                TopicAction::Created { partitions } => {
                    writeln!(f, "topic {name}: created ({partitions} partitions)")?
                }
                TopicAction::Unchanged => writeln!(f, "topic {name}: unchanged")?,
                TopicAction::ConfigUpdated(changes) => {
                    for (k, old, new) in changes {
                        writeln!(f, "topic {name}: config {k}: {old:?} -> {new:?}")?;
                    }
                }
            }
        }
        if self.is_noop() {
            write!(f, "nothing to do")
        } else {
            write!(f, "topics in place")
        }
    }
}

/// Brings the cluster's topics in line with `topology`.
pub async fn run(settings: &Settings, topology: &Topology) -> Result<TopicsReport> {
    let admin = kafka::admin(&settings.kafka)?;
    let timeout = settings.kafka.request_timeout;
    let opts = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));

    let existing = existing_partitions(&admin, timeout)?;

    // Refuse before touching anything.
    for (_, spec) in topology.topics() {
        let name = settings.topic(&spec.name);
        if let Some(&have) = existing.get(&name) {
            if have != spec.partitions {
                return Err(Error::Topic {
                    topic: name,
                    reason: format!(
                        "exists with {have} partitions but topology/ says {}; refusing to change it \
                         (keys would move to other partitions, breaking per-key order and dedupe state). \
                         Fix topology/ or create a new topic and migrate to it",
                        spec.partitions
                    ),
                });
            }
        }
    }

    let mut report = TopicsReport::default();
    let mut to_create = Vec::new();
    let names: Vec<(String, &crate::topology::TopicSpec)> = topology
        .topics()
        .into_iter()
        .map(|(_, spec)| (settings.topic(&spec.name), spec))
        .collect();
    for (name, spec) in &names {
        if !existing.contains_key(name) {
            let mut t = NewTopic::new(
                name,
                spec.partitions,
                TopicReplication::Fixed(settings.kafka.replication_factor),
            );
            for (k, v) in &spec.config {
                t = t.set(k, v);
            }
            to_create.push(t);
        }
    }
    if !to_create.is_empty() {
        for result in admin.create_topics(&to_create, &opts).await? {
            match result {
                Ok(name) => {
                    let partitions = names
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, s)| s.partitions)
                        .unwrap_or_default();
                    info!(topic = %name, partitions, "topic created");
                    report
                        .topics
                        .insert(name, TopicAction::Created { partitions });
                }
                // Another `likes topics` won the race: the config check below covers it.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(Error::Topic {
                        topic: name,
                        reason: format!("create failed: {code}"),
                    })
                }
            }
        }
    }

    for (name, spec) in &names {
        if report.topics.contains_key(name) {
            continue;
        }
        let changes = config_drift(&admin, &opts, name, &spec.config).await?;
        if changes.is_empty() {
            report.topics.insert(name.clone(), TopicAction::Unchanged);
            continue;
        }
        // AlterConfigs (non-incremental) sets exactly the given configs: topology/ is the
        // whole truth about a topic's configs.
        let mut alter = AlterConfig::new(ResourceSpecifier::Topic(name));
        for (k, v) in &spec.config {
            alter = alter.set(k, v);
        }
        for result in admin.alter_configs(&[alter], &opts).await? {
            if let Err((_, code)) = result {
                return Err(Error::Topic {
                    topic: name.clone(),
                    reason: format!("config update failed: {code}"),
                });
            }
        }
        info!(topic = %name, changes = changes.len(), "topic configs updated");
        report
            .topics
            .insert(name.clone(), TopicAction::ConfigUpdated(changes));
    }
    Ok(report)
}

/// Partition count of every topic on the cluster.
fn existing_partitions(
    admin: &AdminClient<DefaultClientContext>,
    timeout: Duration,
) -> Result<BTreeMap<String, i32>> {
    // librdkafka's metadata call blocks; keep it off the async worker's hot path.
    let metadata = tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, timeout))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect())
}

/// The spec's configs whose value on the cluster differs: (key, cluster value, spec value).
async fn config_drift(
    admin: &AdminClient<DefaultClientContext>,
    opts: &AdminOptions,
    topic: &str,
    wanted: &BTreeMap<String, String>,
) -> Result<Vec<(String, Option<String>, String)>> {
    let results = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], opts)
        .await?;
    let resource = match results.into_iter().next() {
        Some(Ok(r)) => r,
        Some(Err(code)) => {
            return Err(Error::Topic {
                topic: topic.into(),
                reason: format!("describe configs failed: {code}"),
            })
        }
        None => {
            return Err(Error::Topic {
                topic: topic.into(),
                reason: "describe configs returned nothing".into(),
            })
        }
    };
    Ok(wanted
        .iter()
        .filter_map(|(k, v)| {
            let have = resource.get(k).and_then(|e| e.value.clone());
            (have.as_deref() != Some(v.as_str())).then(|| (k.clone(), have, v.clone()))
        })
        .collect())
}
