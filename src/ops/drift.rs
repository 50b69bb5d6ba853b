//! `likes drift`: counter rows against LIKED edges, compared at a cut (see `cut`), hot items
//! first. Prints a table; as a CronJob it leaves its gauges for Prometheus (a textfile for
//! node_exporter, or a Pushgateway).

use rand::seq::SliceRandom;

use super::cut::{self, ItemAtCut, Pipeline};
use super::{gauges, Ctx, Done};
use crate::error::{Error, Result};

/// Which items to look at.
#[derive(Debug, Clone)]
pub enum Scope {
    Items(Vec<String>),
    /// N items: the hottest half by count, the rest drawn at random.
    Sample(usize),
    All,
    /// The items of the recount queue (`likes.dlq`, see `dead_letters`).
    DeadLetters,
}

/// The items of `scope` that this region homes (every item without home regions): another
/// region's items are counted by its pipeline, and checked by its jobs.
pub async fn items_of(p: &Pipeline, scope: &Scope) -> Result<Vec<String>> {
    let items = all_of(p, scope).await?;
    p.homed_here(items)
}

async fn all_of(p: &Pipeline, scope: &Scope) -> Result<Vec<String>> {
    Ok(match scope {
        Scope::Items(v) => {
            // Each item once: a repeated one must not be recounted as empty.
            let set: std::collections::BTreeSet<&String> = v.iter().collect();
            set.into_iter().cloned().collect()
        }
        Scope::All => p.all_items().await?,
        Scope::DeadLetters => super::dead_letters::read(p)?.items,
        Scope::Sample(n) => {
            let mut by_count: Vec<(String, i64)> = p
                .stores
                .counts
                .all()
                .await?
                .into_iter()
                .map(|(i, (c, _))| (i, c))
                .collect();
            by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let hot = n.div_ceil(2).min(by_count.len());
            let mut rest: Vec<String> = by_count.split_off(hot).into_iter().map(|x| x.0).collect();
            let v: Vec<String> = by_count.into_iter().map(|x| x.0).collect();
            // The random part draws from the edges as well as the counter rows: an item
            // with likes and no row (its flips dead-lettered, or never published) drifts by
            // every like it has, and only the edges know it exists.
            let chosen: std::collections::BTreeSet<&String> = v.iter().collect();
            let from_edges = p.random_edge_items(n - hot).await?;
            rest.extend(from_edges.into_iter().filter(|i| !chosen.contains(i)));
            rest.sort();
            rest.dedup();
            rest.shuffle(&mut rand::rng());
            let mut v = v;
            v.extend(rest.into_iter().take(n - hot));
            v
        }
    })
}

/// The outcome of one drift run.
#[derive(Debug)]
pub struct DriftReport {
    pub cut_ms: i64,
    pub items: Vec<ItemAtCut>,
}

impl DriftReport {
    pub fn drifted(&self) -> Vec<(&str, i64)> {
        self.items
            .iter()
            .filter_map(|i| i.drift().filter(|d| *d != 0).map(|d| (i.item.as_str(), d)))
            .collect()
    }

    pub fn in_flight(&self) -> usize {
        self.items.iter().filter(|i| i.drift().is_none()).count()
    }

    /// The run's gauges (ops/gauges.rs renders them).
    pub fn gauges(&self) -> Vec<gauges::Gauge> {
        let drifted = self.drifted();
        let abs: i64 = drifted.iter().map(|d| d.1.abs()).sum();
        vec![
            (
                "likes_drift_items",
                "items whose count differs from their LIKED edges at the cut",
                drifted.len() as i64,
            ),
            (
                "likes_drift_abs",
                "sum over items of |count - LIKED edges| at the cut",
                abs,
            ),
            (
                "likes_drift_checked_items",
                "items compared",
                self.items.len() as i64,
            ),
            (
                "likes_drift_in_flight_items",
                "items not compared: an edge flipped twice since the cut",
                self.in_flight() as i64,
            ),
            (
                "likes_drift_cut_seconds",
                "the cut compared at, Unix seconds",
                self.cut_ms / 1000,
            ),
        ]
    }
}

impl std::fmt::Display for DriftReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "drift at cut {} (edge clock, ms); count and recount both at the cut",
            self.cut_ms
        )?;
        writeln!(
            f,
            "{:<32} {:>10} {:>12} {:>10} {:>8}  note",
            "item", "count", "count@cut", "edges@cut", "drift"
        )?;
        for i in &self.items {
            let (edges, drift, note) = match (&i.recount, i.drift()) {
                (Ok(r), Some(d)) => (
                    r.to_string(),
                    d.to_string(),
                    if d != 0 { "DRIFT" } else { "" }.to_string(),
                ),
                (Err(user), _) => (
                    "-".into(),
                    "-".into(),
                    format!("in flight: {user}'s edge flipped twice since the cut"),
                ),
                _ => ("-".into(), "-".into(), String::new()),
            };
            writeln!(
                f,
                "{:<32} {:>10} {:>12} {:>10} {:>8}  {note}",
                i.item,
                i.row.map_or(0, |r| r.count),
                i.count_at_cut(),
                edges,
                drift
            )?;
        }
        let d = self.drifted();
        write!(
            f,
            "{} items checked, {} drifted (|drift| total {}), {} in flight",
            self.items.len(),
            d.len(),
            d.iter().map(|x| x.1.abs()).sum::<i64>(),
            self.in_flight()
        )
    }
}

pub async fn run(p: &Pipeline, scope: &Scope) -> Result<DriftReport> {
    let items = items_of(p, scope).await?;
    let k = cut::choose();
    tracing::info!(
        items = items.len(),
        cut = k,
        "drift: waiting for the pipeline to pass the cut"
    );
    p.wait_past(k, true).await?;
    let items = p.items_at(&items, k).await?;
    Ok(DriftReport { cut_ms: k, items })
}

/// Compare counter rows with LIKED edges at a cut, while traffic goes on; print a table.
///
/// Exit status 0 whatever the drift; the gauges likes_drift_items and likes_drift_abs say
/// it. Items with an edge flipped twice since the cut are reported "in flight".
///
/// Examples:
///   likes drift --sample 100          # the 50 hottest items and 50 at random
///   likes drift --item i-42 --item i-7
///   likes drift --all --metrics-file /var/lib/node_exporter/likes_drift.prom
///   likes drift --sample 1000 --push http://pushgateway:9091
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub gauges: gauges::Outputs,
}

/// Which items drift and reconcile look at.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct ScopeArgs {
    /// One item (repeat for more).
    #[arg(long = "item")]
    pub items: Vec<String>,
    /// N items: the hottest half by count, the rest at random.
    #[arg(long)]
    pub sample: Option<usize>,
    /// Every item with an edge or a counter row.
    #[arg(long)]
    pub all: bool,
    /// The items listed in a file, one per line (an import's items.txt).
    #[arg(long)]
    pub items_from: Option<std::path::PathBuf>,
    /// Every item the recount queue names (likes.dlq: flips stage 1 dead-lettered or counted
    /// on a guess) and this region homes. `reconcile` puts back the items it could not
    /// settle, then marks the queue drained.
    #[arg(long)]
    pub dead_letters: bool,
}

impl ScopeArgs {
    pub fn scope(self) -> Result<Scope> {
        if let Some(path) = &self.items_from {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Input(format!("--items-from {}: {e}", path.display())))?;
            let items: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            return Ok(Scope::Items(items));
        }
        Ok(
            match (self.items.is_empty(), self.sample, self.dead_letters) {
                (false, _, _) => Scope::Items(self.items),
                (true, Some(n), _) => Scope::Sample(n),
                (true, None, true) => Scope::DeadLetters,
                (true, None, false) => Scope::All,
            },
        )
    }
}

/// `likes drift`.
pub async fn command(args: Args, ctx: &Ctx) -> Result<Done> {
    let scope = args.scope.scope()?;
    let report = super::retrying("drift", ctx.settings.ops.wait_timeout, || async {
        let p = Pipeline::connect(&ctx.settings, &ctx.topology).await?;
        run(&p, &scope).await
    })
    .await?;
    let published = args.gauges.publish("likes_drift", &report.gauges()).await;
    Ok(Done::report(report).failing_on(published))
}
