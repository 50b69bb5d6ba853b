//! `likes erase`: account erasure (docs/design.md, "Corrections, erasure, replay": walk
//! `edges_by_user` and unlike through the normal write path, rate-limited; no special
//! repair machinery).
//!
//! 1. **Unlike.** Each LIKED edge of the user is unliked by the API's own write path, marked
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use scylla::statement::prepared::PreparedStatement;
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::progress::Progress;
use crate::api::App;
use crate::error::{Error, Result};
use crate::runtime::clock::now_ms;
use crate::schema::v1::Source;
use crate::store::erasures::{Erasure, PURGED, UNLIKED, UNLIKING};

/// Items read from `edges_by_user` per page (and per checkpoint).
const PAGE: i32 = 50;
/// Unlikes in flight at once (the rate bounds them too).
const CONCURRENCY: usize = 32;

/// What one run did.
#[derive(Debug, Default)]
pub struct EraseReport {
    pub erasures: Vec<Erasure>,
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

struct Statements {
    page: PreparedStatement,
    count: PreparedStatement,
    delete_edge: PreparedStatement,
    delete_retractions: PreparedStatement,
    delete_by_user: PreparedStatement,
}

impl Statements {
    async fn prepare(app: &App) -> Result<Self> {
        let ks = &app.settings.cql.keyspace;
        let s = &app.session;
        let p = |q: String| crate::store::prepare(s, q);
        Ok(Self {
            page: p(format!(
                "SELECT item_id FROM {ks}.edges_by_user WHERE user_id = ? AND item_id > ? LIMIT {PAGE}"
            ))
            .await?,
            count: p(format!("SELECT COUNT(*) FROM {ks}.edges_by_user WHERE user_id = ?")).await?,
            delete_edge: p(format!(
                "DELETE FROM {ks}.edges WHERE item_id = ? AND bucket = ? AND user_id = ? IF op_id = ?"
            ))
            .await?,
            delete_retractions: p(format!(
                "DELETE FROM {ks}.retractions WHERE item_id = ? AND user_id = ?"
            ))
            .await?,
            delete_by_user: p(format!(
                "DELETE FROM {ks}.edges_by_user WHERE user_id = ? AND item_id = ?"
            ))
            .await?,
        })
    }

    async fn items_after(&self, app: &App, user: &str, after: &str) -> Result<Vec<String>> {
        let rows = app
            .session
            .execute_unpaged(&self.page, (user, after))
            .await?
            .into_rows_result()?;
        let mut out = Vec::new();
        for r in rows.rows::<(String,)>()? {
            out.push(r?.0);
        }
        Ok(out)
    }
}

/// Works the queue: every erasure not purged (or only `user`'s, requested here if needed).
pub async fn run(app: &Arc<App>, user: Option<&str>) -> Result<EraseReport> {
    let st = Statements::prepare(app).await?;
    let store = &app.store.erasures;
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
    let pace = Pace::new(app.settings.ops.erase_rate);
    let mut report = EraseReport::default();
    for e in queue {
        let e = work(app, &st, &pace, e).await?;
        report.erasures.push(e);
    }
    Ok(report)
}

async fn work(app: &Arc<App>, st: &Statements, pace: &Pace, mut e: Erasure) -> Result<Erasure> {
    let store = &app.store.erasures;
    let Some(user) = e.user_id.clone() else {
        return Ok(e);
    };
    if e.state != UNLIKED {
        e.state = UNLIKING.into();
        let total = app
            .session
            .execute_unpaged(&st.count, (&user,))
            .await?
            .into_rows_result()?
            .maybe_first_row::<(i64,)>()?
            .map_or(0, |r| r.0);
        let mut progress = Progress::new(format!("{}: items walked", e.id), Some(total as u64));
        progress.add(e.walked as u64);
        info!(id = %e.id, total, resumed_after = ?e.cursor, "erase: unliking");
        loop {
            let after = e.cursor.clone().unwrap_or_default();
            let items = st.items_after(app, &user, &after).await?;
            let Some(last) = items.last().cloned() else {
                break;
            };
            let results: Vec<Result<bool>> = stream::iter(&items)
                .map(|item| {
                    let (user, id) = (&user, &e.id);
                    async move {
                        pace.wait().await;
                        unlike(app, user, item, id).await
                    }
                })
                .buffered(CONCURRENCY)
                .collect()
                .await;
            for r in results {
                e.unliked += i64::from(r?);
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
        store.mark_unliked(&e.id, now_ms()).await?;
        e = store.get(&e.id).await?.unwrap_or(e);
        info!(id = %e.id, walked = e.walked, unliked = e.unliked, "erase: every like taken back");
    }
    let wait = purge_wait(app);
    let due = e
        .unliked_at_ms
        .unwrap_or(i64::MAX)
        .saturating_add(wait.as_millis() as i64);
    if now_ms() < due {
        info!(id = %e.id, due_in = ?Duration::from_millis((due - now_ms()).max(0) as u64), "erase: purge not due yet");
        return Ok(e);
    }
    purge(app, st, &e, &user).await?;
    Ok(store.get(&e.id).await?.unwrap_or(e))
}

/// Unlikes one edge if it is LIKED; whether this request flipped it. The request key names
/// the like it takes back (`<erasure id>-<op_id>`): a retry of this unlike replays, and a
/// like made again later is a new op, taken back by a new request rather than answered by
/// the old one's replay.
async fn unlike(app: &App, user: &str, item: &str, id: &str) -> Result<bool> {
    let bucket = crate::hash::bucket_of(user, app.topology.buckets) as i32;
    let Some(edge) = app.store.edges.read(item, bucket, user).await? else {
        return Ok(false);
    };
    if !edge.liked {
        return Ok(false);
    }
    let key = format!("{id}-{}", edge.op_id);
    let answer = crate::api::write::write_as(
        app,
        user,
        item,
        false,
        &key,
        Source::Erasure,
        crate::schema::v1::ClientPlatform::Unspecified,
    )
    .await
    .map_err(|e| Error::CqlTransient(format!("unliking {item} for erasure {id}: {e:?}")))?;
    Ok(answer.changed)
}

/// How old an erasure's unlikes, and each row's last flip, must be before the purge:
/// `ops.erase_purge_after` (past the dedupe horizon), never under two relay ages.
fn purge_wait(app: &App) -> Duration {
    app.settings
        .ops
        .erase_purge_after
        .max(app.settings.api.relay_min_age * 2)
}

async fn purge(app: &App, st: &Statements, e: &Erasure, user: &str) -> Result<()> {
    let bucket = crate::hash::bucket_of(user, app.topology.buckets) as i32;
    // First a check that nothing was liked again since the walk (a session that outlived
    // the account): such a like is taken back and the purge waits its turn again, so that
    // no row is deleted while its unlike may still be on its way through the relay.
    let mut items: Vec<String> = Vec::new();
    loop {
        let after = items.last().map_or("", String::as_str);
        let page = st.items_after(app, user, after).await?;
        if page.is_empty() {
            break;
        }
        items.extend(page);
    }
    let mut relikes = 0;
    for item in &items {
        relikes += i64::from(unlike(app, user, item, &e.id).await?);
    }
    if relikes > 0 {
        warn!(id = %e.id, relikes, "erase: likes made after the walk were taken back; the purge waits again");
        app.store.erasures.mark_unliked(&e.id, now_ms()).await?;
        return Ok(());
    }
    // A row is purged only once its own last flip is `purge_wait` old (past stage 1's
    // horizon, see the config): deleted earlier, a later like would restart at op 1 while
    // stage 1 still remembers the old op, and be dropped as stale (count -1 for good). The
    // erasure's unlike is not the row's last flip when a like and an unlike came after it.
    let settle_ms = purge_wait(app).as_millis() as i64;
    let mut young = 0;
    info!(id = %e.id, rows = items.len(), "erase: purging the user's rows");
    for item in &items {
        if let Some(edge) = app.store.edges.read(item, bucket, user).await? {
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
            let r = app
                .session
                .execute_unpaged(&st.delete_edge, (item, bucket, user, edge.op_id))
                .await?;
            if crate::store::not_applied(r)?.is_some() {
                return Err(Error::Raced(format!(
                    "erasure {}: {item}'s edge changed during the purge; run again",
                    e.id
                )));
            }
        }
        app.session
            .execute_unpaged(&st.delete_retractions, (item, user))
            .await?;
        // One row at a time, never the partition: a row written during the purge (a session
        // that outlived the account, before the API refused it) survives to the re-walk.
        app.session
            .execute_unpaged(&st.delete_by_user, (user, item))
            .await?;
    }
    // Fault-test hook: a write that passed the API's check before the erasure was
    // requested lands its index row now.
    fail::fail_point!("erase-before-rewalk", |_| Err(Error::Injected(
        "erase-before-rewalk"
    )));
    // Purged only when a walk finds nothing left: the record then forgets the user.
    let left = st.items_after(app, user, "").await?;
    if !left.is_empty() {
        let new = left.iter().filter(|i| !items.contains(i)).count();
        if new > 0 {
            warn!(id = %e.id, new, "erase: the user's index gained rows during the purge; the next run takes them back");
        }
        info!(id = %e.id, young, new, due_in = ?Duration::from_millis(settle_ms as u64),
            "erase: rows left (flipped too recently to purge, or new); the purge waits for them");
        return Ok(());
    }
    app.store.erasures.mark_purged(&e.id, now_ms()).await?;
    info!(id = %e.id, "erase: purged; the erasure record no longer names the user");
    Ok(())
}

/// Sets the pending-erasure gauges from the table, every `every`, until `stop` (the API runs
/// it, so the 30-day deadline alerts from a process that is always scraped).
pub async fn export_pending(
    app: Arc<App>,
    every: Duration,
    stop: crate::runtime::shutdown::CancellationToken,
) {
    use crate::runtime::metrics as m;
    while !stop.is_cancelled() {
        match app.store.erasures.all().await {
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
