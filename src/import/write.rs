//! One chunk of rows into the store (docs/adoption.md, "What the import writes"): rows of
//! erased users and of items homed in another region refused, the users' index written first
//! (as the write path orders it: erasure walks it), then each edge by a conditional write.
//! Rows of one edge partition go in as one conditional batch (one Paxos round for all of
//! them); a batch that meets any existing row falls back to one conditional write per row,
//! which tells a re-run's own row from one the live write path has touched.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::future::join_all;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::region::{Route, Routes};
use crate::store::erasures::Erasures;
use crate::store::imported::{Found, Imported, ImportedEdge, PARTITION_BATCH};

/// Why a row changed nothing (the summary's and the checkpoint's keys).
pub const ALREADY: &str = "already-imported";
pub const SUPERSEDED: &str = "superseded";
pub const LIVE: &str = "live";

/// Users per erased-account read (`user_key IN ?`).
const ERASED_READ: usize = 64;

/// Conditional writes of one edge before the import leaves it to the live write path: each
/// retry follows a lost race, and only live requests race the import's own row.
const RACES: usize = 4;

/// What became of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new edge row.
    Loaded,
    /// The import's own row, replaced by a later row of the same edge.
    Updated,
    Skipped(&'static str),
    Rejected(String),
    /// A row of an erased account: refused, and its reject line names the erasure, never the
    /// user or the row (issue 44: the account's data would outlive its erasure there).
    Erased(String),
}

/// A row on its way: its number, its edge or why not.
pub type Shaped = (u64, std::result::Result<ImportedEdge, String>);

pub struct ChunkWriter {
    pub imported: Imported,
    pub erasures: Erasures,
    pub routes: Option<Routes>,
    /// Statements in flight, across all chunks.
    pub permits: Arc<Semaphore>,
}

impl ChunkWriter {
    /// The outcome of each row, in the chunk's order.
    pub async fn write(&self, rows: &[Shaped]) -> Result<Vec<Outcome>> {
        let mut out: Vec<Option<Outcome>> = rows
            .iter()
            .map(|(_, r)| r.as_ref().err().map(|why| Outcome::Rejected(why.clone())))
            .collect();
        let valid: Vec<(usize, &ImportedEdge)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, (_, r))| r.as_ref().ok().map(|e| (i, e)))
            .collect();
        let erased = self.erased(&valid).await?;
        // The latest row of each edge in the chunk; the others are older news.
        let mut latest: HashMap<(&str, &str), (usize, &ImportedEdge)> = HashMap::new();
        for &(i, e) in &valid {
            if let Some(id) = erased.get(&e.user) {
                out[i] = Some(Outcome::Erased(id.to_string()));
                continue;
            }
            if let Some(why) = self.not_here(&e.item)? {
                out[i] = Some(Outcome::Rejected(why));
                continue;
            }
            match latest.entry((e.item.as_str(), e.user.as_str())) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert((i, e));
                }
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    let (j, f) = *o.get();
                    if e.source_ms >= f.source_ms {
                        out[j] = Some(Outcome::Skipped(SUPERSEDED));
                        o.insert((i, e));
                    } else {
                        out[i] = Some(Outcome::Skipped(SUPERSEDED));
                    }
                }
            }
        }
        let keep: Vec<(usize, &ImportedEdge)> = {
            let mut v: Vec<_> = latest.into_values().collect();
            v.sort_by_key(|x| x.0);
            v
        };
        let edges: Vec<&ImportedEdge> = keep.iter().map(|x| x.1).collect();
        join_all(edges.chunks(10).map(|part| async move {
            let _p = self.permit().await;
            self.imported.index_users(part).await
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
        let mut partitions: BTreeMap<(&str, i32), Vec<(usize, &ImportedEdge)>> = BTreeMap::new();
        for &(i, e) in &keep {
            partitions
                .entry((e.item.as_str(), e.bucket))
                .or_default()
                .push((i, e));
        }
        let groups: Vec<&[(usize, &ImportedEdge)]> = partitions
            .values()
            .flat_map(|v| v.chunks(PARTITION_BATCH))
            .collect();
        let done = join_all(groups.into_iter().map(|g| self.group(g))).await;
        for r in done {
            for (i, o) in r? {
                out[i] = Some(o);
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Skipped(SUPERSEDED)))
            .collect())
    }

    async fn permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.permits
            .acquire()
            .await
            .expect("the semaphore is never closed")
    }

    /// Rows of one partition: one conditional batch, or row by row when any is there already.
    async fn group(&self, g: &[(usize, &ImportedEdge)]) -> Result<Vec<(usize, Outcome)>> {
        if g.len() > 1 {
            let edges: Vec<&ImportedEdge> = g.iter().map(|x| x.1).collect();
            let went_in = {
                let _p = self.permit().await;
                self.imported.insert_all(&edges).await?
            };
            if went_in {
                return Ok(g.iter().map(|&(i, _)| (i, Outcome::Loaded)).collect());
            }
        }
        let mut out = Vec::with_capacity(g.len());
        for &(i, e) in g {
            out.push((i, self.one(e).await?));
        }
        Ok(out)
    }

    async fn one(&self, e: &ImportedEdge) -> Result<Outcome> {
        for _ in 0..RACES {
            let _p = self.permit().await;
            let Some(cols) = self.imported.insert(e).await? else {
                return Ok(Outcome::Loaded);
            };
            let (source_ms, liked) = match Found::of_columns(&cols) {
                Found::Live => return Ok(Outcome::Skipped(LIVE)),
                Found::Imported {
                    source_ms, liked, ..
                } => (source_ms, liked),
            };
            if (source_ms, liked) == (e.source_ms, e.liked) {
                return Ok(Outcome::Skipped(ALREADY));
            }
            if e.source_ms <= source_ms {
                return Ok(Outcome::Skipped(SUPERSEDED));
            }
            if self.imported.replace(e, (source_ms, liked)).await? {
                return Ok(Outcome::Updated);
            }
        }
        // Every attempt lost to another writer: only live requests write these rows besides
        // the import, so the edge is theirs now.
        Ok(Outcome::Skipped(LIVE))
    }

    /// The erased among the rows' users (user → erasure id).
    async fn erased(&self, valid: &[(usize, &ImportedEdge)]) -> Result<HashMap<String, String>> {
        let mut users: Vec<String> = valid.iter().map(|(_, e)| e.user.clone()).collect();
        users.sort();
        users.dedup();
        let found = join_all(users.chunks(ERASED_READ).map(|part| async move {
            let _p = self.permit().await;
            self.erasures.erased_among(part).await
        }))
        .await;
        let mut out = HashMap::new();
        for f in found {
            out.extend(f?);
        }
        Ok(out)
    }

    /// Why this region does not import the item (another region is its home), if so.
    fn not_here(&self, item: &str) -> Result<Option<String>> {
        let Some(routes) = &self.routes else {
            return Ok(None);
        };
        match routes.route(item) {
            Route::Here(_) => Ok(None),
            Route::Elsewhere { home, .. } => Ok(Some(format!(
                "item {item:?} is homed in region {home}: import its rows there"
            ))),
            // A move under way: not the row's fault. The job stops at its checkpoint.
            Route::Closed(why) => Err(Error::Refused(format!(
                "item {item:?}: {why}; run the import again once the move has settled (it resumes)"
            ))),
        }
    }
}
