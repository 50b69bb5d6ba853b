//! `likes region`: the range table's operator commands (docs/multi-region.md).
//!
//! - `init --home R`: every range gets a home, once (idempotent; never moves a range).
//! - `status`: the ranges by home, their epochs, and moves under way.
//! - `move --to R (--range N... | --from R)`: for each range, the bump (the new home and
//!   epoch + 1, marked moving, committed in every datacenter), the fence (a wait of
//!   `region.lease` + `api.write_deadline` + `cql.request_timeout` on this host's monotonic
//!   clock: no write the old home started on its old view is still running), then the settle
//!   (the new home may write, its flips stamped no earlier than the settle), then the
//!   recount: the old home's tail (what its pipeline had not counted when its lease ran out:
//!   its count writes no row of a range it no longer homes) becomes reconcile corrections
//!   of the moved ranges' items, sent through the new home's pipeline at a cut after the
//!   settle (docs/multi-region.md, "Stage-1 state after a move"). Safe to kill and run
//!   again: a range marked moving resumes at the fence; one already at its new home is not
//!   bumped again, and is recounted again (a recount of an exact item sends nothing).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use scylla::client::session::Session;
use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::runtime::clock::now_ms;
use crate::store::ranges::{RangeRow, Ranges};
use crate::topology::Topology;

use super::cut::Pipeline;
use super::reconcile::ReconcileReport;

async fn connect(settings: &Settings) -> Result<(Arc<Session>, Ranges)> {
    let session = crate::cql::connect(&settings.cql).await?;
    // A move stamps when it started and waits out its fence by this host's clock.
    crate::cql::clock::check(&session, settings.cql.max_clock_skew).await?;
    let ranges = Ranges::prepare(
        session.clone(),
        &settings.cql.keyspace,
        settings.cql.replication.class,
    )
    .await?;
    Ok((session, ranges))
}

/// What `init` did.
pub struct InitReport {
    pub created: usize,
    pub existing: usize,
    pub home: String,
}

impl fmt::Display for InitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region init: {} ranges given to {}, {} had a home already (left as they are)",
            self.created, self.home, self.existing
        )
    }
}

/// Gives every range without a home to `home` at epoch 1.
pub async fn init(settings: &Settings, home: &str) -> Result<InitReport> {
    let (session, ranges) = connect(settings).await?;
    let ks = &settings.cql.keyspace;
    let n = settings.region.ranges as usize;
    if let Some(recorded) = crate::store::recorded::region_ranges(&session, ks).await? {
        if recorded as usize != n {
            return Err(Error::Config(format!(
                "the items were split into {recorded} ranges at the first init, and region.ranges is {n}: \
                 the count is fixed (another would move every item without a fence)"
            )));
        }
    }
    let have = ranges.all().await?;
    if have.iter().any(|r| r.range as usize >= n) {
        return Err(Error::Config(format!(
            "the range table holds ranges up to {}, and region.ranges is {n}: the count is fixed at the first init",
            have.iter().map(|r| r.range).max().unwrap_or(0)
        )));
    }
    let (mut created, mut existing) = (0, 0);
    for range in 0..n as i32 {
        if ranges.create(range, home).await? {
            created += 1;
        } else {
            existing += 1;
        }
    }
    crate::store::recorded::record_region_ranges(&session, ks, n as i64).await?;
    // The fence every move waits: never shorter than what a process of this configuration
    // needs, nor than what an earlier init recorded.
    let own = fence(settings).as_millis() as i64;
    let recorded = crate::store::recorded::region_fence(&session, ks).await?;
    if recorded.is_none_or(|r| r < own) {
        crate::store::recorded::record_region_fence(&session, ks, own).await?;
    }
    Ok(InitReport {
        created,
        existing,
        home: home.to_string(),
    })
}

/// The table, as `status` prints it.
pub struct Status {
    pub rows: Vec<RangeRow>,
    pub now_ms: i64,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rows.is_empty() {
            return write!(
                f,
                "no range table yet: `likes region init --home <region>` creates it"
            );
        }
        let mut homes: BTreeMap<&str, Vec<&RangeRow>> = BTreeMap::new();
        for r in &self.rows {
            homes.entry(r.home.as_str()).or_default().push(r);
        }
        writeln!(f, "{} ranges", self.rows.len())?;
        for (home, rows) in &homes {
            let (lo, hi) = (
                rows.iter().map(|r| r.epoch).min().unwrap_or(0),
                rows.iter().map(|r| r.epoch).max().unwrap_or(0),
            );
            writeln!(
                f,
                "  {home}: home of {} ranges (epochs {lo}..={hi})",
                rows.len()
            )?;
        }
        let moving: Vec<&RangeRow> = self
            .rows
            .iter()
            .filter(|r| r.moving_from.is_some())
            .collect();
        let owed: Vec<i32> = self
            .rows
            .iter()
            .filter(|r| r.recount_due && r.moving_from.is_none())
            .map(|r| r.range)
            .collect();
        if !owed.is_empty() {
            writeln!(
                f,
                "{} moved ranges not recounted yet {owed:?}: run their `likes region move --range N --to <home>` again, with the home's configuration",
                owed.len()
            )?;
        }
        if moving.is_empty() {
            write!(f, "no move under way")
        } else {
            writeln!(
                f,
                "{} moves under way (neither side writes these ranges until they settle):",
                moving.len()
            )?;
            for r in moving {
                let age = r
                    .moved_at
                    .map(|t| format!("{} s ago", (self.now_ms - t) / 1000))
                    .unwrap_or_default();
                writeln!(
                    f,
                    "  range {}: {} -> {} at epoch {}, started {age}; `likes region move --range {} --to {}` finishes it",
                    r.range,
                    r.moving_from.as_deref().unwrap_or("?"),
                    r.home,
                    r.epoch,
                    r.range,
                    r.home
                )?;
            }
            Ok(())
        }
    }
}

pub async fn status(settings: &Settings) -> Result<Status> {
    let (_session, ranges) = connect(settings).await?;
    Ok(Status {
        rows: ranges.all().await?,
        now_ms: now_ms(),
    })
}

impl MoveReport {
    /// Whether nothing is owed: every moved item recounted (or no recount asked for).
    pub fn settled(&self) -> bool {
        self.recount.as_ref().is_none_or(|r| r.in_flight.is_empty())
    }
}

/// What `move` did.
pub struct MoveReport {
    pub moved: Vec<i32>,
    pub already: Vec<i32>,
    pub to: String,
    pub took: Duration,
    /// The recount of the moved ranges' items (None with `--no-recount`).
    pub recount: Option<ReconcileReport>,
}

impl fmt::Display for MoveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region move: {} ranges moved to {} in {:.1?}{}",
            self.moved.len(),
            self.to,
            self.took,
            if self.already.is_empty() {
                String::new()
            } else {
                format!("; {} were there already", self.already.len())
            }
        )?;
        match &self.recount {
            None => write!(
                f,
                "\nnot recounted (--no-recount): run `likes reconcile --all` in {} before trusting the moved items' counts",
                self.to
            ),
            Some(r) => {
                let applied = r
                    .corrections
                    .iter()
                    .filter(|c| c.applied == Some(true))
                    .count();
                write!(
                    f,
                    "\nrecount of the moved items: {} checked, {applied} corrected (the old home's tail)",
                    r.checked
                )?;
                if !r.in_flight.is_empty() {
                    let again: Vec<String> =
                        self.moved.iter().chain(&self.already).map(|r| format!("--range {r}")).collect();
                    write!(
                        f,
                        "; {} still in flight, so the ranges stay owed: run `likes region move {} --to {}` again",
                        r.in_flight.len(),
                        again.join(" "),
                        self.to
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Which ranges a move takes.
pub enum Which {
    Ranges(Vec<i32>),
    /// Every range this region is home to.
    From(String),
}

pub use crate::region::fence;

/// Moves `which` ranges to `to`. With `recount`, the move runs with the new home's
/// configuration (`region.name` = `to`: its Kafka carries the corrections) and its pipeline
/// running; without, it only moves the ranges (a range with nothing counted yet), and the
/// report says what to run.
pub async fn r#move(
    settings: &Settings,
    topology: &Topology,
    which: Which,
    to: &str,
    recount: bool,
) -> Result<MoveReport> {
    let started = Instant::now();
    if recount && settings.region.name.as_deref() != Some(to) {
        return Err(Error::Config(format!(
            "run the move with the new home's configuration (region.name = {to:?}, not {:?}): \
             its recount goes through {to}'s pipeline (or pass --no-recount, then reconcile there)",
            settings.region.name.as_deref().unwrap_or("unset")
        )));
    }
    let (session, ranges) = connect(settings).await?;
    if recount {
        // The recount's pipeline starts like any process of this configuration: refused
        // after the ranges moved would leave their tail uncounted, so it is checked first.
        crate::region::refuse_a_longer_fence(&session, settings).await?;
    }
    let rows = ranges.all().await.map_err(unreachable)?;
    if rows.is_empty() {
        return Err(Error::Precondition(
            "no range table yet: `likes region init --home <region>` first".into(),
        ));
    }
    // A misspelt region would be a home no API serves: the regions known are those that home
    // a range, this configuration's own and its peers.
    let mut known: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.home.as_str()).collect();
    known.extend(settings.region.name.as_deref());
    known.extend(settings.region.peers.keys().map(String::as_str));
    if !known.contains(to) {
        return Err(Error::Input(format!(
            "no region named {to:?}: the regions known here are {known:?} (the ranges' homes, \
             region.name and region.peers); run the move with the new region's configuration"
        )));
    }
    let targets: Vec<i32> = match which {
        Which::Ranges(r) => r,
        // Its ranges, those a killed run of this move bumped and left unsettled, and those
        // it settled and did not recount.
        Which::From(from) => rows
            .iter()
            .filter(|r| {
                r.home == from
                    || (r.home == to && r.moving_from.as_deref() == Some(from.as_str()))
                    || (r.home == to && r.recount_due)
            })
            .map(|r| r.range)
            .collect(),
    };
    if let Some(bad) = targets.iter().find(|&&r| r < 0 || r as usize >= rows.len()) {
        return Err(Error::Input(format!(
            "no range {bad}: the table holds 0..{}",
            rows.len()
        )));
    }
    // Bump every range first, then one fence for all of them. A failure part way still
    // fences and settles what was bumped, so no range is left closed to both sides.
    let (mut bumped, mut already, mut failed) = (Vec::new(), Vec::new(), None);
    for &range in &targets {
        match bump_one(&ranges, range, to).await {
            Ok(Bumped::Already) => already.push(range),
            Ok(Bumped::At(epoch)) => bumped.push((range, epoch)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    if !bumped.is_empty() {
        // The longer of this configuration's fence and the one recorded at init, which every
        // writer's is checked against at its start.
        let recorded = crate::store::recorded::region_fence(&session, &settings.cql.keyspace)
            .await
            .map_err(unreachable)?
            .unwrap_or(0);
        let wait = fence(settings).max(Duration::from_millis(recorded.max(0) as u64));
        info!(ranges = bumped.len(), wait = ?wait, "fence: waiting out the old home's lease and its writes in flight");
        tokio::time::sleep(wait).await;
    }
    let mut moved = Vec::new();
    for (range, epoch) in bumped {
        if !ranges
            .settle(range, to, epoch, now_ms())
            .await
            .map_err(unreachable)?
        {
            return Err(Error::Raced(format!(
                "range {range} changed during its move's fence; run `likes region status`"
            )));
        }
        moved.push(range);
    }
    if let Some(e) = failed {
        tracing::warn!(settled = ?moved, "the move stopped part way; the ranges it had bumped are settled");
        return Err(e);
    }
    let recount = if recount {
        let table = &ranges;
        let mut due: Vec<i32> = moved.iter().chain(&already).copied().collect();
        due.sort_unstable();
        let report = match recount_ranges(settings, topology, &due, rows.len()).await {
            Ok(report) => report,
            Err(e) => {
                let again: Vec<String> = due.iter().map(|r| format!("--range {r}")).collect();
                tracing::error!(error = %e, "the ranges moved, and their recount did not finish (`likes region status` lists them): run `likes region move {} --to {to}` again to recount them", again.join(" "));
                return Err(e);
            }
        };
        // Done: a rerun no longer owes it. An item left in flight keeps every range owed: the
        // same move run again recounts them (issue 43, hole 6b: the range was cleared, and
        // the item's old-home tail was never counted).
        let settled = report.in_flight.is_empty();
        for &range in due.iter().filter(|_| settled) {
            if let Some(row) = table.one(range).await? {
                if row.home == to && row.recount_due {
                    table.recounted(range, to, row.epoch).await?;
                }
            }
        }
        Some(report)
    } else {
        None
    };
    Ok(MoveReport {
        moved,
        already,
        to: to.to_string(),
        took: started.elapsed(),
        recount,
    })
}

/// How long the recount waits after the settle before it chooses its cut K (a whole second):
/// K must be after the settle (a cut before the range's stay here is refused by stage 2),
/// and past every flip the old home stamped before the fence, whose clock may be up to twice
/// `cql.max_clock_skew` ahead of this host's (issue 43, item 8).
fn recount_wait_ms(now_ms: i64, max_clock_skew: Duration) -> u64 {
    let margin = max_clock_skew.as_millis() as i64 * 2;
    let earliest = now_ms + margin + 1000;
    let k = (earliest.div_euclid(1000) + 1) * 1000;
    (k - now_ms) as u64
}

/// The recount after a move: every item of `ranges` with an edge or a counter row, recounted
/// at a cut after the settle through this (the new home's) pipeline. The old home's count
/// stopped writing these rows when its lease ran out, so what it had not counted is the
/// drift at the cut; this region's stage 1 and stage 2 count only flips made since the
/// settle. Finding the items reads the whole edges table: a move costs one full scan.
async fn recount_ranges(
    settings: &Settings,
    topology: &Topology,
    ranges: &[i32],
    of: usize,
) -> Result<ReconcileReport> {
    let wait = recount_wait_ms(crate::runtime::clock::now_ms(), settings.cql.max_clock_skew);
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let p = Pipeline::connect(settings, topology).await?;
    let items: Vec<String> = p
        .all_items()
        .await?
        .into_iter()
        .filter(|i| {
            ranges
                .binary_search(&crate::region::range_of(i, of))
                .is_ok()
        })
        .collect();
    let items = p.homed_here(items)?;
    info!(
        items = items.len(),
        ranges = ranges.len(),
        "recounting the moved ranges' items through this region's pipeline"
    );
    super::reconcile::run(&p, items, false, "region move: the old home's tail").await
}

enum Bumped {
    Already,
    At(i64),
}

/// One range's bump, or where a killed run of the same move left it.
async fn bump_one(ranges: &Ranges, range: i32, to: &str) -> Result<Bumped> {
    let Some(row) = ranges.one(range).await.map_err(unreachable)? else {
        return Err(Error::Input(format!("no range {range}")));
    };
    if row.home == to {
        return match row.moving_from {
            None => Ok(Bumped::Already),
            // Killed after its bump: commit it in every datacenter again (the SERIAL read
            // that found it may have finished it at a plain quorum), then the fence.
            Some(from) => {
                if !ranges
                    .reassert(range, to, row.epoch, &from)
                    .await
                    .map_err(unreachable)?
                {
                    return Err(Error::Raced(format!(
                        "range {range} changed while this move resumed it"
                    )));
                }
                Ok(Bumped::At(row.epoch))
            }
        };
    }
    if let Some(from) = &row.moving_from {
        return Err(Error::Refused(format!(
            "range {range} is moving from {from} to {}: finish that move first (`likes region move --range {range} --to {}`)",
            row.home, row.home
        )));
    }
    if !ranges
        .bump(range, &row.home, to, row.epoch, now_ms())
        .await
        .map_err(unreachable)?
    {
        return Err(Error::Raced(format!(
            "range {range} changed while this move read it (another move?); run `likes region status`, then this again"
        )));
    }
    info!(range, from = %row.home, to, epoch = row.epoch + 1, "range bumped: the old home's writes now fail closed");
    // A move killed between its bump and its settle (tests/regions_down.rs resumes one).
    fail::fail_point!("region-move-after-bump", |_| Err(Error::CqlTransient(
        "injected: the move stopped right after a bump".into()
    )));
    Ok(Bumped::At(row.epoch + 1))
}

/// A serial read, bump or settle that cannot reach its quorum (every datacenter's, for a
/// commit) is refused, not guessed: the same command resumes it.
fn unreachable(e: Error) -> Error {
    let text = format!("{e:?}");
    let quorum_missing = [
        "Unavailable",
        "WriteTimeout",
        "ReadTimeout",
        "CasWriteUnknown",
        "RequestTimeout",
    ];
    if quorum_missing.iter().any(|k| text.contains(k)) {
        let e = e.to_string();
        Error::CqlTransient(format!(
            "{}: a move commits in every datacenter, and one did not answer; nothing moved that was \
             not reported, and running this again resumes it once the region is back",
            e.strip_prefix("cql: ").unwrap_or(&e)
        ))
    } else {
        e
    }
}

/// Home regions: give every item range a home, show the range table, move ranges
/// (docs/multi-region.md).
///
/// Example: likes region init --home region-a
///          likes region move --from region-a --to region-b
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Give every range without a home to REGION at epoch 1 (region.ranges of them; once,
    /// idempotent: never moves a range).
    Init {
        #[arg(long)]
        home: String,
    },
    /// The ranges by home, their epochs, and moves under way.
    Status,
    /// Move ranges to another region: bump (the old home's writes fail closed), fence (wait
    /// out its lease and writes in flight), settle (the new home writes). Safe to rerun.
    Move {
        /// A range to move (repeat for more).
        #[arg(
            long = "range",
            required_unless_present = "from",
            conflicts_with = "from"
        )]
        ranges: Vec<i32>,
        /// Every range this region is home to.
        #[arg(long)]
        from: Option<String>,
        /// The new home. With the recount, run this with its configuration (region.name).
        #[arg(long)]
        to: String,
        /// Skip the recount of the moved items (the old home's tail as corrections through
        /// the new home's pipeline): only for ranges with nothing counted yet; otherwise run
        /// `likes reconcile --all` in the new home afterwards.
        #[arg(long)]
        no_recount: bool,
    },
}

/// `likes region`. A move whose recount left items unsettled fails the run, as `likes
/// reconcile` does (the ranges stay owed; `likes region status` lists them).
pub async fn command(args: Args, ctx: &super::Ctx) -> Result<super::Done> {
    let (settings, topology) = (&ctx.settings, &ctx.topology);
    Ok(match args.action {
        Action::Init { home } => super::Done::report(init(settings, &home).await?),
        Action::Status => super::Done::report(status(settings).await?),
        Action::Move {
            ranges,
            from,
            to,
            no_recount,
        } => {
            let which = from.map_or(Which::Ranges(ranges), Which::From);
            let report = r#move(settings, topology, which, &to, !no_recount).await?;
            let settled = report.settled();
            super::Done::report(report).failing_if(
                !settled,
                "the move's recount left items in flight (see above); run the same command again",
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn the_recount_cut_is_past_the_old_homes_clock() {
        for now in [1_000_000_000_000, 1_000_000_000_999, 1_000_000_000_500] {
            let wait = super::recount_wait_ms(now, Duration::from_secs(2)) as i64;
            let k = now + wait;
            assert_eq!(k % 1000, 0, "a whole second");
            assert!(
                k > now + 4_000 + 1_000 - 1,
                "past twice the skew and a second: {wait}"
            );
            assert!(wait <= 6_000);
        }
    }
}
