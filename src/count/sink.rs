//! The sink: closed windows onto `like_counts` through the LWT fence (docs/design.md, "The
//! fence"). The guarantee lives here, at the last write, so everything upstream may replay.
//!
//! Per item, one conditional write covers every pending window above the row's
//! `last_window`: their sum is added and `last_window` moves to the highest. A replayed
//! window is at or below `last_window` and is skipped. The compare-and-set is on the cached
//! (count, last_window); stage 2 is the only writer of an item, so it rarely misses, and a
//! miss returns the row to retry from. A sum below zero is stored as it is (the read path
//! serves it as 0) and counted in a metric that alerts: clamping the row would make a
//! transient -1 (an unlike's delta ahead of its like's, a correction) permanent once the +1
//! arrives (issue 23, item 8).
//!
//! `like_counts` is partitioned by counter shard, and the conditional writes of all items of
//! one shard go out as one conditional batch: one Paxos round fences up to `batch_rows` items,
//! each row still under its own condition. A single-row LWT costs the database about as much
//! CPU as a batch of dozens, and on a box shared with Kafka that CPU is the topology's limit.
//! A batch applies all or nothing; when any condition fails it returns the rows as they are,
//! and the batch is rebuilt from them (a replayed window then drops out by the fence).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use scylla::client::session::Session;
use tracing::warn;

use super::window::ClosedWindow;
use crate::error::{Error, Result};
use crate::records::Correction;
use crate::region::{Route, Routes};
use crate::runtime::metrics as m;
use crate::store::counts::{BatchValues, CounterRow, Fence, RowWrite};
use crate::topology::Topology;

/// What the sink did, cumulatively.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SinkStats {
    /// Conditional writes issued, applied or not (one per batch).
    pub lwts: u64,
    /// (item, window) pairs newly applied.
    pub windows_applied: u64,
    /// (item, window) pairs skipped because the row was already at or past them.
    pub fence_skips: u64,
    pub cas_retries: u64,
    pub clamps: u64,
    /// Windows and corrections not written: their item is homed by another region now, or
    /// they come from before its range came home here (docs/multi-region.md).
    pub handed_over: u64,
}

impl SinkStats {
    pub(crate) fn add(&mut self, o: &SinkStats) {
        self.lwts += o.lwts;
        self.windows_applied += o.windows_applied;
        self.fence_skips += o.fence_skips;
        self.cas_retries += o.cas_retries;
        self.clamps += o.clamps;
        self.handed_over += o.handed_over;
    }
}

pub struct Sink {
    session: Arc<Session>,
    fence: Fence,
    topology: Topology,
    cache: HashMap<String, CounterRow>,
    max_in_flight: usize,
    batch_rows: usize,
    audit: Option<std::sync::Mutex<std::fs::File>>,
    /// With home regions: which items this region's count writes (see `keep_homed`).
    routes: Option<Routes>,
    pub stats: SinkStats,
}

/// How long a write waits for its item's range to open here (a move settling, a view of the
/// range table read again) before the round fails and the stage starts over.
const HOLD_LIMIT: Duration = Duration::from_secs(60);

/// One item's pending windows: window end time (ms on the log clock) → (delta, earliest event
/// time). The fence compares end times, never window indices: a window length changed
/// between deployments then neither freezes counts (shorter ids looking "applied") nor
/// re-applies a replayed window (longer ids looking new).
type Pending = BTreeMap<i64, (i64, i64)>;

/// One item to bring up to date.
struct Job {
    item: String,
    pending: Pending,
    /// Corrections by window end, in log order: each applies only after the last one the
    /// row has (`after_ms` = the row's last_correction), and then becomes it.
    corrections: Vec<(i64, Correction)>,
    /// The row as last seen; `known` says whether `None` means "no row" or "not looked".
    row: Option<CounterRow>,
    known: bool,
    done: bool,
}

/// The write planned for one job in the current attempt.
struct Planned {
    job: usize,
    next: i64,
    top: i64,
    fresh: Vec<(i64, i64, i64)>,
    clamped: bool,
    /// The row's last_correction after this write.
    last_correction: Option<i64>,
    /// The corrections this write decides: (id, delta, applied).
    corrections: Vec<(String, i64, bool)>,
}

/// The outcome of writing one shard.
#[derive(Default)]
struct Outcome {
    rows: Vec<(String, Option<CounterRow>)>,
    stats: SinkStats,
    /// (item, window end) of every window applied (not skipped by the fence).
    applied: Vec<(String, i64)>,
}

impl Sink {
    pub async fn new(
        session: Arc<Session>,
        keyspace: &str,
        topology: &Topology,
        max_in_flight: usize,
        batch_rows: usize,
    ) -> Result<Self> {
        Ok(Self {
            fence: Fence::prepare(&session, keyspace).await?,
            session,
            topology: topology.clone(),
            cache: HashMap::new(),
            max_in_flight: max_in_flight.max(1),
            batch_rows: batch_rows.max(1),
            audit: None,
            routes: None,
            stats: SinkStats::default(),
        })
    }

    /// Writes only the items `routes` says this region homes (docs/multi-region.md).
    pub fn homed_by(&mut self, routes: Routes) {
        self.routes = Some(routes);
    }

    /// Appends a line per applied write to `path`: `item<TAB>w1,w2,..<TAB>delta`.
    pub fn audit_to(&mut self, path: &std::path::Path) -> Result<()> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(Error::io(format!("count.audit_log {}", path.display())))?;
        self.audit = Some(std::sync::Mutex::new(f));
        Ok(())
    }

    /// Applies closed windows; returns when every one is applied (or skipped by the fence).
    pub async fn apply(&mut self, windows: Vec<ClosedWindow>) -> Result<()> {
        let mut by_item: HashMap<String, Pending> = HashMap::new();
        let mut corrections: HashMap<String, Vec<(i64, Correction)>> = HashMap::new();
        // (item, window end) → (flips, their mean event time): staleness is recorded per flip.
        let mut weights: HashMap<(String, i64), (u64, i64)> = HashMap::new();
        for w in windows {
            for (item, c) in w.corrections {
                corrections.entry(item).or_default().push((w.end_ms, c));
            }
            for (item, d) in w.items {
                let wt = weights.entry((item.clone(), w.end_ms)).or_insert((0, 0));
                let events = wt.0 + d.events;
                wt.1 = ((i128::from(wt.1) * i128::from(wt.0)
                    + i128::from(d.mean_event_time_ms()) * i128::from(d.events))
                    / i128::from(events.max(1))) as i64;
                wt.0 = events;
                let e = by_item
                    .entry(item)
                    .or_default()
                    .entry(w.end_ms)
                    .or_insert((0, d.event_time_ms));
                e.0 += d.delta;
                e.1 = e.1.min(d.event_time_ms);
            }
        }
        let mut by_shard: BTreeMap<i32, Vec<Job>> = BTreeMap::new();
        for (item, pending) in by_item {
            let row = self.cache.get(&item).copied();
            by_shard
                .entry(self.topology.counter_shard(&item))
                .or_default()
                .push(Job {
                    corrections: corrections.remove(&item).unwrap_or_default(),
                    item,
                    pending,
                    row,
                    known: row.is_some(),
                    done: false,
                });
        }
        // Each shard's outcome is taken as it lands, not after the slowest shard: a flip's
        // staleness is when its row was written (readers see it then), so a slow shard no
        // longer adds its time to every other shard's flips (issue 45, item 4).
        let this = &*self;
        let mut landing = stream::iter(by_shard)
            .map(|(shard, jobs)| this.apply_shard(shard, jobs))
            .buffer_unordered(self.max_in_flight);
        let mut rows = Vec::new();
        let mut stats = SinkStats::default();
        let mut failed = None;
        while let Some(o) = landing.next().await {
            let o = match o {
                Ok(o) => o,
                Err(e) => {
                    // The other shards still finish: their rows are written either way, and
                    // the cache must know them (a retry bounces off the fence).
                    failed.get_or_insert(e);
                    continue;
                }
            };
            let now = crate::runtime::clock::now_ms();
            for key in &o.applied {
                if let Some(&(events, mean)) = weights.get(key) {
                    metrics::histogram!(m::STALENESS_SECONDS).record_many(
                        now.saturating_sub(mean).max(0) as f64 / 1000.0,
                        events as usize,
                    );
                }
            }
            metrics::counter!(m::SINK_LWTS).increment(o.stats.lwts);
            metrics::counter!(m::WINDOWS_APPLIED).increment(o.stats.windows_applied);
            metrics::counter!(m::FENCE_SKIPS).increment(o.stats.fence_skips);
            metrics::counter!(m::CAS_RETRIES).increment(o.stats.cas_retries);
            metrics::counter!(m::CLAMPS).increment(o.stats.clamps);
            metrics::counter!(m::HANDED_OVER).increment(o.stats.handed_over);
            stats.add(&o.stats);
            rows.extend(o.rows);
        }
        drop(landing);
        for (item, row) in rows {
            match row {
                Some(r) => self.cache.insert(item, r),
                None => self.cache.remove(&item),
            };
        }
        self.stats.add(&stats);
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One shard's items, `batch_rows` at a time. A shard's batches run one after another:
    /// concurrent Paxos rounds on one partition would only contend.
    async fn apply_shard(&self, shard: i32, mut jobs: Vec<Job>) -> Result<Outcome> {
        let mut out = Outcome::default();
        for chunk in jobs.chunks_mut(self.batch_rows) {
            self.apply_chunk(shard, chunk, &mut out).await?;
        }
        out.rows = jobs.into_iter().map(|j| (j.item, j.row)).collect();
        Ok(out)
    }

    async fn apply_chunk(&self, shard: i32, jobs: &mut [Job], out: &mut Outcome) -> Result<()> {
        let mut resends = 0;
        // The audit id of a batch whose answer was lost, while it is sent again.
        let mut resending: Option<Option<String>> = None;
        for _attempt in 0..20 {
            // Checked on each attempt, right before its batch: the lease that lets this write
            // start is the one a move waits out (docs/multi-region.md, "Where the epoch
            // check lives").
            self.keep_homed(jobs, &mut out.stats).await?;
            let planned = plan(jobs, &mut out.stats);
            if planned.is_empty() {
                return Ok(());
            }
            let (mut batch, mut values) = (Fence::batch(), BatchValues::new());
            for p in &planned {
                let job = &jobs[p.job];
                let to = CounterRow {
                    count: p.next,
                    last_window: p.top,
                    last_correction: p.last_correction,
                };
                let write = RowWrite {
                    shard,
                    item: &job.item,
                    seen: job.row,
                    to,
                    as_of: p.top,
                    correcting: !p.corrections.is_empty(),
                };
                self.fence.append(&mut batch, &mut values, &write);
            }
            out.stats.lwts += 1;
            // The audit trail records the batch before it is sent and its outcome after, so
            // a kill while it is in flight leaves it "unknown" rather than lost (see `audit`).
            // A resend is the same batch (no answer changed the rows it was planned from), so
            // it keeps its record: audited again, one application would read as several.
            let (audited, after_lost) = match resending.take() {
                Some(id) => (id, true),
                None => (self.audit_planned(shard, jobs, &planned)?, false),
            };
            let outcome = match lose_answer(Fence::send(&self.session, &batch, values).await) {
                Ok(outcome) => outcome,
                // The batch's answer is lost: it applied or not, nobody knows. Sending it again
                // tells, since the fence conditions it on the row as this batch found it: had
                // it applied, the resend meets the row it wrote, misses, and its windows bounce
                // off the fence below. So a timed-out write is retried here, in place, rather
                // than restarting the stage from its last commit, which costs a restart backoff
                // (1-10 s) and re-reads every window since (docs/architecture.md, stage 2).
                // Its audit record stays without a verdict, like a batch cut off by a kill.
                Err(e) if e.is_retryable() && resends < MAX_RESENDS => {
                    resends += 1;
                    resending = Some(audited);
                    metrics::counter!(m::SINK_RESENDS).increment(1);
                    warn!(shard, resends, error = %e, "conditional batch unanswered; sending it again");
                    tokio::time::sleep(RESEND_BACKOFF * resends).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(id) = audited {
                match (&outcome, after_lost) {
                    (None, _) => self.audit(&format!("A\t{id}\n"))?,
                    (Some(_), false) => self.audit(&format!("F\t{id}\n"))?,
                    // Bounced after a lost answer: an earlier send may have applied it, so it
                    // keeps no verdict, like a batch cut off by a kill.
                    (Some(_), true) => {}
                }
            }
            match outcome {
                None => {
                    for p in planned {
                        let job = &mut jobs[p.job];
                        let s = &mut out.stats;
                        s.windows_applied += p.fresh.len() as u64;
                        s.fence_skips += (job.pending.len() - p.fresh.len()) as u64;
                        if p.clamped {
                            s.clamps += 1;
                            warn!(item = %job.item, window = p.top, count = p.next, "count went negative (kept on the row as the true sum; served as 0)");
                        }
                        for (id, delta, applied) in &p.corrections {
                            let outcome = if *applied { "applied" } else { "refused" };
                            metrics::counter!(m::CORRECTIONS, "outcome" => outcome).increment(1);
                            if *applied {
                                tracing::info!(item = %job.item, %id, delta, "correction applied");
                            } else {
                                // Sent twice, or overtaken by a newer recount of the item: the
                                // newer one accounts for everything this one would have fixed.
                                warn!(item = %job.item, %id, delta, "correction refused: the row's last correction is not the one it was computed after");
                            }
                        }
                        out.applied
                            .extend(p.fresh.iter().map(|&(w, _, _)| (job.item.clone(), w)));
                        job.row = Some(CounterRow {
                            count: p.next,
                            last_window: p.top,
                            last_correction: p.last_correction,
                        });
                        job.done = true;
                    }
                }
                Some(current) => {
                    out.stats.cas_retries += 1;
                    for p in planned {
                        let job = &mut jobs[p.job];
                        job.row = current.get(&job.item).copied();
                        job.known = true;
                    }
                }
            }
        }
        Err(Error::CqlTransient(format!(
            "like_counts shard {shard}: conditional batch kept failing"
        )))
    }
}

/// Resends of one chunk's unanswered batch before the stage gives up and starts over.
const MAX_RESENDS: u32 = 5;
/// The wait before the n-th resend is n times this.
const RESEND_BACKOFF: Duration = Duration::from_millis(100);

/// Fault-test hook (`count-sink-answer-lost`): the batch was sent, and applied or not, and its
/// answer is lost as a timeout loses it.
fn lose_answer<T>(sent: Result<T>) -> Result<T> {
    fail::fail_point!("count-sink-answer-lost", |_| Err(Error::Timeout(
        Duration::ZERO,
        "injected: the conditional batch's answer was lost".into()
    )));
    sent
}

/// The write of every job not yet done: the sum of its windows above the row's last_window.
/// Jobs with nothing above it are done (their windows bounce off the fence).
fn plan(jobs: &mut [Job], stats: &mut SinkStats) -> Vec<Planned> {
    let mut planned = Vec::new();
    for (i, job) in jobs.iter_mut().enumerate() {
        if job.done {
            continue;
        }
        let last = job.row.map(|r| r.last_window).unwrap_or(i64::MIN);
        let fresh: Vec<(i64, i64, i64)> = job
            .pending
            .range(last.saturating_add(1)..)
            .map(|(&w, &(d, t))| (w, d, t))
            .collect();
        if job.known && fresh.is_empty() {
            stats.fence_skips += job.pending.len() as u64;
            job.done = true;
            continue;
        }
        let mut n: i64 = fresh.iter().map(|&(_, d, _)| d).sum();
        // The correction fence: in log order, a correction applies only after the one the
        // row has last, and then becomes it. A replayed one is in a window the fence skips.
        // Its cut must also be later than the row's last correction's: a recount at an
        // earlier cut cannot take a later correction out of its count at the cut (the
        // correction sits after that cut), so it would see a false drift (issue 23, two
        // reconcile runs at once). Refused, reconcile tries the item again at a later cut.
        let mut last_correction = job.row.and_then(|r| r.last_correction);
        let mut corrections = Vec::new();
        for (w, c) in &job.corrections {
            if *w <= last {
                continue;
            }
            let after = last_correction.unwrap_or(0);
            let applies = c.after_ms == after && c.cut_ms > after;
            if applies {
                n = n.saturating_add(c.delta);
                last_correction = Some(c.cut_ms);
            }
            corrections.push((c.id.clone(), c.delta, applies));
        }
        let top = fresh.last().map(|&(w, _, _)| w).unwrap_or(last);
        let next = job.row.map(|r| r.count).unwrap_or(0).saturating_add(n);
        planned.push(Planned {
            job: i,
            next,
            top,
            fresh,
            clamped: next < 0,
            last_correction,
            corrections,
        });
    }
    planned
}

impl Sink {
    /// With home regions, the counter rows of a range are written by its home's count only,
    /// and only with what happened since the range came home here: the old home's count
    /// stops at its lease, like its writers, and what it had not written by then is in the
    /// move's recount, sent through the new home's pipeline (docs/multi-region.md, "Stage-1
    /// state after a move"). So an item homed elsewhere is handed over (nothing written, the
    /// cached row forgotten), and windows of flips from before the range came home here, or
    /// corrections computed before it, are dropped. An item whose range is closed here for now
    /// (moving here, or a view of the range table past its lease) holds the batch until it
    /// opens.
    async fn keep_homed(&self, jobs: &mut [Job], stats: &mut SinkStats) -> Result<()> {
        let Some(routes) = &self.routes else {
            return Ok(());
        };
        let waiting = Instant::now();
        loop {
            let mut closed = None;
            for job in jobs.iter_mut().filter(|j| !j.done) {
                match routes.route(&job.item) {
                    Route::Here(home) => {
                        let before = job.pending.len() + job.corrections.len();
                        job.corrections.retain(|(_, c)| c.cut_ms >= home.since_ms);
                        // A kept correction keeps its window, which carries it past the fence.
                        let carried: Vec<i64> = job.corrections.iter().map(|(w, _)| *w).collect();
                        job.pending
                            .retain(|w, &mut (_, at)| at >= home.since_ms || carried.contains(w));
                        let left = job.pending.len() + job.corrections.len();
                        stats.handed_over += (before - left) as u64;
                        if left == 0 {
                            job.done = true;
                        }
                    }
                    Route::Elsewhere { .. } => {
                        stats.handed_over += (job.pending.len() + job.corrections.len()) as u64;
                        job.done = true;
                        job.row = None;
                        job.known = false;
                    }
                    Route::Closed(why) => closed = Some(why),
                }
            }
            let Some(why) = closed else {
                return Ok(());
            };
            if waiting.elapsed() > HOLD_LIMIT {
                return Err(Error::CqlTransient(format!(
                    "counter rows held for {HOLD_LIMIT:?}: {why}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Appends to the audit trail: `P<TAB>batch<TAB>item<TAB>w1,w2,..<TAB>delta` per planned
    /// row before a batch is sent, then `A<TAB>batch` (applied) or `F<TAB>batch` (a condition
    /// failed) once its answer is in. A batch with neither was in flight at a kill: it applied
    /// or not, and the fence tells which, because a batch that did not apply is re-planned
    /// with the same windows after the restart, and one that did is fenced off and never is.
    /// Records a batch's planned rows under a fresh batch id; None when auditing is off, so
    /// the sink formats nothing then.
    fn audit_planned(
        &self,
        shard: i32,
        jobs: &[Job],
        planned: &[Planned],
    ) -> Result<Option<String>> {
        if self.audit.is_none() {
            return Ok(None);
        }
        let id = format!("{shard}-{:016x}", rand::random::<u64>());
        let mut text = String::new();
        for p in planned {
            let ws: Vec<String> = p.fresh.iter().map(|&(w, _, _)| w.to_string()).collect();
            let n: i64 = p.fresh.iter().map(|&(_, d, _)| d).sum();
            text.push_str(&format!(
                "P\t{id}\t{}\t{}\t{n}\n",
                jobs[p.job].item,
                ws.join(",")
            ));
        }
        self.audit(&text)?;
        Ok(Some(id))
    }

    fn audit(&self, text: &str) -> Result<()> {
        let Some(f) = &self.audit else { return Ok(()) };
        use std::io::Write;
        // One write per call on an O_APPEND file: a kill leaves whole records.
        f.lock()
            .unwrap()
            .write_all(text.as_bytes())
            .map_err(Error::io("writing the audit log"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(count: i64, last_window: i64, last_correction: Option<i64>) -> Option<CounterRow> {
        Some(CounterRow {
            count,
            last_window,
            last_correction,
        })
    }

    fn job(pending: &[(i64, i64)], row: Option<CounterRow>, known: bool) -> Job {
        Job {
            item: "i".into(),
            pending: pending.iter().map(|&(w, d)| (w, (d, w - 500))).collect(),
            corrections: Vec::new(),
            row,
            known,
            done: false,
        }
    }

    #[test]
    fn a_new_item_sums_every_window_and_fences_at_the_last() {
        let mut stats = SinkStats::default();
        let mut jobs = [job(&[(1_000, 2), (2_000, 3)], None, false)];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].next, p[0].top, p[0].fresh.len()), (5, 2_000, 2));
        assert!(!p[0].clamped);
    }

    #[test]
    fn windows_at_or_below_the_fence_are_skipped() {
        let mut stats = SinkStats::default();
        // The row has applied up to window 2000: only 3000 is new.
        let mut jobs = [job(
            &[(1_000, 2), (2_000, 3), (3_000, 4)],
            row(10, 2_000, None),
            true,
        )];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!((p[0].next, p[0].top), (14, 3_000));
        assert_eq!(p[0].fresh.iter().map(|f| f.0).collect::<Vec<_>>(), [3_000]);
    }

    #[test]
    fn a_known_row_past_every_window_is_done_without_a_write() {
        let mut stats = SinkStats::default();
        let mut jobs = [job(&[(1_000, 2), (2_000, 3)], row(5, 2_000, None), true)];
        assert!(plan(&mut jobs, &mut stats).is_empty());
        assert!(jobs[0].done);
        assert_eq!(
            stats.fence_skips, 2,
            "a replayed window bounces off the fence"
        );
    }

    #[test]
    fn an_unknown_row_is_always_written_so_its_answer_tells_the_truth() {
        // Not looked up yet: even with nothing fresh past a guessed row, the CAS is sent.
        let mut stats = SinkStats::default();
        let mut jobs = [job(&[(1_000, 2)], row(2, 1_000, None), false)];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].next, p[0].top, p[0].fresh.len()), (2, 1_000, 0));
    }

    #[test]
    fn a_negative_sum_is_kept_and_flagged_so_a_later_plus_one_restores_it() {
        let mut stats = SinkStats::default();
        let mut jobs = [job(&[(2_000, -3)], row(1, 1_000, None), true)];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!(p[0].next, -2, "the true sum, not 0");
        assert!(p[0].clamped);
        // The like whose unlike came first: back to the exact count.
        let mut jobs = [job(&[(3_000, 3)], row(-2, 2_000, None), true)];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!(p[0].next, 1);
        assert!(!p[0].clamped);
    }

    fn corrected(row: Option<CounterRow>, corrections: &[(i64, i64, i64, i64)]) -> Job {
        let mut j = job(&[], row, true);
        for &(w, delta, cut, after) in corrections {
            j.pending.insert(w, (0, w - 500));
            j.corrections.push((
                w,
                Correction {
                    id: format!("c{cut}"),
                    delta,
                    cut_ms: cut,
                    after_ms: after,
                },
            ));
        }
        j
    }

    #[test]
    fn a_correction_applies_after_the_one_it_was_computed_after_and_becomes_it() {
        let mut stats = SinkStats::default();
        let mut jobs = [corrected(row(10, 1_000, None), &[(2_000, 3, 7_000, 0)])];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!((p[0].next, p[0].last_correction), (13, Some(7_000)));
        assert_eq!(p[0].corrections, [("c7000".to_string(), 3, true)]);
    }

    #[test]
    fn a_correction_sent_twice_or_overtaken_is_refused() {
        let mut stats = SinkStats::default();
        // The same correction twice in a row: the second follows 0, the row now has 7000.
        let mut jobs = [corrected(
            row(10, 1_000, None),
            &[(2_000, 3, 7_000, 0), (3_000, 3, 7_000, 0)],
        )];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!((p[0].next, p[0].top), (13, 3_000));
        assert_eq!(p[0].corrections[1], ("c7000".to_string(), 3, false));
        // A copy arriving after the row took it: refused, the window still moves.
        let mut jobs = [corrected(
            row(13, 2_000, Some(7_000)),
            &[(3_000, 3, 7_000, 0)],
        )];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!((p[0].next, p[0].last_correction), (13, Some(7_000)));
    }

    /// Two reconcile runs at once: the later cut's correction lands first; the earlier cut's
    /// run then reads the row holding it (after = the later cut) and sees a false drift.
    /// Its correction must be refused, not added.
    #[test]
    fn a_correction_from_an_earlier_cut_than_the_rows_last_is_refused() {
        let mut stats = SinkStats::default();
        let mut jobs = [corrected(
            row(13, 2_000, Some(9_000)),
            &[(3_000, -3, 7_000, 9_000)],
        )];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!((p[0].next, p[0].last_correction), (13, Some(9_000)));
        assert_eq!(p[0].corrections, [("c7000".to_string(), -3, false)]);
        // The same run's correction from a later cut applies.
        let mut jobs = [corrected(
            row(13, 2_000, Some(9_000)),
            &[(3_000, -3, 11_000, 9_000)],
        )];
        let p = plan(&mut jobs, &mut stats);
        assert_eq!((p[0].next, p[0].last_correction), (10, Some(11_000)));
    }

    #[test]
    fn a_replayed_correction_bounces_off_the_window_fence() {
        let mut stats = SinkStats::default();
        let mut jobs = [corrected(
            row(13, 2_000, Some(7_000)),
            &[(2_000, 3, 7_000, 0)],
        )];
        assert!(plan(&mut jobs, &mut stats).is_empty());
    }

    #[test]
    fn done_jobs_are_not_planned_again() {
        let mut stats = SinkStats::default();
        let mut jobs = [
            job(&[(1_000, 1)], None, false),
            job(&[(1_000, 1)], None, false),
        ];
        jobs[0].done = true;
        let p = plan(&mut jobs, &mut stats);
        assert_eq!(p.iter().map(|p| p.job).collect::<Vec<_>>(), [1]);
    }
}
