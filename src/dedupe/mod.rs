//! Stage 1, `likes dedupe`: `likes.events` (key item#bucket) → `likes.deltas` (key item).
//!
//! Each loop turn reads a batch, runs every event through the delta rule against the edge
//! state (RocksDB plus this batch's own changes), combines the deltas per item, and commits,
//! in one Kafka transaction: the Delta records, the changelog records of every edge that
//! changed, dead letters, ticks, and the input offsets. Only after that transaction commits
//! does the batch's state reach RocksDB, with the offsets it reflects (see [`state`] and
//! [`recovery`] for why this keeps state and offsets in agreement across any crash).
//!
//! The loop is synchronous on its own thread: librdkafka's transactional calls block, and a
//! batch is a strict sequence (poll → process → commit) with nothing to overlap.

pub mod event;
pub mod recovery;
pub mod rule;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka::{self, Assignments, LogContext, StageContext};
use crate::runtime::clock::now_ms;
use crate::runtime::metrics as m;
use crate::runtime::supervise::{sleep_unless_stopped, Backoff, Health};
use crate::schema::v1::{delta_record, Delta, DeltaRecord, Tick};
use crate::topology::Topology;
use recovery::{offset_metadata, Committed};
use rule::{EdgeVersion, Verdict};
use state::{edge_key, EdgeStore, PartitionMark, EMITTED_KEY};

/// Counters of one stage-1 process, read by tests and exported as metrics.
#[derive(Debug, Default, Clone)]
pub struct DedupeStats {
    pub events: u64,
    pub duplicates: u64,
    pub dead_letters: u64,
    pub deltas_out: u64,
    pub transactions: u64,
    /// Events below a partition's emitted-up-to offset: state re-derived, nothing emitted.
    pub replayed: u64,
    /// Flips older than the horizon with nothing remembered: dead-lettered, not counted.
    pub expired: u64,
    /// Partitions whose committed offset was out of range (records lost to retention).
    pub offset_resets: u64,
    /// Commit calls that returned with the outcome unknown and were resumed.
    pub commits_resumed: u64,
}

/// One stage-1 worker.
pub struct Dedupe {
    settings: Settings,
    topology: Topology,
    consumer: BaseConsumer<StageContext>,
    producer: BaseProducer<LogContext>,
    store: EdgeStore,
    assignments: Arc<Assignments>,
    offset_resets: Arc<AtomicU64>,
    /// Per owned, recovered partition: its mark as last committed.
    marks: HashMap<i32, PartitionMark>,
    events_topic: String,
    deltas_topic: String,
    dlq_topic: String,
    changelog_topic: String,
    deltas_partitions: i32,
    last_tick: Instant,
    health: Health,
    stop: Arc<AtomicBool>,
    pub stats: DedupeStats,
}

/// One batch's work, built before its transaction.
#[derive(Default)]
struct Batch {
    /// Edge key → (new version, input partition).
    edges: HashMap<Vec<u8>, (EdgeVersion, i32)>,
    /// Item → (sum of deltas, earliest event time, events).
    items: BTreeMap<String, (i64, i64, u32)>,
    /// Partition → (first offset, next offset).
    offsets: BTreeMap<i32, (i64, i64)>,
    dead: Vec<DeadLetter>,
}

struct DeadLetter {
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    partition: i32,
    offset: i64,
    reason: String,
}

impl Dedupe {
    /// Connects, opens the state, initialises the transactional producer (fencing any earlier
    /// incarnation of this instance) and subscribes.
    pub fn new(
        settings: &Settings,
        topology: &Topology,
        health: Health,
        stop: Arc<AtomicBool>,
    ) -> Result<Self> {
        let instance = settings.instance_id();
        let events_topic = settings.topic(&topology.topics.events.name);
        let group = format!("{}{}", settings.kafka.topic_prefix, topology.groups.dedupe);
        let assignments = Arc::new(Assignments::default());
        let offset_resets = Arc::new(AtomicU64::new(0));
        let consumer: BaseConsumer<StageContext> =
            kafka::stage_consumer_config(&settings.kafka, &group, &format!("{instance}-dedupe"))
                .create_with_context(StageContext {
                    stage: "dedupe",
                    assignments: assignments.clone(),
                    offset_resets: offset_resets.clone(),
                })?;
        let producer: BaseProducer<LogContext> = kafka::producer_config(&settings.kafka)
            .set("transactional.id", format!("{group}-{instance}"))
            // Right after a commit the coordinator answers the next transaction's offset
            // commit with CONCURRENT_TRANSACTIONS until the markers are written (a few ms);
            // at the default 100 ms backoff that retry was most of every commit's latency.
            .set("retry.backoff.ms", "5")
            .set("retry.backoff.max.ms", "10")
            .set(
                "transaction.timeout.ms",
                settings.dedupe.transaction_timeout.as_millis().to_string(),
            )
            // librdkafka requires it: a socket may not outwait the transaction.
            .set(
                "socket.timeout.ms",
                settings
                    .kafka
                    .request_timeout
                    .min(settings.dedupe.transaction_timeout)
                    .as_millis()
                    .to_string(),
            )
            .create_with_context(LogContext)?;
        producer.init_transactions(settings.kafka.request_timeout)?;
        // Per group and instance: two instances sharing a volume never open the same RocksDB.
        let dir = settings.dedupe.state_dir.join(&group).join(&instance);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::State(format!("create {}: {e}", dir.display())))?;
        let store = EdgeStore::open(
            &dir,
            topology.dedupe_ttl.as_millis() as i64,
            settings.dedupe.block_cache_mb << 20,
        )?;
        consumer.subscribe(&[&events_topic])?;
        info!(%group, %instance, state = %dir.display(), "dedupe started");
        Ok(Self {
            settings: settings.clone(),
            topology: topology.clone(),
            consumer,
            producer,
            store,
            assignments,
            offset_resets,
            marks: HashMap::new(),
            deltas_topic: settings.topic(&topology.topics.deltas.name),
            dlq_topic: settings.topic(&topology.topics.dlq.name),
            changelog_topic: settings.topic(&topology.topics.dedupe_changelog.name),
            events_topic,
            deltas_partitions: topology.topics.deltas.partitions,
            last_tick: Instant::now() - topology.tick_interval,
            health,
            stop,
            stats: DedupeStats::default(),
        })
    }

    /// Runs until `stop` is set or an error ends this incarnation.
    pub fn run(&mut self) -> Result<()> {
        let result = (|| {
            while !self.stop.load(Ordering::Relaxed) {
                self.turn()?;
            }
            self.store.flush()
        })();
        self.stats.offset_resets = self.offset_resets.load(Ordering::Relaxed);
        result
    }

    /// One loop turn: poll a batch, recover newly assigned partitions, process, commit.
    pub fn turn(&mut self) -> Result<()> {
        let tick_every = self.topology.tick_interval;
        let wait = tick_every
            .saturating_sub(self.last_tick.elapsed())
            .min(Duration::from_millis(100));
        let mut batch = Batch::default();
        let mut pending_msgs = Vec::new();
        let mut phase = Phases::start();
        let mut next = self.consumer.poll(wait);
        if next.is_none() {
            // Nothing waiting: caught up (or the broker away, which a restart cannot fix).
            self.health.beat();
        }
        while let Some(polled) = next {
            match polled {
                Ok(m) => pending_msgs.push(m.detach()),
                Err(e) => {
                    kafka::consumer_error(e)?;
                    break;
                }
            }
            if pending_msgs.len() >= self.settings.dedupe.max_batch {
                break;
            }
            next = self.consumer.poll(Duration::ZERO);
        }
        phase.lap("poll");
        self.handle_rebalance()?;
        // Records fetched before a revoke that happened during this poll belong to the new
        // owner, which reads them from the committed offset.
        pending_msgs.retain(|m| self.marks.contains_key(&m.partition()));
        let now = now_ms();
        let horizon = self.topology.dedupe_ttl.as_millis() as i64;
        for m in &pending_msgs {
            self.process(m, &mut batch, now, horizon)?;
        }
        let tick_due = self.last_tick.elapsed() >= tick_every;
        if batch.offsets.is_empty() && !tick_due {
            return Ok(());
        }
        phase.lap("process");
        let token = format!("{:016x}", rand::random::<u64>());
        let marks: BTreeMap<i32, PartitionMark> = batch
            .offsets
            .iter()
            .map(|(&p, &(_, next))| {
                let emitted = self.marks.get(&p).map_or(0, |m| m.emitted).max(next);
                let mark = PartitionMark {
                    offset: next,
                    emitted,
                    token: token.clone(),
                };
                (p, mark)
            })
            .collect();
        match self.commit(&batch, &marks, tick_due) {
            Ok(()) => {}
            // Stopping (possibly with a commit's outcome unknown): leave it to the next start's
            // recovery; an abort now would only conflict with the commit still under way.
            Err(e) if self.stop.load(Ordering::Relaxed) => return Err(e),
            Err(e) if e.is_retryable() || is_abortable(&e) => {
                warn!(error = %e, "transaction failed; aborting and re-reading the batch");
                self.abort()?;
                for (&p, &(first, _)) in &batch.offsets {
                    self.consumer.seek(
                        &self.events_topic,
                        p,
                        Offset::Offset(first),
                        self.settings.kafka.request_timeout,
                    )?;
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if tick_due {
            self.last_tick = Instant::now();
            for (kind, bytes) in self.store.memory() {
                metrics::gauge!(m::STATE_MEMORY, "kind" => kind).set(bytes as f64);
            }
        }
        phase.lap("commit");
        self.health.beat();
        self.store.commit(
            batch.edges.iter().map(|(k, (v, _))| (k.as_slice(), v)),
            marks.iter().map(|(&p, m)| (p, m)),
        )?;
        self.marks.extend(marks);
        phase.lap("state");
        fail::fail_point!("dedupe-after-state-write");
        self.producer.poll(Duration::ZERO);
        self.stats.transactions += 1;
        metrics::counter!(m::TRANSACTIONS).increment(1);
        metrics::counter!(m::EVENTS_IN).increment(pending_msgs.len() as u64);
        Ok(())
    }

    /// Applies rebalance events in the order they happened, then recovers every partition
    /// still newly assigned. A partition revoked again before this runs is never processed.
    fn handle_rebalance(&mut self) -> Result<()> {
        let marks = &mut self.marks;
        let pending = kafka::newly_assigned(self.assignments.take(), |p| {
            marks.remove(&p);
        });
        if pending.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for &p in &pending {
            tpl.add_partition(&self.events_topic, p);
        }
        let committed = self
            .consumer
            .committed_offsets(tpl, self.settings.kafka.request_timeout)?;
        let parts: Vec<(i32, Committed)> = committed
            .elements()
            .iter()
            .map(|e| {
                let offset = match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                };
                (e.partition(), Committed::parse(offset, e.metadata()))
            })
            .collect();
        for (p, r, mark) in recovery::recover_partitions(
            &self.settings,
            &self.changelog_topic,
            &self.store,
            &parts,
            &self.health,
        )? {
            info!(partition = p, recovery = ?r, emitted_up_to = mark.emitted, "partition ready");
            self.marks.insert(p, mark);
        }
        Ok(())
    }

    fn process(
        &mut self,
        m: &rdkafka::message::OwnedMessage,
        batch: &mut Batch,
        now: i64,
        horizon: i64,
    ) -> Result<()> {
        let p = m.partition();
        batch
            .offsets
            .entry(p)
            .and_modify(|(_, next)| *next = m.offset() + 1)
            .or_insert((m.offset(), m.offset() + 1));
        self.stats.events += 1;
        // Below the emitted-up-to offset every delta was emitted (and every dead letter
        // sent) before: re-derive state, emit nothing.
        let replay = self
            .marks
            .get(&p)
            .is_some_and(|mark| m.offset() < mark.emitted);
        if replay {
            self.stats.replayed += 1;
        }
        let valid = match event::parse(m.key(), m.payload(), self.topology.buckets) {
            Ok(v) => v,
            Err(_) if replay => return Ok(()),
            Err(reason) => {
                batch.dead.push(DeadLetter {
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    partition: p,
                    offset: m.offset(),
                    reason,
                });
                return Ok(());
            }
        };
        metrics::histogram!(m::EVENT_DELAY_SECONDS)
            .record((now - valid.flip.event_time_ms).max(0) as f64 / 1000.0);
        let key = edge_key(&valid.event.item_id, &valid.event.user_id);
        let remembered = match batch.edges.get(&key) {
            Some((v, _)) => Some(*v),
            None => self.store.get(&key, now)?,
        };
        match rule::apply(remembered, valid.flip, now, horizon) {
            Verdict::Drop => {
                self.stats.duplicates += 1;
                metrics::counter!(m::DUPLICATES).increment(1);
            }
            Verdict::Expired if replay => {}
            Verdict::Expired => {
                self.stats.expired += 1;
                metrics::counter!(m::EXPIRED_FLIPS).increment(1);
                batch.dead.push(DeadLetter {
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    partition: p,
                    offset: m.offset(),
                    reason: format!(
                        "flip older than the dedupe horizon ({:?}) with no state left: it may be a redelivery of a version counted before, so it is not counted; reconcile the item if it was new",
                        self.topology.dedupe_ttl
                    ),
                });
            }
            Verdict::Apply { state, .. } if replay => {
                batch.edges.insert(key, (state, p));
            }
            Verdict::Apply { delta, state } => {
                batch.edges.insert(key, (state, p));
                let e = batch
                    .items
                    .entry(valid.event.item_id)
                    .or_insert((0, i64::MAX, 0));
                e.0 += delta;
                e.1 = e.1.min(valid.flip.event_time_ms);
                e.2 += 1;
            }
        }
        Ok(())
    }

    fn commit(
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
                (&self.events_topic, d.partition, d.offset),
            );
            send(&self.producer, r)?;
            warn!(partition = d.partition, offset = d.offset, reason = %d.reason, "dead letter");
            self.stats.dead_letters += 1;
            metrics::counter!(m::DLQ_RECORDS, "stage" => "dedupe").increment(1);
        }
        for (item, &(delta, event_time_ms, events)) in &batch.items {
            if delta == 0 {
                continue;
            }
            let value = DeltaRecord {
                record: Some(delta_record::Record::Delta(Delta {
                    item_id: item.clone(),
                    delta,
                    event_time_ms,
                    events,
                })),
            }
            .encode_to_vec();
            send(
                &self.producer,
                BaseRecord::to(&self.deltas_topic)
                    .key(item.as_bytes())
                    .payload(&value),
            )?;
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
            let value = DeltaRecord {
                record: Some(delta_record::Record::Tick(Tick {
                    produced_at_ms: now_ms(),
                })),
            }
            .encode_to_vec();
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
            let mut tpl = TopicPartitionList::new();
            for (&p, mark) in marks {
                tpl.add_partition_offset(&self.events_topic, p, Offset::Offset(mark.offset))?;
                if let Some(mut e) = tpl.find_partition(&self.events_topic, p) {
                    e.set_metadata(offset_metadata(mark.emitted, &mark.token));
                }
            }
            let meta = self
                .consumer
                .group_metadata()
                .ok_or_else(|| Error::Config("consumer has no group metadata".into()))?;
            self.producer
                .send_offsets_to_transaction(&tpl, &meta, timeout)?;
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
            if self.stop.load(Ordering::Relaxed) {
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
    fn abort(&mut self) -> Result<()> {
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
                        && !self.stop.load(Ordering::Relaxed) =>
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
struct Phases(Instant);

impl Phases {
    fn start() -> Self {
        Phases(Instant::now())
    }
    fn lap(&mut self, phase: &'static str) {
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
fn is_abortable(e: &Error) -> bool {
    match e {
        Error::Kafka(rdkafka::error::KafkaError::Transaction(r)) => {
            !r.is_fatal() && (r.txn_requires_abort() || r.is_retriable())
        }
        _ => false,
    }
}

/// Enqueues a record, serving delivery callbacks while the local queue is full.
fn send<K: rdkafka::message::ToBytes + ?Sized, P: rdkafka::message::ToBytes + ?Sized>(
    producer: &BaseProducer<LogContext>,
    mut record: BaseRecord<'_, K, P>,
) -> Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                r,
            )) => {
                record = r;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Runs stage 1 on the current thread until `stop`. An error of Kafka's (the broker
/// restarting, the producer fenced after an outage that outlived its transaction) ends the
/// incarnation, not the process: a new one starts after a backoff and recovers from the
/// committed position, as a restarted process would. Fatal errors end the process.
pub fn run(
    settings: &Settings,
    topology: &Topology,
    stop: Arc<AtomicBool>,
    health: Health,
) -> Result<DedupeStats> {
    let mut total = DedupeStats::default();
    let mut backoff = Backoff::default();
    loop {
        let mut committed = 0;
        let result =
            Dedupe::new(settings, topology, health.clone(), stop.clone()).and_then(|mut d| {
                let r = d.run();
                committed = d.stats.transactions;
                total.add(&d.stats);
                r
            });
        match backoff.after("dedupe", result, committed > 0, &stop)? {
            Some(wait) if sleep_unless_stopped(wait, &stop) => {}
            _ => break,
        }
    }
    info!(stats = ?total, "dedupe stopping");
    Ok(total)
}

impl DedupeStats {
    fn add(&mut self, o: &DedupeStats) {
        self.events += o.events;
        self.duplicates += o.duplicates;
        self.dead_letters += o.dead_letters;
        self.deltas_out += o.deltas_out;
        self.transactions += o.transactions;
        self.replayed += o.replayed;
        self.expired += o.expired;
        self.offset_resets += o.offset_resets;
        self.commits_resumed += o.commits_resumed;
    }
}
