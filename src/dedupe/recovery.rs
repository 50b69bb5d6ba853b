//! Making a partition's local state agree with its committed offset, when it is assigned.
//!
//! - local offset == committed: nothing to do (the common case, a clean restart).
//! - local offset > committed: the group was reset for a replay. The state stays: it is what
//!   makes the replayed events drop as duplicates.
//! - local offset < committed, or none: a crash between the Kafka commit and the state write,
//!   or a lost disk. The partition's edges are restored from its changelog partition, whose
//!   records the committed transactions wrote (read_committed: aborted ones never apply).
//!   Entries merge by op_id, so restoring over existing state is harmless.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use rocksdb::WriteBatch;
use tracing::{info, warn};

use super::state::{decode_version, EdgeStore};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka;

/// How a partition's state was brought in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    UpToDate,
    /// Kept local state ahead of the committed offset (a replay).
    Replay,
    /// Restored this many changelog records.
    Restored(u64),
}

/// Brings partition `partition`'s state to `committed` (the group's committed offset, or
/// `None` when the group has none yet).
pub fn recover_partition(
    settings: &Settings,
    changelog_topic: &str,
    store: &EdgeStore,
    partition: i32,
    committed: Option<i64>,
) -> Result<Recovery> {
    let local = store.offset(partition)?;
    let committed_or_zero = committed.unwrap_or(0);
    match local {
        Some(l) if l == committed_or_zero => return Ok(Recovery::UpToDate),
        Some(l) if l > committed_or_zero => {
            warn!(partition, local = l, committed = committed_or_zero,
                "state is ahead of the committed offset (a replay): keeping it, replayed events will drop as duplicates");
            store.commit([], [(partition, committed_or_zero)])?;
            return Ok(Recovery::Replay);
        }
        _ => {}
    }
    let started = Instant::now();
    let restored = restore_from_changelog(settings, changelog_topic, store, partition)?;
    store.commit([], [(partition, committed_or_zero)])?;
    info!(partition, restored, local = ?local, committed = committed_or_zero,
        elapsed_ms = started.elapsed().as_millis() as u64, "state restored from the changelog");
    Ok(Recovery::Restored(restored))
}

fn restore_from_changelog(
    settings: &Settings,
    topic: &str,
    store: &EdgeStore,
    partition: i32,
) -> Result<u64> {
    let consumer: BaseConsumer = kafka::client_config(&settings.kafka)
        .set(
            "group.id",
            format!("likes-restore-{}", settings.instance_id()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    let timeout = settings.kafka.request_timeout;
    let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
    if high <= low {
        return Ok(0);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;

    let mut restored = 0u64;
    let mut batch = WriteBatch::default();
    let limit = timeout.max(Duration::from_secs(60)) * 10;
    let deadline = Instant::now() + limit;
    loop {
        if Instant::now() > deadline {
            return Err(Error::Timeout(
                limit,
                format!("restoring {topic}/{partition}"),
            ));
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => continue,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                if let (Some(k), Some(v)) = (m.key(), m.payload()) {
                    if let Some(version) = decode_version(v) {
                        store.merge_restored(&mut batch, k, &version)?;
                        restored += 1;
                    }
                }
                if batch.len() >= 10_000 {
                    store.write(std::mem::take(&mut batch))?;
                }
            }
        }
    }
    store.write(batch)?;
    Ok(restored)
}
