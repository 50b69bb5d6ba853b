//! Making a partition's local state agree with its committed position, when it is assigned.
//!
//! Every stage-1 transaction commits, with the input offsets, a metadata string on each
//! offset (`emitted=<E>;txn=<token>`) and a marker record on the partition's changelog
//! (`x` → E): E is the offset below which deltas were emitted for that partition, by any
//! instance; the token names the transaction. After the Kafka commit the same (offset, E,
//! token) reaches RocksDB with the state.
//!
//! - The local mark names the committed transaction and offset: local state is exactly the
//!   changelog at the committed position; keep it.
//! - Anything else (a crash between the commit and the state write, a lost disk, another
//!   instance owned the partition meanwhile, a replay reset the group): rebuild the
//!   partition from its changelog, whose records only committed transactions wrote
//!   (read_committed), merged by op_id, up to a known end: a changelog marker at least the
//!   committed E, so the last transaction's records are in even if its marker on the
//!   changelog became visible after the offset commit did.
//!
//! Input below E then re-derives state without emitting: a replay rewinds the input, never
//! the history.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use rocksdb::WriteBatch;
use tracing::{info, warn};

use super::state::{decode_version, EdgeStore, PartitionMark, EMITTED_KEY};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka;

/// How a partition's state was brought in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    UpToDate,
    /// Rebuilt from the changelog: this many records read.
    Restored(u64),
}

/// The group's committed position of a partition, as stage 1 wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// None when the group never committed this partition.
    pub offset: Option<i64>,
    /// Deltas were emitted below this offset (None: not recorded, e.g. an outside reset).
    pub emitted: Option<i64>,
    /// The transaction that committed it (None: not a stage-1 commit).
    pub token: Option<String>,
}

/// The metadata stage 1 commits with each input offset.
pub fn offset_metadata(emitted: i64, token: &str) -> String {
    format!("emitted={emitted};txn={token}")
}

impl Committed {
    /// From a committed offset and its metadata.
    pub fn parse(offset: Option<i64>, metadata: &str) -> Self {
        let mut c = Committed {
            offset,
            ..Default::default()
        };
        for part in metadata.split(';') {
            match part.split_once('=') {
                Some(("emitted", v)) => c.emitted = v.parse().ok(),
                Some(("txn", v)) if !v.is_empty() => c.token = Some(v.to_string()),
                _ => {}
            }
        }
        c
    }
}

/// Brings partition `partition`'s state to its committed position; returns how, and the
/// partition's mark (whose `emitted` says where emitting resumes).
pub fn recover_partition(
    settings: &Settings,
    changelog_topic: &str,
    store: &EdgeStore,
    partition: i32,
    committed: &Committed,
) -> Result<(Recovery, PartitionMark)> {
    let local = store.mark(partition)?;
    let at = committed.offset.unwrap_or(0);
    if let (Some(l), Some(token)) = (&local, &committed.token) {
        if l.offset == at && &l.token == token {
            let mark = PartitionMark {
                emitted: l.emitted.max(committed.emitted.unwrap_or(0)),
                ..l.clone()
            };
            return Ok((Recovery::UpToDate, mark));
        }
    }
    let started = Instant::now();
    let (restored, marker) = restore_from_changelog(
        settings,
        changelog_topic,
        store,
        partition,
        committed.emitted,
    )?;
    let mark = PartitionMark {
        offset: at,
        emitted: committed.emitted.unwrap_or(0).max(marker.unwrap_or(0)),
        token: committed.token.clone().unwrap_or_default(),
    };
    store.commit([], [(partition, &mark)])?;
    info!(partition, restored, local = ?local, committed = at, emitted = mark.emitted,
        elapsed_ms = started.elapsed().as_millis() as u64, "state restored from the changelog");
    Ok((Recovery::Restored(restored), mark))
}

/// Reads the partition's changelog from the start into the store; returns the records read
/// and the highest emitted-up-to marker seen. Reads past the first end of the partition
/// until a marker of at least `want_emitted` is in (bounded: a transaction still open on
/// the changelog resolves within the transaction timeout).
fn restore_from_changelog(
    settings: &Settings,
    topic: &str,
    store: &EdgeStore,
    partition: i32,
    want_emitted: Option<i64>,
) -> Result<(u64, Option<i64>)> {
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
    if high <= low && want_emitted.is_none_or(|w| w <= 0) {
        return Ok((0, None));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;

    let mut restored = 0u64;
    let mut marker: Option<i64> = None;
    let mut batch = WriteBatch::default();
    let limit = timeout.max(Duration::from_secs(60)) * 10;
    let deadline = Instant::now() + limit;
    // Past the first end, how long to wait for the marker the committed offset promises.
    let patience = settings.dedupe.transaction_timeout + timeout;
    let mut at_end_since: Option<Instant> = None;
    loop {
        if Instant::now() > deadline {
            return Err(Error::Timeout(
                limit,
                format!("restoring {topic}/{partition}"),
            ));
        }
        let complete = want_emitted.is_none_or(|w| marker.is_some_and(|m| m >= w));
        if let Some(since) = at_end_since {
            if complete {
                break;
            }
            if since.elapsed() > patience {
                warn!(partition, want_emitted, seen = marker,
                    "the changelog holds no marker as recent as the committed offset names (written by an older version, or by an outside reset); restoring what it holds");
                break;
            }
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                at_end_since.get_or_insert_with(Instant::now);
            }
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                match (m.key(), m.payload()) {
                    (Some(EMITTED_KEY), Some(v)) => {
                        if let Ok(b) = <[u8; 8]>::try_from(v) {
                            let e = i64::from_be_bytes(b);
                            marker = Some(marker.map_or(e, |m| m.max(e)));
                        }
                    }
                    (Some(k), Some(v)) => {
                        if let Some(version) = decode_version(v) {
                            store.merge_restored(&mut batch, k, &version)?;
                            restored += 1;
                        }
                    }
                    _ => {}
                }
                if batch.len() >= 10_000 {
                    store.write(std::mem::take(&mut batch))?;
                }
            }
        }
    }
    store.write(batch)?;
    Ok((restored, marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_metadata_round_trips_and_tolerates_strangers() {
        let c = Committed::parse(Some(7), &offset_metadata(42, "abc"));
        assert_eq!(c.emitted, Some(42));
        assert_eq!(c.token.as_deref(), Some("abc"));
        let outside = Committed::parse(Some(0), "");
        assert_eq!((outside.emitted, outside.token), (None, None));
        let old = Committed::parse(Some(3), "clock=5");
        assert_eq!((old.emitted, old.token), (None, None));
    }
}
