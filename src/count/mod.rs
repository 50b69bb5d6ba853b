//! Stage 2, `likes count`: `likes.deltas` (key item) → one (item, window, +N) per item per
//! window → `like_counts` through the LWT fence.
//!
//! Each round reads a batch (read_committed, so it stops at the first open transaction),
//! feeds the windows, applies every window that closed, and only then commits each
//! partition's offset: the first record of its still-open window, with that window's start
//! as the clock in the commit metadata. After a crash the replay rebuilds the open windows
//! from the same records, and any window already applied bounces off the fence.

pub mod sink;
pub mod window;

use std::time::Duration;

use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{BaseProducer, Producer};
use tracing::{info, warn};

use crate::config::Settings;
use crate::cql;
use crate::error::Result;
use crate::kafka::group::{self, CountClock};
use crate::kafka::{self, LogContext, StageConsumer};
use crate::records::{decode_deltas, DeltaInput};
use crate::runtime::health::Health;
use crate::runtime::metrics as m;
use crate::runtime::shutdown::CancellationToken;
use crate::runtime::supervise::{sleep_or_stop, Backoff};
use crate::topology::Topology;
use sink::{Sink, SinkStats};
use window::{ResumePoint, Windows};

/// One stage-2 worker.
pub struct Count {
    settings: Settings,
    /// Its input, `likes.deltas`.
    input: StageConsumer,
    dlq: BaseProducer<LogContext>,
    windows: Windows,
    sink: Sink,
    dlq_topic: String,
    committed: Vec<(i32, ResumePoint)>,
    health: Health,
    pub records: u64,
}

impl Count {
    pub async fn new(settings: &Settings, topology: &Topology, health: Health) -> Result<Self> {
        let group = settings.group(&topology.groups.count);
        let input = StageConsumer::subscribe(
            settings,
            "count",
            (&group, &format!("{}-count", settings.instance_id())),
            settings.topic(&topology.topics.deltas.name),
            Default::default(),
        )?;
        let dlq: BaseProducer<LogContext> =
            kafka::producer_config(&settings.kafka).create_with_context(LogContext)?;
        let session = cql::connect(&settings.cql).await?;
        crate::store::recorded::check(&session, &settings.cql.keyspace, topology).await?;
        let routes = crate::region::Routes::for_process(&session, settings).await?;
        let mut sink = Sink::new(
            session,
            &settings.cql.keyspace,
            topology,
            settings.count.max_in_flight,
            settings.count.batch_rows,
        )
        .await?;
        if let Some(routes) = routes {
            sink.homed_by(routes);
        }
        if !settings.count.audit_log.is_empty() {
            sink.audit_to(std::path::Path::new(&settings.count.audit_log))?;
        }
        info!(%group, "count started");
        Ok(Self {
            settings: settings.clone(),
            input,
            dlq,
            windows: Windows::new(topology.window.as_millis() as i64),
            sink,
            dlq_topic: settings.topic(&topology.topics.dlq.name),
            committed: Vec::new(),
            health,
            records: 0,
        })
    }

    /// Runs until `stop` is set or an error ends this incarnation.
    pub async fn run(&mut self, stop: &CancellationToken) -> Result<()> {
        while !stop.is_cancelled() {
            self.round().await?;
        }
        Ok(())
    }

    /// One round: read a batch, apply the windows it closed, commit.
    pub async fn round(&mut self) -> Result<()> {
        // Read until nothing is buffered, `max_batch` records or `flush_interval`: a closed
        // window waits at most that long for its write, and a lagging sink (whose rounds
        // take longer) covers more windows of an item in each of its writes.
        let deadline = std::time::Instant::now() + self.settings.count.flush_interval;
        let mut wait = Duration::from_millis(100);
        let mut idle = false;
        for read in 0..self.settings.count.max_batch {
            let polled = tokio::task::block_in_place(|| {
                self.input
                    .consumer
                    .poll(wait)
                    .map(|r| r.map(|m| m.detach()))
            });
            self.handle_rebalance()?;
            match polled {
                Some(Ok(m)) => self.observe(&m)?,
                Some(Err(e)) => {
                    kafka::consumer_error(e)?;
                    break;
                }
                None => {
                    idle = read == 0;
                    break;
                }
            }
            wait = Duration::ZERO;
            if std::time::Instant::now() > deadline {
                break;
            }
        }
        let closed = self.windows.take_closed();
        let wrote = !closed.is_empty();
        if wrote {
            let now = crate::runtime::clock::now_ms();
            let closed_at = metrics::histogram!(m::WINDOW_CLOSED_SECONDS);
            for d in closed.iter().flat_map(|w| w.items.values()) {
                closed_at.record_many(
                    now.saturating_sub(d.mean_event_time_ms()).max(0) as f64 / 1000.0,
                    d.events as usize,
                );
            }
            let records: u64 = closed.iter().map(|w| w.records).sum();
            self.sink.apply(closed).await?;
            metrics::counter!(m::DELTAS_APPLIED).increment(records);
            // Fault-test hook: the counter rows are written, the offsets not yet committed.
            fail::fail_point!("count-after-sink-before-commit");
        }
        self.commit()?;
        if idle || wrote {
            // Caught up, or windows written and committed: progress.
            self.health.beat();
        }
        Ok(())
    }

    fn handle_rebalance(&mut self) -> Result<()> {
        if self.input.assignments.is_empty() {
            return Ok(());
        }
        // In the order they happened: a partition assigned and revoked again within one
        // poll is never taken up.
        let (windows, committed) = (&mut self.windows, &mut self.committed);
        let input = &self.input;
        let assigned = tokio::task::block_in_place(|| {
            input.take_assigned(|p| {
                windows.revoke(p);
                committed.retain(|(q, _)| *q != p);
            })
        })?;
        let mut never_committed = false;
        for r in assigned {
            never_committed |= r.offset.is_none();
            let CountClock {
                clock_ms,
                window_ms,
                then,
            } = CountClock::parse(&r.metadata).unwrap_or_default();
            let resume = r.offset.map(|offset| ResumePoint {
                offset,
                clock_ms,
                window_ms,
                then,
            });
            // Only needed when the committed grid is not ours, or a change was under way: the
            // end up to which it is kept.
            let replay_to = match &resume {
                Some(rp) if rp.needs_replay_end(self.windows.window_ms()) => {
                    let timeout = self.settings.kafka.request_timeout;
                    let (consumer, topic) = (&self.input.consumer, &self.input.topic);
                    tokio::task::block_in_place(|| {
                        crate::kafka::offsets::extent(consumer, topic, r.partition, timeout)
                    })?
                    .high
                }
                _ => 0,
            };
            info!(
                partition = r.partition,
                ?resume,
                replay_to,
                "partition ready"
            );
            self.windows.assign(r.partition, resume, replay_to);
        }
        if never_committed {
            // Record this process's window length before its first write (issue 23, item
            // 4): a crash before a first commit would otherwise leave windows applied on a
            // grid the next process, started with another length, cannot know.
            self.commit()?;
        }
        Ok(())
    }

    fn observe(&mut self, msg: &OwnedMessage) -> Result<()> {
        let p = msg.partition();
        if !self.windows.owns(p) {
            // Fetched before a revoke we have already handled: the new owner reads it.
            return Ok(());
        }
        self.records += 1;
        metrics::counter!(m::DELTA_RECORDS_IN).increment(1);
        let ts = msg.timestamp().to_millis().unwrap_or(0);
        match decode_deltas(msg.payload()) {
            Ok(DeltaInput::Delta {
                item,
                delta,
                event_time_ms,
                weight,
            }) => {
                metrics::histogram!(m::INPUT_DELAY_SECONDS)
                    .record((ts - event_time_ms).max(0) as f64 / 1000.0);
                self.windows.observe(
                    p,
                    msg.offset(),
                    ts,
                    Some((&item, delta, event_time_ms, weight)),
                )
            }
            // A correction's staleness counts from when it entered the log, not from its
            // snapshot, which may be hours old by design.
            Ok(DeltaInput::Correction {
                item,
                reason,
                correction,
            }) => {
                info!(%item, delta = correction.delta, id = %correction.id, %reason, cut = correction.cut_ms, after = correction.after_ms, "correction read");
                self.windows
                    .observe_correction(p, msg.offset(), ts, &item, correction)
            }
            Ok(DeltaInput::Tick) => self.windows.observe(p, msg.offset(), ts, None),
            Err(reason) => self.dead_letter(msg, reason)?,
        }
        Ok(())
    }

    fn dead_letter(&mut self, msg: &OwnedMessage, reason: String) -> Result<()> {
        warn!(partition = msg.partition(), offset = msg.offset(), %reason, "dead letter");
        metrics::counter!(m::DLQ_RECORDS, "stage" => "count", "kind" => "invalid").increment(1);
        // Keep the clock moving: the record's position still counts for the window.
        let ts = msg.timestamp().to_millis().unwrap_or(0);
        self.windows
            .observe(msg.partition(), msg.offset(), ts, None);
        let r = kafka::dead_letter(
            &self.dlq_topic,
            msg.key(),
            msg.payload(),
            &reason,
            "invalid",
            (&self.input.topic, msg.partition(), msg.offset()),
        );
        self.dlq.send(r).map_err(|(e, _)| e)?;
        // The dead letter must be durable before the offset that skips it is committed.
        self.dlq.flush(self.settings.kafka.request_timeout)?;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        let points = self.windows.resume_points();
        if points == self.committed {
            return Ok(());
        }
        let positions: Vec<(i32, i64, String)> = points
            .iter()
            .map(|(p, point)| {
                let clock = CountClock {
                    clock_ms: point.clock_ms,
                    window_ms: point.window_ms,
                    then: point.then.clone(),
                };
                (*p, point.offset, clock.metadata())
            })
            .collect();
        tokio::task::block_in_place(|| {
            group::commit(&self.input.consumer, &self.input.topic, &positions)
        })?;
        self.committed = points;
        Ok(())
    }
}

/// Before joining its group: while `likes rebuild` runs (or was killed before its end),
/// stage 2 waits, saying so. Returns true when stopped meanwhile.
async fn wait_for_rebuild(
    settings: &Settings,
    stop: &CancellationToken,
    health: &Health,
) -> Result<bool> {
    let session = cql::connect(&settings.cql).await?;
    let ks = &settings.cql.keyspace;
    let mut said = std::time::Instant::now() - Duration::from_secs(60);
    while let Some(since) = crate::store::recorded::rebuilding(&session, ks).await? {
        if said.elapsed() >= Duration::from_secs(30) {
            warn!(rebuild_started_ms = since, "a counter-table rebuild is under way (or was killed before its end: run `likes rebuild` again); stage 2 waits for it");
            said = std::time::Instant::now();
        }
        // Waiting on purpose is not a stall.
        health.beat();
        if !sleep_or_stop(Duration::from_secs(2), stop).await {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Runs stage 2 until `stop`. An error of Kafka's or Cassandra's (a restart, a timeout) ends
/// the incarnation, not the process: a new one starts after a backoff from the committed
/// offsets, and the fence skips every window the last one applied. Fatal errors end the
/// process.
pub async fn run(
    settings: &Settings,
    topology: &Topology,
    stop: CancellationToken,
    health: Health,
) -> Result<SinkStats> {
    let mut total = SinkStats::default();
    let mut backoff = Backoff::default();
    loop {
        let mut applied = 0;
        let result = match wait_for_rebuild(settings, &stop, &health).await {
            Ok(true) => break,
            Ok(false) => Count::new(settings, topology, health.clone()).await,
            Err(e) => Err(e),
        };
        let result = match result {
            Ok(mut c) => {
                let r = c.run(&stop).await;
                applied = c.sink.stats.windows_applied;
                total.add(&c.sink.stats);
                r
            }
            Err(e) => Err(e),
        };
        let Some(wait) = backoff.after("count", result, applied > 0, &stop)? else {
            break;
        };
        if !sleep_or_stop(wait, &stop).await {
            break;
        }
    }
    info!(sink = ?total, "count stopping");
    Ok(total)
}
