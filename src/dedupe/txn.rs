//! Stage 1's Kafka transaction: commit (resumed, never aborted, when its outcome is
//! unknown), abort (resumed until it completes), and the timing of a turn's phases.

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use rdkafka::consumer::Consumer;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::warn;

use super::state::{self, PartitionMark, EMITTED_KEY};
use super::{send, Batch, Dedupe};
use crate::error::{Error, Result};
use crate::kafka;
use crate::kafka::group::{self, DedupeOffset};
use crate::records;
use crate::runtime::clock::now_ms;
use crate::runtime::metrics as m;

impl Dedupe {
    pub(super) fn commit(
        &mut self,
        batch: &Batch,
        marks: &BTreeMap<i32, PartitionMark>,
        tick: bool,
    ) -> Result<()> {
        let timeout = self.settings.kafka.request_timeout;
        let mut t = Phases::start();
        self.producer.begin_transaction()?;
        for d in &batch.dead {
            let r = kafka::dead_letter(
                &self.dlq_topic,
                d.key.as_deref(),
                d.payload.as_deref(),
                &d.reason,
                d.kind,
                (&self.input.topic, d.partition, d.offset),
            );
            send(&self.producer, r)?;
            tracing::debug!(partition = d.partition, offset = d.offset, reason = %d.reason, kind = d.kind, "dead letter");
            self.stats.dead_letters += 1;
        }
        // In (item, second) order, as they always went out.
        let mut items: Vec<_> = batch.items.iter().collect();
        items.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for ((item, _second), sum) in items {
            if sum.delta == 0 {
                continue;
            }
            let weight = records::Weight {
                events: u64::from(sum.flips),
                mean_event_time_ms: sum.time_sum_ms / i64::from(sum.flips.max(1)),
            };
            let value = records::delta_value(item, sum.delta, sum.earliest_ms, weight);
            for _ in 0..delta_copies() {
                send(
                    &self.producer,
                    BaseRecord::to(&self.deltas_topic)
                        .key(item.as_bytes())
                        .payload(&value),
                )?;
            }
            self.stats.deltas_out += 1;
            metrics::counter!(m::DELTAS_OUT).increment(1);
        }
        for (key, (version, partition)) in &batch.edges {
            let value = state::encode_version(version);
            send(
                &self.producer,
                BaseRecord::to(&self.changelog_topic)
                    .partition(*partition)
                    .key(key.as_slice())
                    .payload(&value[..]),
            )?;
        }
        if tick {
            let value = records::tick_value(now_ms());
            for p in 0..self.deltas_partitions {
                send(
                    &self.producer,
                    BaseRecord::<[u8], _>::to(&self.deltas_topic)
                        .partition(p)
                        .payload(&value),
                )?;
            }
        }
        t.lap("commit_send");
        // Each partition's emitted-up-to offset travels with its state (the changelog
        // marker) and with its offset (the metadata), in this transaction.
        for (&p, mark) in marks {
            let value = mark.emitted.to_be_bytes();
            send(
                &self.producer,
                BaseRecord::to(&self.changelog_topic)
                    .partition(p)
                    .key(EMITTED_KEY)
                    .payload(&value[..]),
            )?;
        }
        if !batch.offsets.is_empty() {
            let positions: Vec<(i32, i64, String)> = marks
                .iter()
                .map(|(&p, mark)| {
                    let horizon = self
                        .horizons
                        .get(&p)
                        .map(|h| h.settled(now_ms()).to_string())
                        .unwrap_or_default();
                    let meta = DedupeOffset::metadata(mark.emitted, &mark.token, &horizon);
                    (p, mark.offset, meta)
                })
                .collect();
            let meta = self
                .input
                .consumer
                .group_metadata()
                .ok_or_else(|| Error::Config("consumer has no group metadata".into()))?;
            group::send_in_transaction(
                &self.producer,
                &meta,
                &self.input.topic,
                &positions,
                timeout,
            )?;
        }
        // Fault-test hooks at the narrow moments, armed only for batches that carry events.
        if !batch.offsets.is_empty() {
            fail::fail_point!("dedupe-before-commit", |_| Err(Error::Injected(
                "dedupe-before-commit"
            )));
        }
        t.lap("commit_offsets");
        let first = if batch.offsets.is_empty() {
            timeout
        } else {
            first_commit_timeout(timeout)
        };
        self.finish_commit(first, timeout)?;
        t.lap("commit_end");
        if !batch.offsets.is_empty() {
            fail::fail_point!("dedupe-after-commit");
        }
        Ok(())
    }
}

impl Dedupe {
    /// Commits the open transaction. A commit call that returns a retriable error (a timeout,
    /// the coordinator unreachable) leaves the outcome unknown: the coordinator may already
    /// have committed. It is resumed by calling commit again (librdkafka: "this call is
    /// resumable when a retriable timeout error is returned"), never aborted: an abort and a
    /// re-read of the batch would emit its deltas a second time if the first commit landed.
    /// Abortable and fatal errors go back to the caller.
    fn finish_commit(&mut self, first: Duration, timeout: Duration) -> Result<()> {
        use rdkafka::error::KafkaError;
        let started = Instant::now();
        // The client's commit flushes first; flushing here with the full timeout keeps a
        // short first call (the fault test's) for the commit request itself.
        self.producer.flush(timeout)?;
        let mut call = first;
        loop {
            let resumable = match self.producer.commit_transaction(call) {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(e))
                    if e.is_retriable() && !e.txn_requires_abort() && !e.is_fatal() =>
                {
                    e.to_string()
                }
                // The records were not all acknowledged yet: nothing was decided; go on.
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {
                    "flush timed out".to_string()
                }
                Err(e) => return Err(e.into()),
            };
            if self.stop.is_cancelled() {
                // Safe to leave: the state was not written, and whichever way the commit
                // went, the next start recovers from the committed position.
                return Err(Error::Timeout(
                    started.elapsed(),
                    format!("stopping with a transaction's commit outcome unknown ({resumable})"),
                ));
            }
            self.stats.commits_resumed += 1;
            metrics::counter!(m::COMMITS_RESUMED).increment(1);
            warn!(error = %resumable, waited_ms = started.elapsed().as_millis() as u64,
                "the transaction's commit has an unknown outcome; resuming it (an abort could not undo a commit that already landed)");
            call = timeout;
        }
    }
}

impl Dedupe {
    /// Aborts the open transaction. An abort that times out is still under way, and calling
    /// it again resumes it (librdkafka: "this call is resumable"); calling anything else
    /// meanwhile fails with "Conflicting ... API call is already in progress", forever. So
    /// it is called until it completes, for at most the transaction timeout and two request
    /// timeouts (by then the coordinator has aborted the transaction itself); past that, or
    /// on a fatal error, the error ends this incarnation and a new producer fences the old.
    pub(super) fn abort(&mut self) -> Result<()> {
        use rdkafka::error::KafkaError;
        let timeout = self.settings.kafka.request_timeout;
        let limit = self.settings.dedupe.transaction_timeout + timeout * 2;
        let started = Instant::now();
        loop {
            match self.producer.abort_transaction(timeout) {
                Ok(()) => return Ok(()),
                // Another transactional call is still the current one: no abort can finish;
                // a new incarnation's producer fences it instead.
                Err(KafkaError::Transaction(e))
                    if matches!(
                        e.code(),
                        RDKafkaErrorCode::Conflict | RDKafkaErrorCode::PreviousInProgress
                    ) =>
                {
                    return Err(KafkaError::Transaction(e).into())
                }
                Err(KafkaError::Transaction(e))
                    if e.is_retriable()
                        && !e.is_fatal()
                        && started.elapsed() < limit
                        && !self.stop.is_cancelled() =>
                {
                    warn!(error = %e, "the abort is still under way; resuming it");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Times the phases of one loop turn into [`m::TURN_SECONDS`].
pub(super) struct Phases(Instant);

impl Phases {
    pub(super) fn start() -> Self {
        Phases(Instant::now())
    }
    pub(super) fn lap(&mut self, phase: &'static str) {
        let now = Instant::now();
        metrics::histogram!(m::TURN_SECONDS, "phase" => phase)
            .record(now.duration_since(self.0).as_secs_f64());
        self.0 = now;
    }
}

/// The timeout of a transaction's first commit call. A fault test shrinks it, so the call
/// returns while the commit is still under way: its outcome unknown to the stage, as when
/// the coordinator's answer is lost.
fn first_commit_timeout(timeout: Duration) -> Duration {
    // 0 ms: the call cannot wait for the coordinator's answer, so it always returns first.
    fail::fail_point!("dedupe-commit-outcome-unknown", |_| Duration::ZERO);
    timeout
}

/// Whether librdkafka says the transaction can be aborted and retried.
pub(super) fn is_abortable(e: &Error) -> bool {
    match e {
        Error::Kafka(rdkafka::error::KafkaError::Transaction(r)) => {
            !r.is_fatal() && (r.txn_requires_abort() || r.is_retriable())
        }
        _ => false,
    }
}

/// Chaos self-test (`make chaos-selftest`, docs/testing.md): a delta lost
/// (`dedupe-drop-delta`) or sent twice (`dedupe-double-delta`) with its state committed as if
/// sent once, the silent miscount the runs' exactness checks must report. One copy otherwise.
fn delta_copies() -> usize {
    fail::fail_point!("dedupe-drop-delta", |_| 0);
    fail::fail_point!("dedupe-double-delta", |_| 2);
    1
}
