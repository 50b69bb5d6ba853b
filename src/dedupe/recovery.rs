//! Making a partition's local state agree with its committed position, when it is assigned.
//!
//! Every stage-1 transaction commits, with the input offsets, a metadata string on each
//! offset (`emitted=<E>;txn=<token>`, kafka/group.rs) and a marker record on the partition's changelog
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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use rocksdb::WriteBatch;
use tracing::{info, warn};

use super::state::{decode_version, EdgeStore, PartitionMark, EMITTED_KEY};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka::group::DedupeOffset;
use crate::kafka::{self, offsets, LogContext};

/// How a partition's state was brought in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    UpToDate,
    /// Rebuilt from the changelog: this many records read.
    Restored(u64),
}

/// Brings partition `partition`'s state to its committed position; returns how, and the
/// partition's mark (whose `emitted` says where emitting resumes).
pub fn recover_partition(
    settings: &Settings,
    changelog_topic: &str,
    store: &EdgeStore,
    partition: i32,
    committed: &DedupeOffset,
) -> Result<(Recovery, PartitionMark)> {
    let mut v = recover_partitions(
        settings,
        changelog_topic,
        store,
        &[(partition, committed.clone())],
        // Nobody watches a single partition's restore.
        &crate::runtime::health::Health::new("dedupe", Duration::MAX),
    )?;
    let (_, r, mark) = v.pop().expect("one partition in, one out");
    Ok((r, mark))
}

/// [`recover_partition`] for every partition of one assignment: those to rebuild are read
/// from the changelog together, by one consumer, so a restore takes as long as the data
/// does, not as many round trips as there are partitions.
pub fn recover_partitions(
    settings: &Settings,
    changelog_topic: &str,
    store: &EdgeStore,
    partitions: &[(i32, DedupeOffset)],
    health: &crate::runtime::health::Health,
) -> Result<Vec<(i32, Recovery, PartitionMark)>> {
    let mut out = Vec::new();
    let mut rebuild = Vec::new();
    for (p, committed) in partitions {
        let local = store.mark(*p)?;
        let at = committed.offset.unwrap_or(0);
        match (&local, &committed.token) {
            (Some(l), Some(token)) if l.offset == at && &l.token == token => {
                let mark = PartitionMark {
                    emitted: l.emitted.max(committed.emitted.unwrap_or(0)),
                    ..l.clone()
                };
                out.push((*p, Recovery::UpToDate, mark));
            }
            // A replay reset moved the position away from the transaction the local state
            // holds: the input rewinds, the history does not, so the state stays exact
            // (issue 23, item 5: a reset no longer forces a full rebuild).
            (Some(l), Some(token)) if committed.was.as_ref() == Some(&l.token) => {
                let mark = PartitionMark {
                    offset: at,
                    emitted: l.emitted.max(committed.emitted.unwrap_or(0)),
                    token: token.clone(),
                };
                store.commit([], [(*p, &mark)])?;
                info!(partition = p, local = ?l, committed = at, "local state kept across a replay reset");
                out.push((*p, Recovery::UpToDate, mark));
            }
            _ => rebuild.push((*p, committed, local)),
        }
    }
    if rebuild.is_empty() {
        return Ok(out);
    }
    let started = Instant::now();
    let wants: Vec<(i32, Option<i64>)> = rebuild.iter().map(|(p, c, _)| (*p, c.emitted)).collect();
    let read = restore_from_changelog(settings, changelog_topic, store, &wants, health)?;
    for (p, committed, local) in rebuild {
        let (restored, marker) = read.get(&p).copied().unwrap_or((0, None));
        let mark = PartitionMark {
            offset: committed.offset.unwrap_or(0),
            emitted: committed.emitted.unwrap_or(0).max(marker.unwrap_or(0)),
            token: committed.token.clone().unwrap_or_default(),
        };
        store.commit([], [(p, &mark)])?;
        info!(partition = p, restored, local = ?local, committed = mark.offset, emitted = mark.emitted,
            elapsed_ms = started.elapsed().as_millis() as u64, "state restored from the changelog");
        out.push((p, Recovery::Restored(restored), mark));
    }
    Ok(out)
}

/// One changelog partition being read.
#[derive(Default)]
struct Progress {
    restored: u64,
    marker: Option<i64>,
    /// The next changelog offset to merge (None: nothing read yet in this restore).
    next: Option<i64>,
    want: Option<i64>,
    at_end_since: Option<Instant>,
    done: bool,
}

/// Reads the partitions' changelog into the store, from where an earlier restore of this
/// store got to (its position is written with the records it covers, and made durable every
/// [`FLUSH_EVERY`] records: a restore killed midway resumes there instead of at offset 0);
/// returns per partition the records read and the highest emitted-up-to marker seen. A
/// partition is read past its first end until a marker of at least its wanted offset is in
/// (bounded: a transaction still open on the changelog resolves within the transaction
/// timeout).
fn restore_from_changelog(
    settings: &Settings,
    topic: &str,
    store: &EdgeStore,
    wants: &[(i32, Option<i64>)],
    health: &crate::runtime::health::Health,
) -> Result<HashMap<i32, (u64, Option<i64>)>> {
    let consumer: BaseConsumer<LogContext> = kafka::client_config(&settings.kafka)
        .set(
            "group.id",
            format!("likes-restore-{}", settings.instance_id()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // The end of a small partition is reached in one fetch; do not let the broker hold
        // each fetch for the default 500 ms waiting for more.
        .set("fetch.wait.max.ms", "10")
        .create_with_context(LogContext)?;
    // Watermarks as a read_uncommitted client sees them: the restoring consumer's own
    // (read_committed) would stop at an open transaction and call the partition empty.
    let probe: BaseConsumer<LogContext> = kafka::client_config(&settings.kafka)
        .set("isolation.level", "read_uncommitted")
        .create_with_context(LogContext)?;
    let timeout = settings.kafka.request_timeout;
    let mut progress: HashMap<i32, Progress> = HashMap::new();
    let mut starts = Vec::new();
    for &(p, want) in wants {
        let offsets::Extent { low, high, .. } = offsets::extent(&probe, topic, p, timeout)?;
        let mut from = store.restored(p)?;
        if from.is_some_and(|r| r.next > high) {
            // Past this changelog's end: the position is of a topic since recreated.
            warn!(
                partition = p,
                ?from,
                high,
                "restore position past the changelog's end; restoring from its start"
            );
            store.forget_restored(p)?;
            from = None;
        }
        let marker = from.and_then(|r| r.marker);
        // An empty partition holds no records and no open transaction either; one merged up
        // to its end with the wanted marker in has nothing left to give.
        let merged = from.is_some_and(|r| r.next >= high)
            && want.is_none_or(|w| marker.is_some_and(|m| m >= w));
        let done = high <= low || merged;
        if !done {
            let start = match from {
                Some(r) if r.next > low => offsets::Start::Offset(r.next),
                _ => offsets::Start::Beginning,
            };
            info!(
                partition = p,
                ?start,
                low,
                high,
                "restoring from the changelog"
            );
            starts.push((p, start));
        }
        progress.insert(
            p,
            Progress {
                want,
                done,
                marker,
                ..Default::default()
            },
        );
    }
    if !starts.is_empty() {
        offsets::assign(&consumer, topic, &starts)?;
    }

    let mut batch = WriteBatch::default();
    let mut unflushed = 0u64;
    // The bound is on a stall, not on the restore: a changelog of millions of records takes
    // as long as it takes while records keep coming.
    let limit = timeout.max(Duration::from_secs(60)) * 10;
    let mut last_progress = Instant::now();
    // Past the first end, how long to wait for the marker the committed offset promises.
    let patience = settings.dedupe.transaction_timeout + Duration::from_secs(2);
    loop {
        if last_progress.elapsed() > limit {
            return Err(Error::Timeout(
                limit,
                format!("restoring {topic}: no record for that long"),
            ));
        }
        for (p, pr) in progress.iter_mut().filter(|(_, pr)| !pr.done) {
            let Some(since) = pr.at_end_since else {
                continue;
            };
            if pr.want.is_none_or(|w| pr.marker.is_some_and(|m| m >= w)) {
                pr.done = true;
            } else if since.elapsed() > patience && pr.marker.is_none() {
                warn!(partition = p, want_emitted = pr.want,
                    "the changelog holds no marker at all (written by an older version, or after an outside reset); restoring what it holds");
                pr.done = true;
            } else if since.elapsed() > patience * 3 {
                // An older marker is there, the committed transaction's is not: its records
                // are late, not absent. Going ahead would lose its state changes (issue 23,
                // item 5); this incarnation ends and the next restores again.
                return Err(Error::Timeout(
                    patience * 3,
                    format!(
                        "restoring {topic} partition {p}: the committed transaction's marker (emitted {:?}) is not visible, only an older one ({:?}); restarting the restore",
                        pr.want, pr.marker
                    ),
                ));
            }
        }
        if progress.values().all(|pr| pr.done) {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                if let Some(pr) = progress.get_mut(&p) {
                    pr.at_end_since.get_or_insert_with(Instant::now);
                }
                // A partition read to its end: its position is worth recording now.
                write_batch(store, &mut batch, &progress, &mut unflushed)?;
            }
            Some(Err(e)) => {
                // A broker restarting mid-restore: the deadline bounds the wait.
                let e = Error::from(e);
                if !e.is_retryable() {
                    return Err(e);
                }
                warn!(error = %e, "restoring the changelog: waiting for the broker");
            }
            Some(Ok(m)) => {
                // A long restore is progress, not a stall.
                health.beat();
                last_progress = Instant::now();
                let Some(pr) = progress.get_mut(&m.partition()) else {
                    continue;
                };
                pr.next = Some(m.offset() + 1);
                match (m.key(), m.payload()) {
                    (Some(EMITTED_KEY), Some(v)) => {
                        if let Ok(b) = <[u8; 8]>::try_from(v) {
                            let e = i64::from_be_bytes(b);
                            pr.marker = Some(pr.marker.map_or(e, |m| m.max(e)));
                        }
                    }
                    (Some(k), Some(v)) => {
                        if let Some(version) = decode_version(v) {
                            store.merge_restored(&mut batch, k, &version)?;
                            pr.restored += 1;
                        }
                    }
                    _ => {}
                }
                if batch.len() >= 10_000 {
                    write_batch(store, &mut batch, &progress, &mut unflushed)?;
                }
            }
        }
    }
    checkpoint(store, &mut batch, &progress);
    store.write(batch)?;
    Ok(progress
        .into_iter()
        .map(|(p, pr)| (p, (pr.restored, pr.marker)))
        .collect())
}

/// Records merged between two flushes of a restore: a lost machine loses at most this many.
const FLUSH_EVERY: u64 = 500_000;

/// Writes the records merged so far with each partition's position, flushing every
/// [`FLUSH_EVERY`] records: the WAL (not synced) keeps the batches through a killed process,
/// and a flush keeps the position (and the records it covers) through a lost machine too.
fn write_batch(
    store: &EdgeStore,
    batch: &mut WriteBatch,
    progress: &HashMap<i32, Progress>,
    unflushed: &mut u64,
) -> Result<()> {
    *unflushed += batch.len() as u64;
    checkpoint(store, batch, progress);
    store.write(std::mem::take(batch))?;
    if *unflushed >= FLUSH_EVERY {
        store.flush()?;
        *unflushed = 0;
    }
    // Fault-test hook: a kill right after a flush, midway through.
    fail::fail_point!("dedupe-restore-after-batch", |_| {
        store.flush()?;
        Err(Error::Injected("dedupe-restore-after-batch"))
    });
    Ok(())
}

/// Adds each partition's restore position to the batch holding the records before it.
fn checkpoint(store: &EdgeStore, batch: &mut WriteBatch, progress: &HashMap<i32, Progress>) {
    for (&p, pr) in progress {
        if let Some(next) = pr.next {
            store.put_restored(
                batch,
                p,
                super::state::Restored {
                    next,
                    marker: pr.marker,
                },
            );
        }
    }
}
