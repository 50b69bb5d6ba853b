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

pub mod engine;
pub mod event;
pub mod horizon;
pub mod recovery;
pub mod rule;
pub mod state;
mod txn;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use tracing::{info, warn};

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka::group::DedupeOffset;
use crate::kafka::{self, LogContext, StageConsumer};
use crate::runtime::clock::now_ms;
use crate::runtime::health::Health;
use crate::runtime::metrics as m;
use crate::runtime::shutdown::CancellationToken;
use crate::runtime::supervise::{sleep_unless_stopped, Backoff};
use crate::topology::Topology;
use rule::{EdgeVersion, Verdict};
use state::{edge_key, EdgeStore, PartitionMark};
use txn::{is_abortable, Phases};

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
    /// Flips counted with a guessed baseline: each also sent a recount record.
    pub guessed: u64,
    /// Flips from before their range came home to this region: left to the previous home.
    pub previous_home: u64,
    /// Partitions whose committed offset was out of range (records lost to retention).
    pub offset_resets: u64,
    /// Commit calls that returned with the outcome unknown and were resumed.
    pub commits_resumed: u64,
    /// Partitions whose state was rebuilt from the changelog when assigned (local state
    /// not known to be exact).
    pub restores: u64,
}

/// One stage-1 worker.
pub struct Dedupe {
    settings: Settings,
    topology: Topology,
    /// Its input, `likes.events`.
    input: StageConsumer,
    producer: BaseProducer<LogContext>,
    store: EdgeStore,
    offset_resets: Arc<AtomicU64>,
    /// Per owned, recovered partition: its mark as last committed.
    marks: HashMap<i32, PartitionMark>,
    /// Per owned partition: the horizon in force (a raise under way reaches back only as far
    /// as state was kept; horizon.rs), committed with its offsets.
    horizons: HashMap<i32, horizon::Horizon>,
    deltas_topic: String,
    dlq_topic: String,
    changelog_topic: String,
    deltas_partitions: i32,
    last_tick: Instant,
    health: Health,
    stop: CancellationToken,
    pub stats: DedupeStats,
    /// The phases of this incarnation's start, logged once its first transaction commits.
    startup: Option<Startup>,
}

/// Where a start's time goes (issue 26: a restart after kill -9 took 10 s, all of it in one
/// phase nobody logged): each phase's duration, logged in one line at the first commit.
struct Startup {
    began: Instant,
    last: Instant,
    phases: Vec<(&'static str, Duration)>,
}

impl Startup {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            began: now,
            last: now,
            phases: Vec::new(),
        }
    }

    fn lap(&mut self, phase: &'static str) {
        let now = Instant::now();
        self.phases.push((phase, now - self.last));
        self.last = now;
    }

    fn log(mut self) {
        self.lap("first_transaction");
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(p, d)| format!("{p}={}ms", d.as_millis()))
            .collect();
        info!(
            total_ms = self.began.elapsed().as_millis() as u64,
            phases = %phases.join(" "),
            "dedupe processing"
        );
    }
}

/// One batch's work, built before its transaction.
#[derive(Default)]
struct Batch {
    /// Edge key → (new version, input partition).
    edges: HashMap<Vec<u8>, (EdgeVersion, i32)>,
    /// (item, event-time second) → its sum. A delta never combines flips of two event-time
    /// seconds, so a whole second is a clean cut of the deltas log: reconcile and rebuild
    /// split the log at one (src/ops/cut.rs). Hashed, and sorted once at the commit: every
    /// event looks its item up here, and an ordered map's string comparisons per lookup were
    /// the largest share of stage 1's CPU (docs/performance.md, "Stage 1's rate").
    items: HashMap<(String, i64), ItemSum>,
    /// Partition → (first offset, next offset).
    offsets: BTreeMap<i32, (i64, i64)>,
    dead: Vec<DeadLetter>,
    /// Valid events by client platform (index into `event::PLATFORM_LABELS`), counted once
    /// per batch rather than per event: the metrics registry is no place for the hot loop.
    platforms: [u64; event::PLATFORM_LABELS.len()],
    /// The largest event delay among them, ms (the gauge the horizon alerts read).
    max_delay_ms: i64,
}

/// One item's deltas in one event-time second of a batch: one Delta record.
struct ItemSum {
    delta: i64,
    /// The earliest event time among them (the record's event time).
    earliest_ms: i64,
    /// The flips combined (a skipped op's change weighs none), and their event times'
    /// sum: the record's weight, for staleness per flip.
    flips: u32,
    time_sum_ms: i64,
}

impl Default for ItemSum {
    fn default() -> Self {
        Self {
            delta: 0,
            earliest_ms: i64::MAX,
            flips: 0,
            time_sum_ms: 0,
        }
    }
}

struct DeadLetter {
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    partition: i32,
    offset: i64,
    reason: String,
    /// Which of [`m::DLQ_KINDS`]: the label of `likes_dlq_records_total`, so a writer's bad
    /// records are told apart from the flips the recount settles (issue 43, hole 7d).
    kind: &'static str,
}

impl DeadLetter {
    /// The record `m` as it came, with why it goes to the DLQ.
    fn of(m: &rdkafka::message::OwnedMessage, kind: &'static str, reason: String) -> Self {
        DeadLetter {
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            partition: m.partition(),
            offset: m.offset(),
            reason,
            kind,
        }
    }
}

impl Dedupe {
    /// Connects, opens the state, initialises the transactional producer (fencing any earlier
    /// incarnation of this instance) and subscribes.
    pub fn new(
        settings: &Settings,
        topology: &Topology,
        health: Health,
        stop: CancellationToken,
    ) -> Result<Self> {
        check_horizon(settings, topology)?;
        let mut startup = Startup::new();
        let instance = settings.instance_id();
        let group = settings.group(&topology.groups.dedupe);
        let offset_resets = Arc::new(AtomicU64::new(0));
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
        // Waits for the coordinator to abort the previous incarnation's open transaction.
        startup.lap("init_transactions");
        // Per group and instance: two instances sharing a volume never open the same RocksDB.
        let dir = settings.dedupe.state_dir.join(&group).join(&instance);
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let store = EdgeStore::open(
            &dir,
            topology.dedupe_ttl.as_millis() as i64,
            settings.dedupe.block_cache_mb << 20,
        )?;
        // Replays the WAL a killed process left.
        startup.lap("state_open");
        // Subscribed last: no partition is assigned to an incarnation that could not start.
        let input = StageConsumer::subscribe(
            settings,
            "dedupe",
            (&group, &format!("{instance}-dedupe")),
            settings.topic(&topology.topics.events.name),
            offset_resets.clone(),
        )?;
        info!(%group, %instance, state = %dir.display(), "dedupe started");
        Ok(Self {
            settings: settings.clone(),
            topology: topology.clone(),
            input,
            producer,
            store,
            offset_resets,
            marks: HashMap::new(),
            horizons: HashMap::new(),
            deltas_topic: settings.topic(&topology.topics.deltas.name),
            dlq_topic: settings.topic(&topology.topics.dlq.name),
            changelog_topic: settings.topic(&topology.topics.dedupe_changelog.name),
            deltas_partitions: topology.topics.deltas.partitions,
            last_tick: Instant::now() - topology.tick_interval,
            health,
            stop,
            stats: DedupeStats::default(),
            startup: Some(startup),
        })
    }

    /// Runs until `stop` is set or an error ends this incarnation.
    pub fn run(&mut self) -> Result<()> {
        let result = (|| {
            while !self.stop.is_cancelled() {
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
        let mut next = self.input.consumer.poll(wait);
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
            next = self.input.consumer.poll(Duration::ZERO);
        }
        phase.lap("poll");
        self.handle_rebalance()?;
        // Records fetched before a revoke that happened during this poll belong to the new
        // owner, which reads them from the committed offset.
        pending_msgs.retain(|m| self.marks.contains_key(&m.partition()));
        let now = now_ms();
        let configured = self.topology.dedupe_ttl.as_millis() as i64;
        for m in &pending_msgs {
            let horizon = self
                .horizons
                .get(&m.partition())
                .map_or(configured, |h| h.effective(now));
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
            Ok(()) => {
                summarize_dead_letters(&batch.dead);
                if !batch.offsets.is_empty() {
                    metrics::gauge!(m::EVENT_DELAY_MAX_SECONDS)
                        .set(batch.max_delay_ms as f64 / 1000.0);
                }
            }
            // Stopping (possibly with a commit's outcome unknown): leave it to the next start's
            // recovery; an abort now would only conflict with the commit still under way.
            Err(e) if self.stop.is_cancelled() => return Err(e),
            Err(e) if e.is_retryable() || is_abortable(&e) => {
                warn!(error = %e, "transaction failed; aborting and re-reading the batch");
                self.abort()?;
                for (&p, &(first, _)) in &batch.offsets {
                    crate::kafka::offsets::seek(
                        &self.input.consumer,
                        &self.input.topic,
                        p,
                        first,
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
        if !batch.offsets.is_empty() {
            if let Some(s) = self.startup.take() {
                s.log();
            }
        }
        metrics::counter!(m::TRANSACTIONS).increment(1);
        metrics::counter!(m::EVENTS_IN).increment(pending_msgs.len() as u64);
        for (label, n) in event::PLATFORM_LABELS.iter().zip(batch.platforms) {
            if n > 0 {
                metrics::counter!(m::EVENTS_BY_PLATFORM, "platform" => *label).increment(n);
            }
        }
        Ok(())
    }

    /// Applies rebalance events in the order they happened, then recovers every partition
    /// still newly assigned. A partition revoked again before this runs is never processed.
    fn handle_rebalance(&mut self) -> Result<()> {
        let (marks, horizons) = (&mut self.marks, &mut self.horizons);
        let parts: Vec<(i32, DedupeOffset)> = self
            .input
            .take_assigned(|p| {
                marks.remove(&p);
                horizons.remove(&p);
            })?
            .into_iter()
            .map(|r| (r.partition, DedupeOffset::of(&r)))
            .collect();
        if parts.is_empty() {
            return Ok(());
        }
        if let Some(s) = &mut self.startup {
            s.lap("group_join_and_offsets");
        }
        let (ttl, now) = (self.topology.dedupe_ttl.as_millis() as i64, now_ms());
        for (p, committed) in &parts {
            let recorded = committed
                .horizon
                .as_deref()
                .and_then(horizon::Horizon::from_metadata);
            let h = horizon::Horizon::resume(recorded, ttl, now);
            if let Some((kept, _)) = h.raised {
                warn!(
                    partition = p,
                    kept_ms = kept,
                    dedupe_ttl_ms = ttl,
                    "dedupe_ttl is above what this partition's state was kept for: ops older than what was kept are taken as counted until the new horizon has passed (docs/exactness.md, \"Past the horizon\")"
                );
            }
            self.horizons.insert(*p, h);
        }
        for (p, r, mark) in recovery::recover_partitions(
            &self.settings,
            &self.changelog_topic,
            &self.store,
            &parts,
            &self.health,
        )? {
            info!(partition = p, recovery = ?r, emitted_up_to = mark.emitted, "partition ready");
            let restored = matches!(r, recovery::Recovery::Restored(_));
            self.stats.restores += u64::from(restored);
            let how = if restored { "restored" } else { "kept" };
            metrics::counter!(m::PARTITIONS_RECOVERED, "how" => how).increment(1);
            self.marks.insert(p, mark);
        }
        if let Some(s) = &mut self.startup {
            s.lap("local_state");
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
                batch.dead.push(DeadLetter::of(m, "invalid", reason));
                return Ok(());
            }
        };
        if !replay {
            batch.platforms[valid.platform_index()] += 1;
        }
        let delay_ms = (now - valid.flip.event_time_ms).max(0);
        metrics::histogram!(m::EVENT_DELAY_SECONDS).record(delay_ms as f64 / 1000.0);
        batch.max_delay_ms = batch.max_delay_ms.max(delay_ms);
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
            Verdict::PreviousHome if replay => {}
            Verdict::PreviousHome => {
                self.stats.previous_home += 1;
                metrics::counter!(m::PREVIOUS_HOME_FLIPS).increment(1);
                // The previous home's pipeline, or the move's recount, counted it if it landed
                // before the recount's cut; a statement of the old home that landed after it
                // (issue 56) would be counted nowhere. The recount queue settles the item
                // either way, so such a flip is recounted, never silent.
                batch.dead.push(DeadLetter::of(m, "previous_home", "flip from before its range came home to this region: counted by the previous home or by the move's recount unless it landed after that recount's cut; recount the item (likes reconcile --dead-letters)".to_string()));
            }
            Verdict::Expired if replay => {}
            Verdict::Expired => {
                self.stats.expired += 1;
                metrics::counter!(m::EXPIRED_FLIPS).increment(1);
                batch.dead.push(DeadLetter::of(m, "expired", format!(
                    "flip older than the dedupe horizon ({:?}) with no state left: it may be a redelivery of a version counted before, so it is not counted; reconcile the item if it was new (likes reconcile --dead-letters)",
                    self.topology.dedupe_ttl
                )));
            }
            Verdict::Apply { state, .. } if replay => {
                batch.edges.insert(key, (state, p));
            }
            Verdict::Apply {
                delta,
                state,
                guessed,
            } => {
                if guessed {
                    // Counted, but on a guess: the dead letter asks for a recount of the item
                    // (`likes reconcile --dead-letters`), so the guess is never silent.
                    self.stats.guessed += 1;
                    metrics::counter!(m::GUESSED_FLIPS).increment(1);
                    batch.dead.push(DeadLetter::of(m, "guessed", format!(
                        "{GUESSED}: no state left for the edge and the event does not reach back to a flip past the horizon ({:?}), so \"never liked\" was assumed; recount the item (likes reconcile --dead-letters)",
                        self.topology.dedupe_ttl
                    )));
                }
                batch.edges.insert(key, (state, p));
                let [skipped, own] = rule::placed(remembered, valid.flip, delta);
                if skipped.1 != 0 {
                    // A skipped op's change, in its own second (weighing no flip of its own).
                    let e = batch
                        .items
                        .entry((valid.event.item_id.clone(), skipped.0.div_euclid(1000)))
                        .or_default();
                    e.delta += skipped.1;
                    e.earliest_ms = e.earliest_ms.min(skipped.0);
                }
                let e = batch
                    .items
                    .entry((valid.event.item_id, own.0.div_euclid(1000)))
                    .or_default();
                e.delta += own.1;
                e.earliest_ms = e.earliest_ms.min(own.0);
                e.flips += 1;
                e.time_sum_ms = e.time_sum_ms.saturating_add(own.0);
            }
        }
        Ok(())
    }
}

/// Refuses a horizon a delayed flip could outlive (issue 43, hole 7a): in a chaos run with a
/// 45 s horizon, a transaction caught by an outage waited 30 s on an unknown commit outcome,
/// was fenced and restarted, and reached its batch 45-46 s after the flips' time, and 91
/// flips were lost to the expired path. `dedupe.allow_short_horizon` lets a test run one.
fn check_horizon(settings: &Settings, topology: &Topology) -> Result<()> {
    let floor = settings
        .dedupe
        .horizon_floor(&settings.kafka, &settings.api);
    metrics::gauge!(m::HORIZON_SECONDS).set(topology.dedupe_ttl.as_secs_f64());
    if topology.dedupe_ttl >= floor {
        return Ok(());
    }
    if settings.dedupe.allow_short_horizon {
        warn!(dedupe_ttl = ?topology.dedupe_ttl, ?floor, "a dedupe horizon under its floor (dedupe.allow_short_horizon): a flip delayed by an outage may outlive it");
        return Ok(());
    }
    Err(Error::Config(format!(
        "the topology's dedupe_ttl ({:?}) is under 4 x (dedupe.transaction_timeout + 2 x \
         kafka.request_timeout + api.relay_min_age + api.relay_lease) = {floor:?}: a flip \
         delayed by a broker outage could reach stage 1 past it and be refused as a copy. \
         Raise dedupe_ttl, or \
         set dedupe.allow_short_horizon = true for a test or demo",
        topology.dedupe_ttl
    )))
}

/// One line and the counters per committed transaction, not per record: after an outage a
/// run of expired copies is thousands of records, and an aborted transaction's would be
/// logged again when it is re-read.
fn summarize_dead_letters(dead: &[DeadLetter]) {
    if dead.is_empty() {
        return;
    }
    let mut by_kind = [0u64; m::DLQ_KINDS.len()];
    for d in dead {
        let i = m::DLQ_KINDS.iter().position(|k| *k == d.kind).unwrap_or(0);
        by_kind[i] += 1;
    }
    for (kind, n) in m::DLQ_KINDS.iter().zip(by_kind) {
        metrics::counter!(m::DLQ_RECORDS, "stage" => "dedupe", "kind" => *kind).increment(n);
    }
    let [invalid, expired, guessed, previous_home] = by_kind;
    let first = &dead[0];
    if invalid > 0 {
        let bad = dead.iter().find(|d| d.kind == "invalid").unwrap_or(first);
        warn!(invalid, expired, guessed, previous_home, partition = bad.partition, offset = bad.offset, reason = %bad.reason, "dead letters in this transaction: a writer sends records stage 1 refuses (the first named)");
    } else {
        info!(expired, guessed, previous_home, partition = first.partition, offset = first.offset, reason = %first.reason, "dead letters in this transaction: flips for the recount queue (likes reconcile --dead-letters)");
    }
}

/// How the reason of a recount record (a flip counted on a guess, not a dead flip) begins.
pub const GUESSED: &str = "counted with a guessed baseline";

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
    stop: CancellationToken,
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
        self.guessed += o.guessed;
        self.previous_home += o.previous_home;
        self.offset_resets += o.offset_resets;
        self.commits_resumed += o.commits_resumed;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Settings;
    use crate::topology::Topology;

    /// Issue 43, hole 7a: the chaos run's 45 s horizon started, and lost 91 flips to an
    /// outage that delayed them past it.
    #[test]
    fn a_horizon_a_delayed_flip_could_outlive_is_refused_unless_asked_for() {
        let mut settings = Settings::load(None).unwrap();
        let mut topology = Topology::load(None).unwrap();
        super::check_horizon(&settings, &topology).unwrap();
        topology.dedupe_ttl = Duration::from_secs(45);
        let err = super::check_horizon(&settings, &topology)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dedupe_ttl")
                && err.contains("allow_short_horizon")
                && err.contains("400s"),
            "{err}"
        );
        settings.dedupe.allow_short_horizon = true;
        super::check_horizon(&settings, &topology).unwrap();
    }
}
