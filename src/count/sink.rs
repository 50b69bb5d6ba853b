//! The sink: closed windows onto `like_counts` through the LWT fence (DESIGN.md, "The sink
//! fence"). The guarantee lives here, at the last write, so everything upstream may replay.
//!
//! Per item, one conditional write covers every pending window above the row's
//! `last_window`: their sum is added and `last_window` moves to the highest. A replayed
//! window is at or below `last_window` and is skipped. The compare-and-set is on the cached
//! (count, last_window); stage 2 is the only writer of an item, so it rarely misses, and a
//! miss returns the row to retry from. A sum that would go below zero is clamped at zero and
//! counted: a negative count is a bug report, not a number.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlTimestamp, CqlValue, Row};
use tracing::warn;

use super::window::ClosedWindow;
use crate::error::{Error, Result};
use crate::metrics as m;

/// What the sink did, cumulatively.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SinkStats {
    /// Conditional writes issued (applied or not).
    pub lwts: u64,
    /// (item, window) pairs newly applied.
    pub windows_applied: u64,
    /// (item, window) pairs skipped because the row was already at or past them.
    pub fence_skips: u64,
    pub cas_retries: u64,
    pub clamps: u64,
}

/// A counter row as last seen: (count, last_window).
type Row2 = (i64, i64);

pub struct Sink {
    session: Arc<Session>,
    insert: PreparedStatement,
    update: PreparedStatement,
    cache: HashMap<String, Row2>,
    max_in_flight: usize,
    audit: Option<std::sync::Mutex<std::fs::File>>,
    pub stats: SinkStats,
}

/// One item's pending windows: window id → (delta, earliest event time).
type Pending = BTreeMap<i64, (i64, i64)>;

/// The outcome of writing one item.
struct Outcome {
    item: String,
    row: Option<Row2>,
    stats: SinkStats,
    staleness_ms: Vec<f64>,
}

impl Sink {
    pub async fn new(session: Arc<Session>, keyspace: &str, max_in_flight: usize) -> Result<Self> {
        let insert = session
            .prepare(format!(
                "INSERT INTO {keyspace}.like_counts (item_id, count, last_window, as_of) \
                 VALUES (?, ?, ?, ?) IF NOT EXISTS"
            ))
            .await
            .map_err(|e| Error::Schema(format!("prepare like_counts insert: {e}")))?;
        let update = session
            .prepare(format!(
                "UPDATE {keyspace}.like_counts SET count = ?, last_window = ?, as_of = ? \
                 WHERE item_id = ? IF count = ? AND last_window = ?"
            ))
            .await
            .map_err(|e| Error::Schema(format!("prepare like_counts update: {e}")))?;
        Ok(Self {
            session,
            insert,
            update,
            cache: HashMap::new(),
            max_in_flight,
            audit: None,
            stats: SinkStats::default(),
        })
    }

    /// Appends a line per applied write to `path`: `item<TAB>w1,w2,..<TAB>delta`.
    pub fn audit_to(&mut self, path: &std::path::Path) -> Result<()> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::Config(format!("count.audit_log {}: {e}", path.display())))?;
        self.audit = Some(std::sync::Mutex::new(f));
        Ok(())
    }

    /// Applies closed windows; returns when every one is applied (or skipped by the fence).
    pub async fn apply(&mut self, windows: Vec<ClosedWindow>, window_ms: i64) -> Result<()> {
        let mut by_item: HashMap<String, Pending> = HashMap::new();
        for w in windows {
            for (item, d) in w.items {
                let e = by_item
                    .entry(item)
                    .or_default()
                    .entry(w.id)
                    .or_insert((0, d.event_time_ms));
                e.0 += d.delta;
                e.1 = e.1.min(d.event_time_ms);
            }
        }
        let jobs: Vec<(String, Pending, Option<Row2>)> = by_item
            .into_iter()
            .map(|(item, pending)| {
                let cached = self.cache.get(&item).copied();
                (item, pending, cached)
            })
            .collect();
        let this = &*self;
        let outcomes: Vec<Result<Outcome>> = stream::iter(jobs)
            .map(|(item, pending, cached)| this.apply_item(item, pending, cached, window_ms))
            .buffer_unordered(self.max_in_flight)
            .collect()
            .await;
        for o in outcomes {
            let o = o?;

            match o.row {
                Some(r) => self.cache.insert(o.item, r),
                None => self.cache.remove(&o.item),
            };
            let s = &mut self.stats;
            s.lwts += o.stats.lwts;
            s.windows_applied += o.stats.windows_applied;
            s.fence_skips += o.stats.fence_skips;
            s.cas_retries += o.stats.cas_retries;
            s.clamps += o.stats.clamps;
            metrics::counter!(m::SINK_LWTS).increment(o.stats.lwts);
            metrics::counter!(m::WINDOWS_APPLIED).increment(o.stats.windows_applied);
            metrics::counter!(m::FENCE_SKIPS).increment(o.stats.fence_skips);
            metrics::counter!(m::CAS_RETRIES).increment(o.stats.cas_retries);
            metrics::counter!(m::CLAMPS).increment(o.stats.clamps);
            for s in o.staleness_ms {
                metrics::histogram!(m::STALENESS_SECONDS).record(s / 1000.0);
            }
        }
        Ok(())
    }

    async fn apply_item(
        &self,
        item: String,
        pending: Pending,
        mut row: Option<Row2>,
        window_ms: i64,
    ) -> Result<Outcome> {
        let mut stats = SinkStats::default();
        let mut known = row.is_some();
        for _attempt in 0..20 {
            let last = row.map(|r| r.1).unwrap_or(i64::MIN);
            let fresh: Vec<(&i64, &(i64, i64))> = pending.range(last.saturating_add(1)..).collect();
            if known && fresh.is_empty() {
                stats.fence_skips += pending.len() as u64;
                return Ok(Outcome {
                    item,
                    row,
                    stats,
                    staleness_ms: vec![],
                });
            }
            let n: i64 = fresh.iter().map(|(_, (d, _))| d).sum();
            let top = *fresh.last().map(|(w, _)| *w).unwrap_or(&last);
            let as_of = CqlTimestamp((top + 1) * window_ms);
            let mut next = row.map(|r| r.0).unwrap_or(0).saturating_add(n);
            let clamped = next < 0;
            next = next.max(0);
            stats.lwts += 1;
            let answer = match row {
                None => {
                    self.session
                        .execute_unpaged(&self.insert, (&item, next, top, as_of))
                        .await?
                }
                Some((count, last_window)) => {
                    self.session
                        .execute_unpaged(
                            &self.update,
                            (next, top, as_of, &item, count, last_window),
                        )
                        .await?
                }
            };
            match lwt_answer(answer)? {
                Applied::Yes => {
                    stats.windows_applied += fresh.len() as u64;
                    stats.fence_skips += (pending.len() - fresh.len()) as u64;
                    if clamped {
                        stats.clamps += 1;
                        warn!(%item, window = top, "count would go negative; clamped at 0");
                    }
                    let now = crate::dedupe::state::now_ms();
                    let staleness_ms = fresh
                        .iter()
                        .map(|(_, (_, t))| (now - t).max(0) as f64)
                        .collect();
                    let windows: Vec<i64> = fresh.iter().map(|(w, _)| **w).collect();
                    self.audit(&item, &windows, n)?;
                    return Ok(Outcome {
                        item,
                        row: Some((next, top)),
                        stats,
                        staleness_ms,
                    });
                }
                Applied::No(current) => {
                    stats.cas_retries += 1;
                    row = current;
                    known = true;
                }
            }
        }
        Err(Error::Schema(format!(
            "like_counts row {item}: compare-and-set kept failing"
        )))
    }
}

impl Sink {
    /// Records an applied write right after it applied, so a kill loses at most that line.
    fn audit(&self, item: &str, windows: &[i64], n: i64) -> Result<()> {
        let Some(f) = &self.audit else { return Ok(()) };
        use std::io::Write;
        let ws: Vec<String> = windows.iter().map(i64::to_string).collect();
        // One write per line on an O_APPEND file: a kill leaves whole lines.
        let line = format!("{item}\t{}\t{n}\n", ws.join(","));
        f.lock()
            .unwrap()
            .write_all(line.as_bytes())
            .map_err(|e| Error::State(format!("audit log: {e}")))
    }
}

enum Applied {
    Yes,
    /// Not applied; the row as the database has it (None: no row).
    No(Option<Row2>),
}

fn lwt_answer(result: scylla::response::query_result::QueryResult) -> Result<Applied> {
    let rows = result.into_rows_result()?;
    let names: Vec<String> = rows
        .column_specs()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let row: Row = rows.single_row()?;
    let col = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .and_then(|i| row.columns.get(i).cloned().flatten())
    };
    if let Some(CqlValue::Boolean(true)) = col("[applied]") {
        return Ok(Applied::Yes);
    }
    match (col("count"), col("last_window")) {
        (Some(CqlValue::BigInt(c)), Some(CqlValue::BigInt(w))) => Ok(Applied::No(Some((c, w)))),
        _ => Ok(Applied::No(None)),
    }
}
