//! The topology a keyspace was built with, recorded in it (`topology_record`): the bucket
//! count and the window length. Processes that write the keyspace check it at start and
//! refuse a silent change; `likes migrate` is the documented way to make one.
//!
//! - buckets: an edge lives in CQL partition (item, hash(user) % buckets) and its events are
//!   keyed the same way; another count moves every edge, so it is refused (docs/operations.md,
//!   "Changing a running pipeline").
//! - window: the fence compares window end times in ms, so a new length is safe; it is still
//!   recorded, and changed only by `likes migrate --accept-window-change`.
//! - fence: keyspaces written before the fence moved to end times hold window indices in
//!   `like_counts.last_window`; `likes migrate` converts them once (with the window in force)
//!   before anything is recorded, and a process refuses to start until it has.

use scylla::client::session::Session;

use crate::error::{Error, Result};
use crate::topology::Topology;

const BUCKETS: &str = "buckets";
const WINDOW_MS: &str = "window_ms";
/// `window_ms@<since ms>`: the window length in force from that time (the history a count
/// replay is checked against).
const WINDOW_SINCE: &str = "window_ms@";

/// A `likes rebuild` under way, or killed before its end, since this time (ms): stage 2 must
/// not start until it is done (issue 23, item 8: a stage 2 started meanwhile would apply
/// windows onto rows the rebuild is about to overwrite, or ahead of the fence it sets).
const REBUILDING: &str = "rebuild_started_ms";

/// How many ranges `likes region init` split the items into, once it has written them all
/// (docs/multi-region.md): the count is fixed from then on, since another count would move
/// every item to another range without a fence.
const REGION_RANGES: &str = "region_ranges";

pub async fn record_region_ranges(session: &Session, ks: &str, n: i64) -> Result<()> {
    put(session, ks, REGION_RANGES, n).await
}

pub async fn region_ranges(session: &Session, ks: &str) -> Result<Option<i64>> {
    Ok(value(session, ks, REGION_RANGES).await?.flatten())
}

/// The fence a move waits (ms): the longest `region.lease` + `api.write_deadline` +
/// `cql.request_timeout` any `likes region init` was run with. A process with a longer one is
/// refused at start: a move would not wait out its writes (docs/multi-region.md).
const REGION_FENCE_MS: &str = "region_fence_ms";

pub async fn record_region_fence(session: &Session, ks: &str, ms: i64) -> Result<()> {
    put(session, ks, REGION_FENCE_MS, ms).await
}

pub async fn region_fence(session: &Session, ks: &str) -> Result<Option<i64>> {
    Ok(value(session, ks, REGION_FENCE_MS).await?.flatten())
}

/// One record by name: None without a row, Some(None) for a row without a value.
async fn value(session: &Session, ks: &str, name: &str) -> Result<Option<Option<i64>>> {
    let rows = session
        .query_unpaged(
            format!("SELECT value FROM {ks}.topology_record WHERE name = ?"),
            (name,),
        )
        .await?
        .into_rows_result()?;
    Ok(rows.maybe_first_row::<(Option<i64>,)>()?.map(|r| r.0))
}

/// Records that a rebuild starts (keeps an earlier, unfinished one's record).
pub async fn mark_rebuilding(session: &Session, ks: &str, now_ms: i64) -> Result<()> {
    put(session, ks, REBUILDING, now_ms).await
}

/// Clears the rebuild record: stage 2 may start.
pub async fn rebuild_done(session: &Session, ks: &str) -> Result<()> {
    let st = scylla::statement::unprepared::Statement::new(format!(
        "DELETE FROM {ks}.topology_record WHERE name = ? IF EXISTS"
    ));
    session.query_unpaged(st, (REBUILDING,)).await?;
    Ok(())
}

/// When the rebuild under way (or left unfinished) started, if one is recorded.
pub async fn rebuilding(session: &Session, ks: &str) -> Result<Option<i64>> {
    Ok(value(session, ks, REBUILDING)
        .await?
        .map(|v| v.unwrap_or(0)))
}

/// What the keyspace records, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub buckets: i64,
    pub window_ms: i64,
}

async fn read(session: &Session, ks: &str) -> Result<Option<Recorded>> {
    let rows = session
        .query_unpaged(format!("SELECT name, value FROM {ks}.topology_record"), ())
        .await?
        .into_rows_result()?;
    let (mut buckets, mut window_ms) = (None, None);
    for row in rows.rows::<(String, Option<i64>)>()? {
        let (name, value) = row?;
        match name.as_str() {
            BUCKETS => buckets = value,
            WINDOW_MS => window_ms = value,
            _ => {}
        }
    }
    Ok(match (buckets, window_ms) {
        (Some(buckets), Some(window_ms)) => Some(Recorded { buckets, window_ms }),
        _ => None,
    })
}

async fn has_counter_rows(session: &Session, ks: &str) -> Result<bool> {
    let rows = session
        .query_unpaged(format!("SELECT item_id FROM {ks}.like_counts LIMIT 1"), ())
        .await?
        .into_rows_result()?;
    Ok(rows.rows_num() > 0)
}

async fn put(session: &Session, ks: &str, name: &str, value: i64) -> Result<()> {
    let st = scylla::statement::unprepared::Statement::new(format!(
        "INSERT INTO {ks}.topology_record (name, value) VALUES (?, ?) IF NOT EXISTS"
    ));
    session.query_unpaged(st, (name, value)).await?;
    Ok(())
}

async fn put_since(session: &Session, ks: &str, window_ms: i64) -> Result<()> {
    let name = format!("{WINDOW_SINCE}{}", crate::runtime::clock::now_ms());
    put(session, ks, &name, window_ms).await
}

/// Before a replay of the count group from `from_ms` (0: the earliest record): refused when
/// the replayed range holds windows of a length the current one does not divide. The fence
/// of such a row may sit inside a current window (1 s windows ending at 11 s, then 2 s
/// windows: [10 s, 12 s) straddles 11 s), and the replay would add that window's records
/// from before the fence a second time. A length that divides every earlier one never
/// straddles their ends.
pub async fn check_count_replay(
    session: &Session,
    ks: &str,
    t: &Topology,
    from_ms: i64,
) -> Result<()> {
    let rows = session
        .query_unpaged(format!("SELECT name, value FROM {ks}.topology_record"), ())
        .await?
        .into_rows_result()?;
    let mut history: Vec<(i64, i64)> = Vec::new();
    for row in rows.rows::<(String, Option<i64>)>()? {
        let (name, value) = row?;
        if let (Some(since), Some(len)) = (name.strip_prefix(WINDOW_SINCE), value) {
            if let Ok(since) = since.parse::<i64>() {
                history.push((since, len));
            }
        }
    }
    history.sort();
    let now = window_ms(t);
    let mut safe_from: Option<i64> = None;
    for (i, &(_, len)) in history.iter().enumerate() {
        let until = history.get(i + 1).map_or(i64::MAX, |h| h.0);
        if until > from_ms && len % now != 0 {
            safe_from = Some(until);
        }
    }
    match safe_from {
        None => Ok(()),
        Some(at) => Err(Error::Refused(format!(
            "refusing to replay the count group from {from_ms}: windows of a length {now} ms \
             does not divide were applied after that, and a replayed window could straddle \
             their fence and count records twice. Replay from {at} (Unix ms) or later, or \
             use a window that divides every earlier one"
        ))),
    }
}

fn refuse_buckets(r: &Recorded, t: &Topology, ks: &str) -> Result<()> {
    if r.buckets != i64::from(t.buckets) {
        return Err(Error::Config(format!(
            "topology buckets = {} but keyspace {ks} was built with {}: another bucket count \
             moves every edge to another CQL partition and re-keys its events. Keep {} (see \
             docs/operations.md, \"Changing a running pipeline\")",
            t.buckets, r.buckets, r.buckets
        )));
    }
    Ok(())
}

fn window_ms(t: &Topology) -> i64 {
    t.window.as_millis() as i64
}

/// At the start of a process that writes the keyspace: the topology in force must be the
/// recorded one. A keyspace with nothing recorded and no counter rows yet (a fresh one) is
/// recorded here.
pub async fn check(session: &Session, ks: &str, t: &Topology) -> Result<()> {
    let r = check_buckets(session, ks, t).await?;
    if r.window_ms != window_ms(t) {
        return Err(Error::Config(format!(
            "topology window = {} ms but keyspace {ks} records {} ms. The change is safe (the \
             fence compares window end times); record it with `likes migrate \
             --accept-window-change`",
            window_ms(t),
            r.window_ms
        )));
    }
    Ok(())
}

/// [`check`] of the bucket count only, for the processes that place edges but never cut
/// windows (the API, the relay, the erase job): a window change, recorded while they run or
/// retry, is not theirs to refuse (chaos seed 2: an erase retrying across a Cassandra
/// outage refused to reconnect after a window change, and left its user's likes).
pub async fn check_buckets(session: &Session, ks: &str, t: &Topology) -> Result<Recorded> {
    let r = match read(session, ks).await? {
        Some(r) => r,
        None if has_counter_rows(session, ks).await? => {
            return Err(Error::Config(format!(
                "keyspace {ks} has counter rows but no recorded topology: it predates the \
                 fence on window end times. Run `likes migrate` once (it converts the rows)"
            )))
        }
        None => {
            put(session, ks, BUCKETS, i64::from(t.buckets)).await?;
            put(session, ks, WINDOW_MS, window_ms(t)).await?;
            put_since(session, ks, window_ms(t)).await?;
            read(session, ks)
                .await?
                .ok_or_else(|| Error::Schema("topology_record written but not read".into()))?
        }
    };
    refuse_buckets(&r, t, ks)?;
    Ok(r)
}

/// `likes migrate`: records the topology, converting a pre-record keyspace's fence from
/// window indices to end times first, and records a new window when `accept_window_change`.
/// Returns what it did, one line each.
pub async fn record(
    session: &Session,
    ks: &str,
    t: &Topology,
    accept_window_change: bool,
) -> Result<Vec<String>> {
    let mut done = Vec::new();
    match read(session, ks).await? {
        None => {
            let converted = convert_fence(session, ks, window_ms(t)).await?;
            if converted > 0 {
                done.push(format!(
                    "like_counts: {converted} rows' fence converted from window indices to end times ({} ms windows)",
                    window_ms(t)
                ));
            }
            put(session, ks, BUCKETS, i64::from(t.buckets)).await?;
            put(session, ks, WINDOW_MS, window_ms(t)).await?;
            put_since(session, ks, window_ms(t)).await?;
            done.push(format!(
                "topology recorded: buckets = {}, window = {} ms",
                t.buckets,
                window_ms(t)
            ));
        }
        Some(r) => {
            refuse_buckets(&r, t, ks)?;
            if r.window_ms != window_ms(t) {
                if !accept_window_change {
                    return Err(Error::Config(format!(
                        "topology window = {} ms but keyspace {ks} records {} ms; pass \
                         --accept-window-change to record the new one (safe: the fence \
                         compares window end times)",
                        window_ms(t),
                        r.window_ms
                    )));
                }
                let st = scylla::statement::unprepared::Statement::new(format!(
                    "UPDATE {ks}.topology_record SET value = ? WHERE name = ? IF value = ?"
                ));
                session
                    .query_unpaged(st, (window_ms(t), WINDOW_MS, r.window_ms))
                    .await?;
                put_since(session, ks, window_ms(t)).await?;
                done.push(format!(
                    "window changed: {} ms -> {} ms",
                    r.window_ms,
                    window_ms(t)
                ));
            }
        }
    }
    Ok(done)
}

/// Rewrites `last_window` from an index to that window's end time, each row by its own
/// compare-and-set (every write to like_counts is an LWT). Run only before anything is
/// recorded, while no count stage runs.
async fn convert_fence(session: &Session, ks: &str, window_ms: i64) -> Result<u64> {
    use futures::TryStreamExt;
    let update = session
        .prepare(format!(
            "UPDATE {ks}.like_counts SET last_window = ? \
             WHERE shard = ? AND item_id = ? IF last_window = ?"
        ))
        .await
        .map_err(|e| Error::Schema(format!("prepare the fence conversion: {e}")))?;
    let mut rows = session
        .query_iter(
            format!("SELECT shard, item_id, last_window FROM {ks}.like_counts"),
            (),
        )
        .await
        .map_err(|e| Error::Schema(format!("reading like_counts: {e}")))?
        .rows_stream::<(i32, String, Option<i64>)>()
        .map_err(|e| Error::Schema(format!("reading like_counts: {e}")))?;
    let mut n = 0;
    // Only values that are plausible indices: an index times the window is a time not far
    // past now, an end time (already converted, by an earlier run cut short) times the window
    // is centuries away. So a re-run converts nothing twice.
    let horizon = crate::runtime::clock::now_ms() + 86_400_000;
    while let Some((shard, item, last)) = rows
        .try_next()
        .await
        .map_err(|e| Error::Schema(format!("reading like_counts: {e}")))?
    {
        let Some(last) = last else { continue };
        let end = (last + 1).saturating_mul(window_ms);
        if end > horizon {
            continue;
        }
        session
            .execute_unpaged(&update, (end, shard, &item, last))
            .await?;
        n += 1;
    }
    Ok(n)
}
