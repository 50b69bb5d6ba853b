//! `likes replay`: resets a stage's consumer group to the start of its input, or to a time.
//!
//! Safe by construction: stage 1's dedupe state drops every replayed event it has seen, and
//! stage 2's fence skips every window already applied, so counts do not move. It refuses
//! while the group has live members (their next commit would undo the reset), relying on
//! the broker, which rejects a commit from outside a non-empty group.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka;
use crate::topology::Topology;

/// Where to reset to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Earliest,
    /// The first record at or after this time, Unix ms.
    Time(i64),
}

/// Per partition: (partition, new offset).
#[derive(Debug)]
pub struct ReplayReport {
    pub group: String,
    pub topic: String,
    pub offsets: Vec<(i32, i64)>,
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (p, o) in &self.offsets {
            writeln!(f, "group {} {}/{p}: offset {o}", self.group, self.topic)?;
        }
        write!(
            f,
            "reset {} partitions; start the stage again to replay",
            self.offsets.len()
        )
    }
}

/// Resets `group` (a stage group name as it exists on the cluster, with the prefix).
pub fn run(
    settings: &Settings,
    topology: &Topology,
    group: &str,
    target: Target,
) -> Result<ReplayReport> {
    let prefix = &settings.kafka.topic_prefix;
    let dedupe = format!("{prefix}{}", topology.groups.dedupe);
    let count = format!("{prefix}{}", topology.groups.count);
    let (topic, is_count) = if group == dedupe {
        (settings.topic(&topology.topics.events.name), false)
    } else if group == count {
        (settings.topic(&topology.topics.deltas.name), true)
    } else {
        return Err(Error::Config(format!(
            "unknown group {group:?}: the stage groups are {dedupe:?} and {count:?}"
        )));
    };
    let timeout = settings.kafka.request_timeout;
    let consumer: BaseConsumer = kafka::client_config(&settings.kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(&topic), timeout)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(Error::Topic {
            topic,
            reason: "does not exist (run `likes topics`)".into(),
        });
    }

    let mut offsets = Vec::new();
    for &p in &partitions {
        let (low, high) = consumer.fetch_watermarks(&topic, p, timeout)?;
        let offset = match target {
            Target::Earliest => low,
            Target::Time(ms) => {
                let mut q = TopicPartitionList::new();
                q.add_partition_offset(&topic, p, Offset::Offset(ms))?;
                let found = consumer.offsets_for_times(q, timeout)?;
                match found.find_partition(&topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => high, // nothing at or after that time
                }
            }
        };
        offsets.push((p, offset));
    }
    refuse_skips(&consumer, group, &topic, &offsets, timeout)?;

    let mut tpl = TopicPartitionList::new();
    for &(p, o) in &offsets {
        tpl.add_partition_offset(&topic, p, Offset::Offset(o))?;
        if is_count {
            // Stage 2 restarts its window clock from the records themselves.
            if let Some(mut e) = tpl.find_partition(&topic, p) {
                e.set_metadata(crate::count::clock_metadata(0));
            }
        }
    }
    // Stages are static members: a stopped (or killed) one stays in the group until its
    // session times out, so wait that long for the group to empty before refusing.
    let patience = settings.kafka.session_timeout + Duration::from_secs(5);
    let started = std::time::Instant::now();
    loop {
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => break,
            Err(e) if started.elapsed() < patience => {
                info!(%group, error = %e, "group still has members; waiting for it to empty");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                return Err(Error::Config(format!(
                    "group {group} refused the reset ({e}): it has live members. Stop every \
                     process of the stage first; a stopped or killed member leaves the group \
                     after kafka.session_timeout ({:?})",
                    settings.kafka.session_timeout
                )))
            }
        }
    }
    info!(%group, %topic, partitions = offsets.len(), ?target, "group offsets reset");
    // Give the broker a moment so a stage started right after sees the new offsets.
    std::thread::sleep(Duration::from_millis(100));
    Ok(ReplayReport {
        group: group.to_string(),
        topic,
        offsets,
    })
}

/// A replay only moves a group back. Moving it past its committed offset would skip records
/// the stage never read: likes that would never be counted.
fn refuse_skips(
    consumer: &BaseConsumer,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64)],
    timeout: Duration,
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for &(p, _) in offsets {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    let skips: Vec<String> = offsets
        .iter()
        .filter_map(|&(p, to)| {
            let at = match committed.find_partition(topic, p)?.offset() {
                Offset::Offset(o) => o,
                // Never committed: the stage starts from the earliest record.
                _ => 0,
            };
            (to > at).then(|| format!("{topic}/{p}: {} records ({at}..{to})", to - at))
        })
        .collect();
    if skips.is_empty() {
        return Ok(());
    }
    Err(Error::Config(format!(
        "refusing to move group {group} forward past records it has not read; a replay only \
         moves back (pick an earlier --to-time). Would skip: {}",
        skips.join(", ")
    )))
}

/// Parses `--to-time`: Unix milliseconds or RFC 3339 (`2026-11-29T12:00:00Z`).
pub fn parse_time(s: &str) -> Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
        .map_err(|e| Error::Config(format!("--to-time {s:?}: {e} (use Unix ms or RFC 3339)")))
        .map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_parse() {
        assert_eq!(
            super::parse_time("1700000000000").unwrap(),
            1_700_000_000_000
        );
        assert_eq!(
            super::parse_time("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        assert!(super::parse_time("yesterday").is_err());
    }
}
