//! `likes drift`: counter rows against LIKED edges, compared at a cut (see `cut`), hot items
//! first. Prints a table; as a CronJob it leaves its gauges for Prometheus (a textfile for
//! node_exporter, or a Pushgateway).

use std::fmt::Write as _;

use rand::seq::SliceRandom;

use super::cut::{self, ItemAtCut, Pipeline};
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

    /// Prometheus text exposition of the run's gauges.
    pub fn gauges(&self) -> String {
        let drifted = self.drifted();
        let abs: i64 = drifted.iter().map(|d| d.1.abs()).sum();
        let mut s = String::new();
        for (name, help, v) in [
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
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        s
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

/// Writes the gauges where a textfile collector reads them (atomically: write, then rename).
pub fn write_metrics_file(path: &std::path::Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(Error::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(Error::io(format!("renaming to {}", path.display())))
}

/// PUTs the gauges to a Prometheus Pushgateway (`http://host:port`), as `job` (`likes_drift`,
/// `likes_recount`).
pub async fn push(gateway: &str, job: &str, text: &str) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = gateway.strip_prefix("http://").ok_or_else(|| {
        Error::Config(format!(
            "--push {gateway:?}: only http://host:port is supported"
        ))
    })?;
    let host = rest.trim_end_matches('/');
    let mut conn = tokio::net::TcpStream::connect(host)
        .await
        .map_err(Error::io(format!("connecting to the Pushgateway {host}")))?;
    let req = format!(
        "PUT /metrics/job/{job} HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    conn.write_all(req.as_bytes())
        .await
        .map_err(Error::io("pushing the gauges"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .await
        .map_err(Error::io("reading the Pushgateway's answer"))?;
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with('2') {
        return Err(Error::Config(format!(
            "the Pushgateway answered {:?}",
            answer.lines().next().unwrap_or("")
        )));
    }
    Ok(())
}
