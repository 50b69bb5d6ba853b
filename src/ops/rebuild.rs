//! `likes rebuild`: the counter table re-derived from the edges (docs/design.md, "Corrections,
//! erasure, replay"), with stage 2 stopped and everything else running.
//!
//! 1. A cut K (see `cut`); wait until every flip stamped before K is on the deltas log.
//! 2. Recount every item's LIKED edges at K (a full scan; each edge rolled back to K).
//! 3. Split the deltas log at the first record of the window W0 that starts at or after K
//!    (position P per partition). A row's value at P is the recount at K, plus the deltas
//!    before P of flips at or after K, minus the deltas from P on of flips before K (stage 1
//!    never combines two event-time seconds, so each delta is wholly on one side of K).
//! 4. Write every row through its compare-and-set: that value, `last_window` = W0 (the fence
//!    at P), `last_correction` = K (a correction computed before the rebuild is refused).
//! 5. Commit the count group's offsets at P with W0 as the clock. Stage 2, started again,
//!    replays the tail from P: every window after W0 applies once, none before it.
//!
//! While it runs, reads of a count answer from whatever row is there (none: 0), and are
//! right again, with `asOf` catching up, once stage 2 has replayed the tail. It records
//! itself in `topology_record` for its whole run: a stage 2 started meanwhile waits for it
//! (a killed rebuild leaves the record; running it again to its end clears it).

use std::collections::{BTreeMap, HashMap};

use futures::TryStreamExt;
use rdkafka::consumer::BaseConsumer;
use tracing::{info, warn};

use super::cut::{self, Pipeline};
use super::progress::Progress;
use crate::error::{Error, Result};
use crate::kafka::group::{self, CountClock};
use crate::records::DeltaInput;
use crate::store::counts::{CounterRow, Fence, RowWrite};

#[derive(Debug)]
pub struct RebuildReport {
    pub cut_ms: i64,
    pub window_ms: i64,
    pub rows: usize,
    pub likes: i64,
    pub resume: Vec<(i32, i64)>,
}

impl std::fmt::Display for RebuildReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rebuilt {} counter rows ({} likes) at cut {} with the fence at window end {}; \
             the count group resumes at {:?} (partition, offset). Start stage 2 now: it \
             replays the tail on top.",
            self.rows, self.likes, self.cut_ms, self.window_ms, self.resume
        )
    }
}

const ATTEMPTS: usize = 3;

pub async fn run(p: &Pipeline) -> Result<RebuildReport> {
    // A rebuild rewrites every counter row from one region's pipeline, while each region
    // counts only its own ranges; rebuilding per region is not built (docs/multi-region.md).
    if p.settings.region.name.is_some() {
        return Err(Error::Refused(
            "likes rebuild rewrites every counter row and is not built for home regions yet \
             (region.name is set): reconcile each region instead (`likes reconcile --all` in each)"
                .into(),
        ));
    }
    let group = p.settings.group(&p.topology.groups.count);
    refuse_live_group(p, &group).await?;
    // From here until the end, a stage 2 that starts waits (a killed rebuild leaves the
    // record: running it again to its end clears it).
    let ks = &p.settings.cql.keyspace;
    crate::store::recorded::mark_rebuilding(&p.session, ks, crate::runtime::clock::now_ms())
        .await?;
    // A stage 2 that read "no rebuild" just before the mark is joining its group now: wait
    // out a join, then check again (issue 43, item 8: checked only before the mark, such a
    // stage 2 ran beside the rebuild). Refused, the mark goes, as nothing was rewritten.
    fail::fail_point!("rebuild-after-mark");
    tokio::time::sleep(p.settings.kafka.session_timeout).await;
    if let Err(e) = refuse_live_group(p, &group).await {
        crate::store::recorded::rebuild_done(&p.session, ks).await?;
        return Err(e);
    }
    let report = rebuild(p, &group).await?;
    crate::store::recorded::rebuild_done(&p.session, ks).await?;
    Ok(report)
}

async fn rebuild(p: &Pipeline, group: &str) -> Result<RebuildReport> {
    for attempt in 1..=ATTEMPTS {
        let k = cut::choose();
        info!(
            cut = k,
            attempt, "rebuild: waiting until every flip before the cut is on the deltas log"
        );
        p.wait_past(k, false).await?;
        match recount_all(p, k).await? {
            Err((item, _user)) => {
                warn!(%item, "an edge flipped twice since the cut; taking a later cut");
                continue;
            }
            Ok(recount) => return finish(p, group, k, recount).await,
        }
    }
    Err(Error::Raced(format!(
        "every one of {ATTEMPTS} cuts met an edge flipped twice since it whose history left the row; run again"
    )))
}

/// Stage 2 must be stopped (its next commit would undo the rebuild's positions).
async fn refuse_live_group(p: &Pipeline, group: &str) -> Result<()> {
    tokio::task::block_in_place(|| {
        group::wait_until_empty(
            &p.settings.kafka,
            group,
            "stop stage 2 (`likes count`, e.g. scale it to 0) before a rebuild",
        )
    })
}

/// LIKED edges per item at `k`, over the whole table; Err((item, user)) for an edge in flight.
async fn recount_all(
    p: &Pipeline,
    k: i64,
) -> Result<std::result::Result<BTreeMap<String, i64>, (String, String)>> {
    let mut rows = p.histories.all().await?;
    let mut out = BTreeMap::new();
    let mut progress = Progress::new("edges recounted", None);
    while let Some((item, user, history)) = rows.try_next().await? {
        match cut::history_liked_at(&history, k) {
            Some(l) => *out.entry(item).or_insert(0) += i64::from(l),
            None => return Ok(Err((item, user))),
        }
        progress.add(1);
    }
    progress.finish();
    Ok(Ok(out))
}

async fn finish(
    p: &Pipeline,
    group: &str,
    k: i64,
    recount: BTreeMap<String, i64>,
) -> Result<RebuildReport> {
    let topic = p.settings.topic(&p.topology.topics.deltas.name);
    let window_ms = p.topology.window.as_millis() as i64;
    // W0: the end of the last window before P, the first window boundary at or after K.
    let w0 = (k + window_ms - 1).div_euclid(window_ms) * window_ms;
    let mut value: HashMap<String, i64> = recount.into_iter().collect();
    let mut resume = Vec::new();
    for crate::kafka::offsets::Extent {
        partition, high, ..
    } in p.ends(&topic)?
    {
        let mut split: Option<i64> = None;
        p.read_deltas(
            &topic,
            partition,
            k - cut::SKEW_MS,
            high,
            |offset, clock, input| {
                if clock >= w0 && split.is_none() {
                    split = Some(offset);
                }
                if let Some(DeltaInput::Correction { item, .. }) = &input {
                    // Its item gets a row with the rebuild's correction fence, so a correction
                    // computed before the rebuild is refused even where the count is 0.
                    value.entry(item.clone()).or_insert(0);
                }
                if let Some(DeltaInput::Delta {
                    item,
                    delta,
                    event_time_ms,
                    ..
                }) = input
                {
                    let before_p = split.is_none();
                    let at_or_after_k = event_time_ms >= k;
                    if before_p && at_or_after_k {
                        *value.entry(item).or_insert(0) += delta;
                    } else if !before_p && !at_or_after_k {
                        *value.entry(item).or_insert(0) -= delta;
                    }
                }
                true
            },
        )?;
        resume.push((partition, split.unwrap_or(high)));
    }
    // Every existing row is rewritten too: one left by a stage 2 that ran on the new table
    // holds only part of the tail.
    for item in p.stores.counts.all().await?.into_keys() {
        value.entry(item).or_insert(0);
    }
    let fence = Fence::prepare(&p.session, &p.settings.cql.keyspace).await?;
    let mut progress = Progress::new("counter rows written", Some(value.len() as u64));
    let mut likes = 0;
    let mut rows = 0;
    for (item, v) in &value {
        if *v < 0 {
            // Kept as the true sum (served as 0), as stage 2 keeps it: the tail's deltas
            // bring it back up.
            warn!(%item, value = v, "the rebuilt count is negative at the cut");
        }
        let v = *v;
        likes += v;
        let existing = p.count_row(item).await?;
        write_row(p, &fence, item, v, w0, k, existing).await?;
        rows += 1;
        progress.add(1);
    }
    progress.finish();
    commit_resume(p, group, &topic, &resume, w0)?;
    Ok(RebuildReport {
        cut_ms: k,
        window_ms: w0,
        rows,
        likes,
        resume,
    })
}

async fn write_row(
    p: &Pipeline,
    fence: &Fence,
    item: &str,
    count: i64,
    w0: i64,
    k: i64,
    mut seen: Option<CounterRow>,
) -> Result<()> {
    let shard = p.topology.counter_shard(item);
    // The row at the cut, with the cut as its last correction: a correction computed before
    // the rebuild is refused by the correction fence.
    let to = CounterRow {
        count,
        last_window: w0,
        last_correction: Some(k),
    };
    for _ in 0..10 {
        let write = RowWrite {
            shard,
            item,
            seen,
            to,
            as_of: k,
            correcting: true,
        };
        match fence.write_one(&p.session, &write).await? {
            Ok(()) => return Ok(()),
            Err(now) => seen = now,
        }
    }
    Err(Error::CqlTransient(format!(
        "like_counts row of {item} kept changing during the rebuild: is stage 2 running?"
    )))
}

fn commit_resume(
    p: &Pipeline,
    group: &str,
    topic: &str,
    resume: &[(i32, i64)],
    w0: i64,
) -> Result<()> {
    let c: BaseConsumer = crate::kafka::client_config(&p.settings.kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let clock = CountClock {
        clock_ms: w0,
        window_ms: p.topology.window.as_millis() as i64,
        then: Vec::new(),
    };
    let positions: Vec<(i32, i64, String)> = resume
        .iter()
        .map(|&(partition, offset)| (partition, offset, clock.metadata()))
        .collect();
    tokio::task::block_in_place(|| group::commit(&c, topic, &positions))?;
    info!(%group, ?resume, clock = w0, "count group set to replay the tail from the cut");
    Ok(())
}

/// Re-derive the counter table from the edges at a cut and set stage 2 to replay the
/// deltas tail on top. Stage 2 must be stopped; start it again afterwards.
///
/// Example (counter table lost):
///   kubectl -n likes scale statefulset/likes-count --replicas=0
///   likes migrate && likes rebuild
///   kubectl -n likes scale statefulset/likes-count --replicas=N
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {}

/// `likes rebuild`.
pub async fn command(_: Args, ctx: &super::Ctx) -> Result<super::Done> {
    let report = super::retrying("rebuild", ctx.settings.ops.wait_timeout, || async {
        run(&Pipeline::connect(&ctx.settings, &ctx.topology).await?).await
    })
    .await?;
    Ok(super::Done::report(report))
}
