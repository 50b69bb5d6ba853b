//! `likes erase`: account erasure (docs/design.md, "Corrections, erasure, replay": walk
//! `edges_by_user` and unlike through the normal write path, rate-limited; no special
//! repair machinery).
//!
//! 1. **Unlike.** Each LIKED edge of the user is unliked by the write path the API uses
//!    (`write::Writer`), marked
//!    `SOURCE_ERASURE`, under the request key `e:<erasure id>-<op_id>` (the operators'
//!    namespace; the op_id names the like taken back), so the count drops through the
//!    pipeline and a re-run replays instead of writing again. The
//!    walk goes in item order and checkpoints its position on the erasure record: a killed
//!    job resumes there.
//! 2. **Purge,** `ops.erase_purge_after` later (past the dedupe horizon, see the config):
//!    the user's edge rows whose last flip is past the horizon too (each deleted by
//!    compare-and-set on the op_id it was read at), their retraction records, their
//!    `edges_by_user` rows one by one, and last, once a walk finds no row left, the user id
//!    on the erasure record. Until then the edge rows hold the user id and the versions
//!    exactness needs: a row deleted while stage 1 still remembers its edge would restart at
//!    op_id 1, and its next like would be dropped as stale.
//!
//! From the moment the erasure is requested the API refuses the user's writes (403): a
//! session token can outlive its account (`erased_users`, store/erasures.rs).
//!
//! **With home regions** each region's job unlikes the likes of the items it homes, and
//! leaves a like of another region's item to that region's job (a write there goes through
//! its home, docs/multi-region.md). A walk that left any starts over at the next run; the
//! erasure is unliked once a walk, in any region, finds no like of the user left.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::progress::Progress;
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::runtime::clock::now_ms;
use crate::schema::v1::Source;
use crate::store::erasures::{Erasure, PURGED, UNLIKED, UNLIKING};
use crate::store::Stores;
use crate::topology::Topology;
use crate::write::{Write, WriteError, Writer};
/// Unlikes in flight at once (the rate bounds them too).
const CONCURRENCY: usize = 32;

/// What one run did.
#[derive(Debug, Default)]
pub struct EraseReport {
    pub erasures: Vec<Erasure>,
    /// Per erasure, the likes its walk left to their items' home regions, and those regions.
    pub left: Vec<(String, u64, std::collections::BTreeSet<String>)>,
}

impl std::fmt::Display for EraseReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for e in &self.erasures {
            writeln!(
                f,
                "{}  {:<9} items walked {}, unliked {}{}",
                e.id,
                e.state,
                e.walked,
                e.unliked,
                if e.state == UNLIKED {
                    " (purge due after ops.erase_purge_after)"
                } else {
                    ""
                }
            )?;
        }
        for (id, n, homes) in &self.left {
            writeln!(
                f,
                "{id}  {n} likes left to the items' home regions {homes:?}: run `likes erase` there (this walk starts over next time)"
            )?;
        }
        write!(f, "{} erasure(s) worked", self.erasures.len())
    }
}

/// Paces requests at `rate` per second across tasks.
struct Pace {
    every: Duration,
    next: Mutex<Instant>,
}

impl Pace {
    fn new(rate: f64) -> Self {
        Self {
            every: Duration::from_secs_f64(1.0 / rate),
            next: Mutex::new(Instant::now()),
        }
    }

    async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().await;
            // Behind schedule (a page boundary, a checkpoint), it catches up at most a
            // second's worth: the configured rate holds on average, bursts stay bounded.
            let at = (*next).max(Instant::now() - Duration::from_secs(1));
            *next = at + self.every;
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

/// What the job works with: the write path (its unlikes are ordinary writes) and the job's
/// settings.
pub struct Eraser {
    writer: Writer,
    buckets: u32,
    rate: f64,
    /// How old an erasure's unlikes, and each row's last flip, must be before the purge:
    /// `ops.erase_purge_after` (past the dedupe horizon), never under two relay ages.
    purge_wait: Duration,
    /// How long after an erasure's request its walk waits: until every API pod's set of
    /// erased accounts refuses the user (a set is trusted five refreshes), and a write one
    /// let through before that has sent its compare-and-set (its deadline and one CQL
    /// timeout), on clocks up to the bound apart (docs/exactness.md, "Erasure"). Zero
    /// without the sets (`api.erased_refresh = 0s`).
    settle: Duration,
}

impl Eraser {
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<Self> {
        // The job's unlikes are operators', never checked against erased accounts: its writer
        // loads no set of them (a full read of `erased_users` at every start).
        let mut own = settings.clone();
        own.api.erased_refresh = Duration::ZERO;
        let (writer, _session) = Writer::connect(&own, topology).await?;
        Ok(Self {
            writer,
            buckets: topology.buckets,
            rate: settings.ops.erase_rate,
            purge_wait: settings
                .ops
                .erase_purge_after
                .max(settings.api.relay_min_age * 2),
            settle: if settings.api.erased_refresh.is_zero() {
                Duration::ZERO
            } else {
                settings.api.erased_refresh * 5
                    + settings.api.write_deadline
                    + settings.cql.request_timeout
                    + settings.cql.max_clock_skew * 2
            },
        })
    }

    fn store(&self) -> &Stores {
        self.writer.store()
    }

    fn bucket(&self, user: &str) -> i32 {
        crate::hash::bucket_of(user, self.buckets) as i32
    }
}

/// Works the queue: every erasure not purged (or only `user`'s, requested here if needed).
pub async fn run(job: &Eraser, user: Option<&str>) -> Result<EraseReport> {
    let store = &job.store().erasures;
    let queue = match user {
        Some(u) => vec![store.request(u, now_ms()).await?],
        None => store
            .all()
            .await?
            .into_iter()
            .filter(|e| e.state != PURGED)
            .collect(),
    };
    info!(erasures = queue.len(), "erase: working the queue");
    let pace = Pace::new(job.rate);
    let mut report = EraseReport::default();
    for e in queue {
        let mut left = Left::default();
        let e = work(job, &pace, e, &mut left).await?;
        if left.likes > 0 {
            report.left.push((e.id.clone(), left.likes, left.homes));
        }
        report.erasures.push(e);
    }
    // Its unlikes' acks and outbox entries, so that the relay does not publish them again.
    job.writer.settle(job.writer.publish_wait()).await;
    Ok(report)
}

/// The likes a walk left to other regions (with home regions).
#[derive(Default)]
struct Left {
    likes: u64,
    homes: std::collections::BTreeSet<String>,
}

/// What one unlike did.
enum Unlike {
    /// Whether this request flipped the edge (false: not liked, or a replay).
    Done(bool),
    /// LIKED, and its item homed by another region: that region's job unlikes it.
    LeftTo(String),
}

async fn work(job: &Eraser, pace: &Pace, mut e: Erasure, left: &mut Left) -> Result<Erasure> {
    let store = &job.store().erasures;
    let Some(user) = e.user_id.clone() else {
        return Ok(e);
    };
    if e.state != UNLIKED {
        // A walk that began before every pod refused the user could pass an item before a
        // like the pod let through lands on it: that like would stand until the purge.
        let wait = e.requested_at_ms + job.settle.as_millis() as i64 - now_ms();
        if wait > 0 {
            info!(id = %e.id, wait_ms = wait, "erase: waiting for every API pod to refuse the account before the walk");
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        e.state = UNLIKING.into();
        let total = job.store().edges.user_item_count(&user).await?;
        let mut progress = Progress::new(format!("{}: items walked", e.id), Some(total as u64));
        progress.add(e.walked as u64);
        info!(id = %e.id, total, resumed_after = ?e.cursor, "erase: unliking");
        loop {
            let after = e.cursor.clone().unwrap_or_default();
            let items = job.store().edges.user_items_after(&user, &after).await?;
            let Some(last) = items.last().cloned() else {
                break;
            };
            let results: Vec<Result<Unlike>> = stream::iter(&items)
                .map(|item| {
                    let (user, id) = (&user, &e.id);
                    async move {
                        pace.wait().await;
                        unlike(job, user, item, id).await
                    }
                })
                .buffered(CONCURRENCY)
                .collect()
                .await;
            for r in results {
                match r? {
                    Unlike::Done(flipped) => e.unliked += i64::from(flipped),
                    Unlike::LeftTo(home) => {
                        left.likes += 1;
                        left.homes.insert(home);
                    }
                }
            }
            e.walked += items.len() as i64;
            e.cursor = Some(last);
            store.checkpoint(&e, now_ms()).await?;
            progress.add(items.len() as u64);
            fail::fail_point!("erase-after-checkpoint", |_| Err(Error::Injected(
                "erase-after-checkpoint"
            )));
        }
        progress.finish();
        if left.likes > 0 {
            // Not done until a walk finds none: the next run, here or there, walks again.
            warn!(id = %e.id, left = left.likes, homes = ?left.homes, "erase: likes of items homed in other regions are left to their jobs; this walk starts over at the next run");
            e.cursor = None;
            e.walked = 0;
            store.checkpoint(&e, now_ms()).await?;
            return Ok(e);
        }
        store.mark_unliked(&e.id, now_ms()).await?;
        e = store.get(&e.id).await?.unwrap_or(e);
        info!(id = %e.id, walked = e.walked, unliked = e.unliked, "erase: every like taken back");
    }
    let wait = job.purge_wait;
    let due = e
        .unliked_at_ms
        .unwrap_or(i64::MAX)
        .saturating_add(wait.as_millis() as i64);
    if now_ms() < due {
        info!(id = %e.id, due_in = ?Duration::from_millis((due - now_ms()).max(0) as u64), "erase: purge not due yet");
        return Ok(e);
    }
    purge(job, &e, &user).await?;
    Ok(store.get(&e.id).await?.unwrap_or(e))
}

/// Unlikes one edge if it is LIKED; whether this request flipped it. The request key names
/// the like it takes back (`<erasure id>-<op_id>`): a retry of this unlike replays, and a
/// like made again later is a new op, taken back by a new request rather than answered by
/// the old one's replay.
async fn unlike(job: &Eraser, user: &str, item: &str, id: &str) -> Result<Unlike> {
    let Some(edge) = job.store().edges.read(item, job.bucket(user), user).await? else {
        return Ok(Unlike::Done(false));
    };
    if !edge.liked {
        return Ok(Unlike::Done(false));
    }
    let key = format!("{id}-{}", edge.op_id);
    let write = Write {
        source: Source::Erasure,
        ..Write::by_user(user, item, false, &key)
    };
    let answer = match job.writer.write(&write).await {
        Ok(answer) => answer,
        Err(WriteError::NotHome { home, .. }) => return Ok(Unlike::LeftTo(home)),
        Err(e) => return Err(unlike_error(e, item, id)),
    };
    Ok(Unlike::Done(answer.changed))
}

/// An unlike's failure as the job's error: what to retry, and what to stop on.
fn unlike_error(e: WriteError, item: &str, id: &str) -> Error {
    match e {
        WriteError::Dependency(e) => e,
        // Its deadline or a contended edge: the next run replays or finishes it.
        WriteError::RetryWithSameKey(m) => {
            Error::CqlTransient(format!("unliking {item} for erasure {id}: {m}"))
        }
        // A range moving, this region's view of the range table past its lease, or this
        // host's clock off until it is back: later.
        WriteError::RangeClosed(m) | WriteError::ClockOff(m) => {
            Error::CqlTransient(format!("unliking {item} for erasure {id}: {m}"))
        }
        // Neither can happen to an operator's unlike (its keys are its own, and the erasure
        // check is for users' sessions); if one does, the edge moved under the job.
        other => Error::Raced(format!("unliking {item} for erasure {id}: {other}")),
    }
}

async fn purge(job: &Eraser, e: &Erasure, user: &str) -> Result<()> {
    let bucket = job.bucket(user);
    let store = job.store();
    // First a check that nothing was liked again since the walk (a session that outlived
    // the account): such a like is taken back and the purge waits its turn again, so that
    // no row is deleted while its unlike may still be on its way through the relay.
    let mut items: Vec<String> = Vec::new();
    loop {
        let after = items.last().map_or("", String::as_str);
        let page = store.edges.user_items_after(user, after).await?;
        if page.is_empty() {
            break;
        }
        items.extend(page);
    }
    let (mut relikes, mut elsewhere) = (0, 0);
    for item in &items {
        match unlike(job, user, item, &e.id).await? {
            Unlike::Done(flipped) => relikes += i64::from(flipped),
            Unlike::LeftTo(_) => elsewhere += 1,
        }
    }
    if elsewhere > 0 {
        // Liked again at another region's item: its job takes it back, then a purge here or
        // there goes on.
        warn!(id = %e.id, elsewhere, "erase: likes of items homed in other regions were made after the walk; the purge waits for their jobs");
        return Ok(());
    }
    if relikes > 0 {
        warn!(id = %e.id, relikes, "erase: likes made after the walk were taken back; the purge waits again");
        store.erasures.mark_unliked(&e.id, now_ms()).await?;
        return Ok(());
    }
    // A row is purged only once its own last flip is `purge_wait` old (past stage 1's
    // horizon, see the config): deleted earlier, a later like would restart at op 1 while
    // stage 1 still remembers the old op, and be dropped as stale (count -1 for good). The
    // erasure's unlike is not the row's last flip when a like and an unlike came after it.
    let settle_ms = job.purge_wait.as_millis() as i64;
    let mut young = 0;
    info!(id = %e.id, rows = items.len(), "erase: purging the user's rows");
    for item in &items {
        if let Some(edge) = store.edges.read(item, bucket, user).await? {
            if edge.liked {
                return Err(Error::Raced(format!(
                    "erasure {}: {item} was liked again during the purge; run again",
                    e.id
                )));
            }
            if edge.updated_at_ms + settle_ms > now_ms() {
                young += 1;
                continue;
            }
            if !store
                .edges
                .delete_if(item, bucket, user, edge.op_id)
                .await?
            {
                return Err(Error::Raced(format!(
                    "erasure {}: {item}'s edge changed during the purge; run again",
                    e.id
                )));
            }
        }
        store.retractions.delete(item, user).await?;
        // One row at a time, never the partition: a row written during the purge (a session
        // that outlived the account, before the API refused it) survives to the re-walk.
        store.edges.unindex_for_user(user, item).await?;
    }
    // Fault-test hook: a write that passed the API's check before the erasure was
    // requested lands its index row now.
    fail::fail_point!("erase-before-rewalk", |_| Err(Error::Injected(
        "erase-before-rewalk"
    )));
    // Purged only when a walk finds nothing left: the record then forgets the user.
    let left = store.edges.user_items_after(user, "").await?;
    if !left.is_empty() {
        let new = left.iter().filter(|i| !items.contains(i)).count();
        if new > 0 {
            warn!(id = %e.id, new, "erase: the user's index gained rows during the purge; the next run takes them back");
        }
        info!(id = %e.id, young, new, due_in = ?Duration::from_millis(settle_ms as u64),
            "erase: rows left (flipped too recently to purge, or new); the purge waits for them");
        return Ok(());
    }
    store.erasures.mark_purged(&e.id, now_ms()).await?;
    info!(id = %e.id, "erase: purged; the erasure record no longer names the user");
    Ok(())
}

/// Sets the pending-erasure gauges from the table, every `every`, until `stop` (the API runs
/// it, so the 30-day deadline alerts from a process that is always scraped).
pub async fn export_pending(
    store: Arc<Stores>,
    every: Duration,
    stop: crate::runtime::shutdown::CancellationToken,
) {
    use crate::runtime::metrics as m;
    while !stop.is_cancelled() {
        // A read in flight at a stop is dropped: the process is not held up by a slow store.
        let all = tokio::select! {
            all = store.erasures.all() => all,
            () = stop.cancelled() => break,
        };
        match all {
            Ok(all) => {
                let pending: Vec<_> = all.iter().filter(|e| e.state != PURGED).collect();
                let oldest = pending.iter().map(|e| e.requested_at_ms).min();
                metrics::gauge!(m::ERASURES_PENDING).set(pending.len() as f64);
                metrics::gauge!(m::ERASURE_OLDEST_PENDING)
                    .set(oldest.map_or(0.0, |t| (now_ms() - t).max(0) as f64 / 1000.0));
            }
            Err(err) => warn!(error = %err, "reading erasures for the pending-erasure gauges"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// Erase accounts: unlike each of the user's likes through the write path (rate-limited,
/// checkpointed), then, ops.erase_purge_after later, delete the user's rows.
///
/// Without --user it works every erasure requested by POST /v1/admin/erasures. Safe to
/// run twice and to kill: it resumes at its checkpoint, and its request keys replay.
///
/// Examples:
///   likes erase                       # the queue (a CronJob)
///   likes erase --user u-123          # one user, by hand (requests the erasure too)
///   LIKES__OPS__ERASE_RATE=50 likes erase
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Erase this user (requesting the erasure if none is open) instead of the queue.
    #[arg(long, value_parser = crate::write::id_arg)]
    pub user: Option<String>,
}

/// `likes erase`. Resumes at its checkpoint each time it is run again (chaos: an erase died
/// on a Cassandra kill mid-walk and left the user's likes standing).
pub async fn command(args: Args, ctx: &super::Ctx) -> Result<super::Done> {
    let report = super::retrying("erase", ctx.settings.ops.wait_timeout, || async {
        let job = Eraser::connect(&ctx.settings, &ctx.topology).await?;
        run(&job, args.user.as_deref()).await
    })
    .await?;
    Ok(super::Done::report(report))
}
