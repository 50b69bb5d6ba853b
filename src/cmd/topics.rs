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
                return Err(other_partition_count(name, have, spec.partitions));
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
    let wanted_all: Vec<BTreeMap<String, String>> = names
        .iter()
        .map(|(_, spec)| wanted_configs(spec, settings.kafka.replication_factor))
        .collect();
    for ((name, spec), wanted) in names.iter().zip(&wanted_all) {
        if !existing.contains_key(name) {
            let mut t = NewTopic::new(
                name,
                spec.partitions,
                TopicReplication::Fixed(settings.kafka.replication_factor),
            );
            for (k, v) in wanted {
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
                // The metadata read above did not list it: a broker's metadata lags a
                // create, or another `likes topics` won the race. Its partition count is
                // checked like an existing topic's (before, it was taken as created as asked);
                // the config check below covers the rest.
                Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    let want = names
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, s)| s.partitions)
                        .unwrap_or_default();
                    let have = partitions_of(&admin, &name, timeout).await?;
                    if have != want {
                        return Err(other_partition_count(name, have, want));
                    }
                }
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
        let wanted = wanted_configs(spec, settings.kafka.replication_factor);
        let (changes, overrides) = config_drift(&admin, &opts, name, &wanted).await?;
        if changes.is_empty() {
            report.topics.insert(name.clone(), TopicAction::Unchanged);
            continue;
        }
        // AlterConfigs (the only form this client offers) replaces a topic's whole set of
        // overrides; sending every override the topic has, with ours changed, touches only
        // the configs topology/ names and keeps an operator's others.
        let mut merged = overrides;
        merged.extend(wanted);
        let mut alter = AlterConfig::new(ResourceSpecifier::Topic(name));
        for (k, v) in &merged {
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

fn other_partition_count(topic: String, have: i32, want: i32) -> Error {
    Error::Topic {
        topic,
        reason: format!(
            "exists with {have} partitions but topology/ says {want}; refusing to change it \
             (keys would move to other partitions, breaking per-key order and dedupe state). \
             Fix topology/ or create a new topic and migrate to it"
        ),
    }
}

/// The partition count of `topic`, which the cluster says exists: read until the broker's
/// metadata lists it (it may lag the create that made it), up to `timeout`.
async fn partitions_of(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> Result<i32> {
    let until = std::time::Instant::now() + timeout;
    loop {
        let metadata =
            tokio::task::block_in_place(|| admin.inner().fetch_metadata(Some(topic), timeout))?;
        let listed = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len() as i32)
            .filter(|&n| n > 0);
        match listed {
            Some(n) => return Ok(n),
            None if std::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            None => {
                let reason = format!("exists, but the broker did not list it within {timeout:?}");
                return Err(Error::Topic {
                    topic: topic.to_string(),
                    reason,
                });
            }
        }
    }
}

/// Partition count of every topic on the cluster.
fn existing_partitions(
    admin: &AdminClient<DefaultClientContext>,
    timeout: Duration,
) -> Result<BTreeMap<String, i32>> {
    // Fault-test hook: a metadata read that does not list topics that exist (a lagging
    // broker's, or one read just before another `likes topics` created them).
    fail::fail_point!("topics-stale-metadata", |_| Ok(BTreeMap::new()));
    // librdkafka's metadata call blocks; keep it off the async worker's hot path.
    let metadata = tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, timeout))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect())
}

/// The configs `likes topics` sets on a topic: the spec's, and the durable settings that
/// follow the replication factor. With RF >= 3, `min.insync.replicas = RF - 1`: an
/// acknowledged record (acks=all) is then on at least two disks, and one broker may be
/// down without stopping writes. Below 3 the broker's setting stays.
pub fn wanted_configs(
    spec: &crate::topology::TopicSpec,
    replication_factor: i32,
) -> BTreeMap<String, String> {
    let mut c = spec.config.clone();
    if replication_factor >= 3 {
        c.insert(
            "min.insync.replicas".into(),
            (replication_factor - 1).to_string(),
        );
    }
    c
}

/// Drift of a topic's configs: the wanted configs whose value on the cluster differs (key,
/// cluster value, wanted value), and every override the topic has now (to keep).
type Drift = (
    Vec<(String, Option<String>, String)>,
    BTreeMap<String, String>,
);

async fn config_drift(
    admin: &AdminClient<DefaultClientContext>,
    opts: &AdminOptions,
    topic: &str,
    wanted: &BTreeMap<String, String>,
) -> Result<Drift> {
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
    let overrides = resource
        .entries
        .iter()
        .filter(|e| e.source == rdkafka::admin::ConfigSource::DynamicTopic && !e.is_sensitive)
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    let changes: Vec<(String, Option<String>, String)> = wanted
        .iter()
        .filter_map(|(k, v)| {
            let have = resource.get(k).and_then(|e| e.value.clone());
            (have.as_deref() != Some(v.as_str())).then(|| (k.clone(), have, v.clone()))
        })
        .collect();
    // A sensitive value is never returned, so it could not be sent back: altering the
    // topic would drop it. Refuse rather than lose an operator's setting.
    if changes.is_empty() {
        return Ok((changes, overrides));
    }
    if let Some(e) = resource
        .entries
        .iter()
        .find(|e| e.source == rdkafka::admin::ConfigSource::DynamicTopic && e.is_sensitive)
    {
        return Err(Error::Topic {
            topic: topic.into(),
            reason: format!(
                "has the sensitive override {} that cannot be read back, so changing its configs would drop it; set {:?} by hand",
                e.name,
                wanted.keys().collect::<Vec<_>>()
            ),
        });
    }
    Ok((changes, overrides))
}

#[cfg(test)]
mod durable_tests {
    use super::wanted_configs;

    #[test]
    fn min_insync_follows_the_replication_factor() {
        let t = crate::topology::Topology::load(None).unwrap();
        for (_, spec) in t.topics() {
            assert_eq!(
                wanted_configs(spec, 3)
                    .get("min.insync.replicas")
                    .map(String::as_str),
                Some("2"),
                "{}",
                spec.name
            );
            assert_eq!(
                wanted_configs(spec, 5)
                    .get("min.insync.replicas")
                    .map(String::as_str),
                Some("4")
            );
            assert_eq!(wanted_configs(spec, 1).get("min.insync.replicas"), None);
        }
    }
}
