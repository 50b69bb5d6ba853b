//! `outbox` and `outbox_floor`: the entries a write leaves before its flip, cleared once its
//! event is published, and the relay's floor per shard.

use std::collections::BTreeMap;
use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;

use super::prepare;
use crate::error::Result;
use crate::runtime::clock::now_ms;

/// Outbox partitions per minute; the relay walks each.
pub const OUTBOX_SHARDS: u32 = 16;

/// Deletes per batch.
pub const CLEAR_BATCH: usize = 64;

/// Partitions per unlogged batch: Cassandra logs a warning past 10
/// (`unlogged_batch_across_partitions_warn_threshold`).
pub const BATCH_PARTITIONS: usize = 10;

/// Outbox entries the relay reads from one (shard, minute) per pass.
pub const OUTBOX_SCAN_LIMIT: usize = 1000;

/// How long one shard takes a writer's entries before the next takes them.
pub const SHARD_TICK_MS: i64 = 100;

/// The outbox shard of an entry written at `ms`: shards take turns by time, not by item, so
/// that the entries a writer clears together (write/clears.rs gathers 100 ms of them) share a
/// partition, which the database applies as one mutation; over a second the turns spread the
/// entries over ten shards. Any shard holds any item: the relay walks them all.
pub fn outbox_shard(ms: i64) -> i32 {
    (ms.div_euclid(SHARD_TICK_MS) % OUTBOX_SHARDS as i64) as i32
}

/// The outbox partition minute of a time.
pub fn outbox_minute(ms: i64) -> i64 {
    ms.div_euclid(60_000)
}

/// An entry by its clustering key: (item, user, entry id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub item: String,
    pub user: String,
    pub entry: String,
}

/// An entry as the relay reads it.
pub struct Entry {
    pub item: String,
    pub user: String,
    pub entry: String,
    /// When it was written (ms; 0 if unknown).
    pub created_at_ms: i64,
}

pub struct Outbox {
    session: Arc<Session>,
    put: PreparedStatement,
    del: PreparedStatement,
    scan: PreparedStatement,
    scan_after: PreparedStatement,
    floor_read: PreparedStatement,
    floor_set: PreparedStatement,
    floor_advance: PreparedStatement,
    resume_set: PreparedStatement,
    floor_init: PreparedStatement,
}

/// Where a shard's live entries start: its floor minute, and within it (once settled) the
/// clustering position up to which every entry is deleted (None: from the start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    pub minute: i64,
    pub after: Option<Named>,
}

impl Outbox {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let floor_init = prepare(
            &session,
            format!("INSERT INTO {ks}.outbox_floor (shard, minute) VALUES (?, ?) IF NOT EXISTS"),
        )
        .await?;
        Ok(Self {
            put: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.outbox (shard, minute, item_id, user_id, entry, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?)"
                ),
            )
            .await?,
            del: prepare(
                &session,
                format!(
                    "DELETE FROM {ks}.outbox \
                     WHERE shard = ? AND minute = ? AND item_id = ? AND user_id = ? AND entry = ?"
                ),
            )
            .await?,
            // Bounded per pass; what is left waits for the next one.
            scan: prepare(
                &session,
                format!(
                    "SELECT item_id, user_id, entry, created_at FROM {ks}.outbox \
                     WHERE shard = ? AND minute = ? LIMIT {OUTBOX_SCAN_LIMIT}"
                ),
            )
            .await?,
            // The next page, from a clustering position: the rows before it (and the
            // tombstones of those deleted) are not read again (issue 43, hole 5).
            scan_after: prepare(
                &session,
                format!(
                    "SELECT item_id, user_id, entry, created_at FROM {ks}.outbox \
                     WHERE shard = ? AND minute = ? AND (item_id, user_id, entry) > (?, ?, ?) \
                     LIMIT {OUTBOX_SCAN_LIMIT}"
                ),
            )
            .await?,
            floor_read: prepare(
                &session,
                format!(
                    "SELECT minute, after_item, after_user, after_entry FROM {ks}.outbox_floor \
                     WHERE shard = ?"
                ),
            )
            .await?,
            // Every write of a floor row is conditional (the row is made by one, and
            // ScyllaDB advises against mixing): an operator's set, the relay's advance (never
            // backwards: a relay that paused past its lease cannot move it back), the resume
            // position (only while the floor is still the minute it was found in).
            floor_set: prepare(
                &session,
                format!(
                    "UPDATE {ks}.outbox_floor SET minute = ?, after_item = null, \
                     after_user = null, after_entry = null WHERE shard = ? IF EXISTS"
                ),
            )
            .await?,
            floor_advance: prepare(
                &session,
                format!(
                    "UPDATE {ks}.outbox_floor SET minute = ?, after_item = null, \
                     after_user = null, after_entry = null WHERE shard = ? IF minute < ?"
                ),
            )
            .await?,
            resume_set: prepare(
                &session,
                format!(
                    "UPDATE {ks}.outbox_floor SET after_item = ?, after_user = ?, after_entry = ? \
                     WHERE shard = ? IF minute = ?"
                ),
            )
            .await?,
            floor_init,
            session,
        })
    }

    /// Before any entry is written, every shard's floor exists, so the relay never starts
    /// past an entry. A floor already there (set by another process, maybe long ago) is kept.
    pub async fn init_floors(&self) -> Result<()> {
        let start = outbox_minute(now_ms()) - 1;
        for shard in 0..OUTBOX_SHARDS as i32 {
            self.session
                .execute_unpaged(&self.floor_init, (shard, start))
                .await?;
        }
        Ok(())
    }

    /// The entry with the user's side of a like (`edges_by_user`, written by `by_user`: the
    /// edges store's statement) in one unlogged batch: one request to the database instead of
    /// two (docs/design.md, "The database cost of a write"). Unlogged: each row is written or
    /// not on its own, which the two allow (the entry stands for a CAS that may not come,
    /// the user's side may name an edge that never flips).
    pub async fn put_with_user_side(
        &self,
        by_user: &PreparedStatement,
        (shard, minute): (i32, i64),
        item: &str,
        user: &str,
        entry: &str,
        at_ms: i64,
    ) -> Result<()> {
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(by_user.clone());
        batch.append_statement(self.put.clone());
        let at = CqlTimestamp(at_ms);
        self.session
            .batch(
                &batch,
                ((user, item, at), (shard, minute, item, user, entry, at)),
            )
            .await?;
        Ok(())
    }

    /// Deletes entries in as few requests as Cassandra takes without complaint: each batch
    /// names at most [`CLEAR_BATCH`] entries of at most [`BATCH_PARTITIONS`] partitions
    /// (the database's cost is per request as much as per row; a partition's rows are one
    /// mutation).
    pub async fn delete_many(&self, entries: &BTreeMap<(i32, i64), Vec<Named>>) -> Result<()> {
        let mut rows: Vec<((i32, i64), &Named)> = Vec::new();
        for (p, names) in entries {
            rows.extend(names.iter().map(|n| (*p, n)));
        }
        let mut batch = Batch::new(BatchType::Unlogged);
        let mut values = Vec::new();
        let mut partitions = 0;
        let mut last = None;
        for (p, n) in rows {
            let new_partition = last != Some(p);
            if values.len() == CLEAR_BATCH || (new_partition && partitions == BATCH_PARTITIONS) {
                self.session
                    .batch(&batch, std::mem::take(&mut values))
                    .await?;
                batch = Batch::new(BatchType::Unlogged);
                partitions = 0;
                last = None;
            }
            if last != Some(p) {
                partitions += 1;
                last = Some(p);
            }
            batch.append_statement(self.del.clone());
            values.push((p.0, p.1, &n.item, &n.user, &n.entry));
        }
        if !values.is_empty() {
            self.session.batch(&batch, values).await?;
        }
        Ok(())
    }

    pub async fn put(
        &self,
        (shard, minute): (i32, i64),
        item: &str,
        user: &str,
        entry: &str,
        at_ms: i64,
    ) -> Result<()> {
        self.session
            .execute_unpaged(
                &self.put,
                (shard, minute, item, user, entry, CqlTimestamp(at_ms)),
            )
            .await?;
        Ok(())
    }

    pub async fn delete(
        &self,
        (shard, minute): (i32, i64),
        item: &str,
        user: &str,
        entry: &str,
    ) -> Result<()> {
        self.session
            .execute_unpaged(&self.del, (shard, minute, item, user, entry))
            .await?;
        Ok(())
    }

    /// Up to [`OUTBOX_SCAN_LIMIT`] entries of one (shard, minute), after `after` in clustering
    /// order (from the start without it).
    pub async fn scan_page(
        &self,
        shard: i32,
        minute: i64,
        after: Option<&Named>,
    ) -> Result<Vec<Entry>> {
        let result = match after {
            None => {
                self.session
                    .execute_unpaged(&self.scan, (shard, minute))
                    .await?
            }
            Some(n) => {
                self.session
                    .execute_unpaged(
                        &self.scan_after,
                        (shard, minute, &n.item, &n.user, &n.entry),
                    )
                    .await?
            }
        };
        let rows = result.into_rows_result()?;
        let mut out = Vec::new();
        for row in rows.rows::<(String, String, String, Option<CqlTimestamp>)>()? {
            let (item, user, entry, at) = row?;
            out.push(Entry {
                item,
                user,
                entry,
                created_at_ms: at.map(|t| t.0).unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// The shard's floor minute; None before any process of this version wrote there.
    pub async fn floor(&self, shard: i32) -> Result<Option<i64>> {
        Ok(self.floor_at(shard).await?.map(|f| f.minute))
    }

    /// The shard's floor and resume position; None before any process of this version wrote
    /// there.
    pub async fn floor_at(&self, shard: i32) -> Result<Option<Floor>> {
        type Row = (Option<i64>, Option<String>, Option<String>, Option<String>);
        let row = self
            .session
            .execute_unpaged(&self.floor_read, (shard,))
            .await?
            .into_rows_result()?
            .maybe_first_row::<Row>()?;
        Ok(row.and_then(|(minute, item, user, entry)| {
            let after = match (item, user, entry) {
                (Some(item), Some(user), Some(entry)) => Some(Named { item, user, entry }),
                _ => None,
            };
            minute.map(|minute| Floor { minute, after })
        }))
    }

    /// Sets the shard's floor to `minute`, forwards or back, from its start: an operator's
    /// (or a test's) write; the relay only ever [`Outbox::advance_floor`]s.
    pub async fn set_floor(&self, shard: i32, minute: i64) -> Result<()> {
        // The row set if it exists, else made; a row another process made between the two
        // is set on the next turn.
        for _ in 0..3 {
            let set = self
                .session
                .execute_unpaged(&self.floor_set, (minute, shard))
                .await?;
            if super::not_applied(set)?.is_none() {
                return Ok(());
            }
            let made = self
                .session
                .execute_unpaged(&self.floor_init, (shard, minute))
                .await?;
            if super::not_applied(made)?.is_none() {
                return Ok(());
            }
        }
        Err(crate::error::Error::CqlTransient(format!(
            "outbox shard {shard}: its floor kept changing under the set"
        )))
    }

    /// Moves the shard's floor forward to `minute`, from its start; false if it was there or
    /// past it already (another relay moved it).
    pub async fn advance_floor(&self, shard: i32, minute: i64) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.floor_advance, (minute, shard, minute))
            .await?;
        Ok(super::not_applied(r)?.is_none())
    }

    /// Records that every entry of the shard's floor minute up to `after` (clustering order)
    /// is deleted, if the floor is still `minute`; false if it moved. Only for a settled
    /// minute: no entry can be written behind the position later.
    pub async fn set_resume(&self, shard: i32, minute: i64, after: &Named) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(
                &self.resume_set,
                (&after.item, &after.user, &after.entry, shard, minute),
            )
            .await?;
        Ok(super::not_applied(r)?.is_none())
    }
}
