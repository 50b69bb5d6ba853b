//! `edges` (one row per (item, user), written only by compare-and-set on its op_id, together
//! with the request keys it remembers) and `edges_by_user`.

use std::collections::BTreeMap;
use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use scylla::value::{CqlTimestamp, CqlValue};

use super::{not_applied, prepare, Columns};
use crate::error::Result;
use crate::records::EARLIER_FLIPS;
use crate::schema::v1::{ClientPlatform, EdgeState};

/// A stored `earlier_at` list as the fixed array edges carry (extra entries dropped).
fn earlier_of(list: &[i64]) -> [i64; EARLIER_FLIPS] {
    let mut out = [0; EARLIER_FLIPS];
    for (slot, &t) in out.iter_mut().zip(list) {
        *slot = t;
    }
    out
}

/// Edges read per query while walking who-liked (unliked rows are skipped client-side).
pub const LIKERS_CHUNK: usize = 200;

/// Items read from a user's index per page (the erase job's page and checkpoint).
pub const USER_ITEMS_PAGE: i32 = 50;

/// An edge as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub liked: bool,
    pub op_id: i64,
    /// When the current state was set (its flip's event time).
    pub updated_at_ms: i64,
    /// The previous flip's event time; 0 when this is the first flip. Events carry it so
    /// stage 1 can tell a first-seen edge's history (docs/exactness.md, "Past the horizon").
    pub prev_at_ms: i64,
    /// The flips before that one, newest first, 0 past the known ones (`earlier_at`): with
    /// `prev_at_ms`, what stage 1 needs to find an edge's counted baseline past its horizon
    /// (docs/exactness.md, "Past the horizon").
    pub earlier_at_ms: [i64; EARLIER_FLIPS],
    /// The `ClientPlatform` of the request that made the current flip (0: not said).
    pub platform: i8,
}

impl Edge {
    /// The client the current flip came from (UNSPECIFIED for a value this version does not
    /// know: a newer writer's).
    pub fn platform(&self) -> ClientPlatform {
        ClientPlatform::try_from(i32::from(self.platform)).unwrap_or_default()
    }

    /// The known earlier flip times (before the previous one), newest first.
    pub fn earlier(&self) -> &[i64] {
        let n = self.earlier_at_ms.iter().take_while(|&&t| t > 0).count();
        &self.earlier_at_ms[..n]
    }

    /// The flip times a flip from this edge carries on as its earlier ones: this edge's
    /// previous flip, then its earlier ones, the oldest dropped past [`EARLIER_FLIPS`].
    pub fn earlier_after_flip(&self) -> [i64; EARLIER_FLIPS] {
        if self.prev_at_ms <= 0 {
            return [0; EARLIER_FLIPS];
        }
        let mut out = [0; EARLIER_FLIPS];
        out[0] = self.prev_at_ms;
        out[1..].copy_from_slice(&self.earlier_at_ms[..EARLIER_FLIPS - 1]);
        out
    }

    /// The edge in a failed conditional write's answer (None without a state column).
    pub fn of_columns(cols: &Columns) -> Option<Edge> {
        let col = |n: &str| {
            cols.iter()
                .find(|(k, _)| k == n)
                .and_then(|(_, v)| v.as_ref())
        };
        let ms = |n: &str| match col(n) {
            Some(CqlValue::Timestamp(t)) => t.0,
            _ => 0,
        };
        let state = match col("state")? {
            CqlValue::TinyInt(v) => *v,
            _ => return None,
        };
        Some(Edge {
            liked: state == EdgeState::Liked as i8,
            op_id: match col("op_id") {
                Some(CqlValue::BigInt(v)) => *v,
                _ => 0,
            },
            updated_at_ms: ms("updated_at"),
            prev_at_ms: ms("prev_at"),
            earlier_at_ms: match col("earlier_at") {
                Some(CqlValue::List(v)) => earlier_of(
                    &v.iter()
                        .filter_map(|x| match x {
                            CqlValue::BigInt(t) => Some(*t),
                            _ => None,
                        })
                        .collect::<Vec<_>>(),
                ),
                _ => [0; EARLIER_FLIPS],
            },
            platform: match col("platform") {
                Some(CqlValue::TinyInt(v)) => *v,
                _ => 0,
            },
        })
    }
}

/// An edge with the request keys it remembers (slot → key and answer, see
/// `store::request_keys`): what a write needs to aim its compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeRow {
    pub edge: Edge,
    pub keys: BTreeMap<i32, String>,
    /// The row's fence stamp (None: never fenced): a compare-and-set aimed by this row names
    /// it in its condition (docs/exactness.md, "The row fence").
    pub fence: Option<i64>,
}

impl EdgeRow {
    /// The row in a failed `INSERT ... IF NOT EXISTS`'s answer (None without a state column).
    pub fn of_columns(cols: &Columns) -> Option<EdgeRow> {
        let edge = Edge::of_columns(cols)?;
        let mut keys = BTreeMap::new();
        if let Some(Some(CqlValue::Map(entries))) = cols
            .iter()
            .find(|(k, _)| k == "recent_keys")
            .map(|(_, v)| v)
        {
            for (k, v) in entries {
                if let (CqlValue::Int(slot), CqlValue::Text(value)) = (k, v) {
                    keys.insert(*slot, value.clone());
                }
            }
        }
        let fence = match cols.iter().find(|(k, _)| k == "fence").map(|(_, v)| v) {
            Some(Some(CqlValue::BigInt(v))) => Some(*v),
            _ => None,
        };
        Some(EdgeRow { edge, keys, fence })
    }
}

/// A conditional write of the edge row: the request's key and answer go in with it. Owned,
/// so that a statement can outlive the request that sent it, as a real one does on the wire
/// (the write path's `api-cas-in-flight` fail point, docs/testing.md).
#[derive(Debug, Clone)]
pub struct Cas {
    pub item: String,
    pub bucket: i32,
    pub user: String,
    /// The slot of `recent_keys` the request writes, and what it writes there.
    pub slot: i32,
    pub value: String,
    /// What this write expects the slot to hold (None: empty).
    pub slot_was: Option<String>,
    /// The fence stamp the row had when this request read it (None: never fenced). A relay
    /// that drops this request's outbox entry moves it first, so this write, landing late,
    /// cannot apply (docs/exactness.md, "The row fence").
    pub fence_was: Option<i64>,
}

pub struct Edges {
    session: Arc<Session>,
    /// The row at SERIAL: every committed LWT is visible.
    read: PreparedStatement,
    /// The row without Paxos: a guess to aim the compare-and-set with.
    peek: PreparedStatement,
    /// `INSERT ... IF NOT EXISTS`: the first write of an edge, with its first request key.
    insert: PreparedStatement,
    /// `UPDATE ... IF op_id = ? AND recent_keys[slot] = ?`: a flip and its request key.
    flip: PreparedStatement,
    /// The same condition, for a request that changes nothing: only its key is written.
    keep: PreparedStatement,
    /// The row fence (docs/exactness.md, "The row fence"): a row made where none was (state
    /// UNLIKED, op_id 0, as a no-op unlike makes it), or the fence stamp moved on the row as
    /// read. Either one fails every compare-and-set aimed before it.
    fence_absent: PreparedStatement,
    fence_present: PreparedStatement,
    /// The user's side of a like (user, item, created_at), for erasure and "my likes".
    by_user: PreparedStatement,
    likers: PreparedStatement,
    /// The erase job's statements: the user's items in order, their number, and the purge.
    user_items: PreparedStatement,
    user_item_count: PreparedStatement,
    delete_if: PreparedStatement,
    unindex: PreparedStatement,
}

impl Edges {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let select = format!(
            "SELECT state, op_id, updated_at, prev_at, recent_keys, platform, earlier_at, fence \
             FROM {ks}.edges \
             WHERE item_id = ? AND bucket = ? AND user_id = ?"
        );
        let mut read = prepare(&session, select.clone()).await?;
        // The actor's own reads and the read after a lost race see every committed LWT.
        read.set_consistency(Consistency::Serial);
        let insert = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.edges \
                 (item_id, bucket, user_id, state, op_id, updated_at, epoch, recent_keys, \
                 platform) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?) IF NOT EXISTS"
            ),
        )
        .await?;
        // The condition on the slot serializes every request that would write it; ScyllaDB
        // documents conditions on collection elements as Cassandra has them.
        // The fence stamp as the request read it (null: never fenced, which `fence = null`
        // matches in Cassandra and ScyllaDB alike).
        let where_if = "WHERE item_id = ? AND bucket = ? AND user_id = ? \
                        IF op_id = ? AND recent_keys[?] = ? AND fence = ?";
        let flip = prepare(
            &session,
            format!(
                "UPDATE {ks}.edges SET state = ?, op_id = ?, updated_at = ?, prev_at = ?, \
                 earlier_at = ?, platform = ?, recent_keys[?] = ? {where_if}"
            ),
        )
        .await?;
        let keep = prepare(
            &session,
            format!("UPDATE {ks}.edges SET recent_keys[?] = ? {where_if}"),
        )
        .await?;
        let fence_absent = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.edges (item_id, bucket, user_id, state, op_id, epoch, fence) \
                 VALUES (?, ?, ?, {}, 0, 0, 1) IF NOT EXISTS",
                EdgeState::Unliked as i8
            ),
        )
        .await?;
        let fence_present = prepare(
            &session,
            format!(
                "UPDATE {ks}.edges SET fence = ? WHERE item_id = ? AND bucket = ? AND user_id = ? \
                 IF op_id = ? AND fence = ?"
            ),
        )
        .await?;
        Ok(Self {
            fence_absent,
            fence_present,
            read,
            // A stale guess only fails the CAS.
            peek: prepare(&session, select).await?,
            insert,
            flip,
            keep,
            by_user: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.edges_by_user (user_id, item_id, created_at) VALUES (?, ?, ?)"
                ),
            )
            .await?,
            likers: prepare(
                &session,
                format!(
                    "SELECT user_id, state FROM {ks}.edges \
                     WHERE item_id = ? AND bucket = ? AND user_id > ? LIMIT {LIKERS_CHUNK}"
                ),
            )
            .await?,
            user_items: prepare(
                &session,
                format!(
                    "SELECT item_id FROM {ks}.edges_by_user WHERE user_id = ? AND item_id > ? \
                     LIMIT {USER_ITEMS_PAGE}"
                ),
            )
            .await?,
            user_item_count: prepare(
                &session,
                format!("SELECT COUNT(*) FROM {ks}.edges_by_user WHERE user_id = ?"),
            )
            .await?,
            delete_if: prepare(
                &session,
                format!(
                    "DELETE FROM {ks}.edges WHERE item_id = ? AND bucket = ? AND user_id = ? \
                     IF op_id = ?"
                ),
            )
            .await?,
            unindex: prepare(
                &session,
                format!("DELETE FROM {ks}.edges_by_user WHERE user_id = ? AND item_id = ?"),
            )
            .await?,
            session,
        })
    }

    /// The statement of [`Edges::index_for_user`], for the outbox's batch that carries it.
    pub fn index_for_user_statement(&self) -> &PreparedStatement {
        &self.by_user
    }

    /// The user's side of an edge: written before the edge's first compare-and-set, so that
    /// erasure finds every row of the user.
    pub async fn index_for_user(&self, user: &str, item: &str, at_ms: i64) -> Result<()> {
        self.session
            .execute_unpaged(&self.by_user, (user, item, CqlTimestamp(at_ms)))
            .await?;
        Ok(())
    }

    /// The user's items after `after` in item order, [`USER_ITEMS_PAGE`] at most.
    pub async fn user_items_after(&self, user: &str, after: &str) -> Result<Vec<String>> {
        let rows = self
            .session
            .execute_unpaged(&self.user_items, (user, after))
            .await?
            .into_rows_result()?;
        let mut out = Vec::new();
        for r in rows.rows::<(String,)>()? {
            out.push(r?.0);
        }
        Ok(out)
    }

    /// How many items the user's index holds.
    pub async fn user_item_count(&self, user: &str) -> Result<i64> {
        Ok(self
            .session
            .execute_unpaged(&self.user_item_count, (user,))
            .await?
            .into_rows_result()?
            .maybe_first_row::<(i64,)>()?
            .map_or(0, |r| r.0))
    }

    /// Deletes the edge row if it is still at `op_id`; whether it was.
    pub async fn delete_if(&self, item: &str, bucket: i32, user: &str, op_id: i64) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.delete_if, (item, bucket, user, op_id))
            .await?;
        Ok(super::not_applied(r)?.is_none())
    }

    /// Deletes one row of the user's index (never the partition: a row written meanwhile
    /// survives).
    pub async fn unindex_for_user(&self, user: &str, item: &str) -> Result<()> {
        self.session
            .execute_unpaged(&self.unindex, (user, item))
            .await?;
        Ok(())
    }

    /// The edge at SERIAL consistency: every committed flip is visible.
    pub async fn read(&self, item: &str, bucket: i32, user: &str) -> Result<Option<Edge>> {
        Ok(self.read_row(item, bucket, user).await?.map(|r| r.edge))
    }

    /// The edge and its request keys at SERIAL consistency.
    pub async fn read_row(&self, item: &str, bucket: i32, user: &str) -> Result<Option<EdgeRow>> {
        self.query_row(&self.read, item, bucket, user).await
    }

    /// The edge and its request keys without Paxos: a guess, except that a key found in it
    /// was written by a compare-and-set that committed, so its answer is final.
    pub async fn peek_row(&self, item: &str, bucket: i32, user: &str) -> Result<Option<EdgeRow>> {
        self.query_row(&self.peek, item, bucket, user).await
    }

    async fn query_row(
        &self,
        statement: &PreparedStatement,
        item: &str,
        bucket: i32,
        user: &str,
    ) -> Result<Option<EdgeRow>> {
        let rows = self
            .session
            .execute_unpaged(statement, (item, bucket, user))
            .await?
            .into_rows_result()?;
        type Stored = (
            Option<i8>,
            Option<i64>,
            Option<CqlTimestamp>,
            Option<CqlTimestamp>,
            Option<BTreeMap<i32, String>>,
            Option<i8>,
            Option<Vec<i64>>,
            Option<i64>,
        );
        let row = rows.maybe_first_row::<Stored>()?;
        Ok(row.map(
            |(state, op_id, at, prev, keys, platform, earlier, fence)| EdgeRow {
                edge: Edge {
                    liked: state == Some(EdgeState::Liked as i8),
                    op_id: op_id.unwrap_or(0),
                    updated_at_ms: at.map(|t| t.0).unwrap_or(0),
                    prev_at_ms: prev.map(|t| t.0).unwrap_or(0),
                    earlier_at_ms: earlier_of(&earlier.unwrap_or_default()),
                    platform: platform.unwrap_or(0),
                },
                keys: keys.unwrap_or_default(),
                fence,
            },
        ))
    }

    /// Fences the row as `seen` (a SERIAL read) found it: makes the row where there was none,
    /// or moves its fence stamp if it is still at `seen`'s op_id and stamp. Once this applied,
    /// no compare-and-set aimed before it can apply, whenever it lands (a statement stalled
    /// on the wire, a paused coordinator), and its committed Paxos round supersedes a
    /// proposal some replica accepted for an older ballot: "no row, or the row as read" is
    /// final for every request that read the row before (docs/exactness.md, "The row
    /// fence"). False when the row changed since `seen`: read it again and decide anew.
    pub async fn fence(
        &self,
        item: &str,
        bucket: i32,
        user: &str,
        seen: Option<&EdgeRow>,
    ) -> Result<bool> {
        let r = match seen {
            None => {
                self.session
                    .execute_unpaged(&self.fence_absent, (item, bucket, user))
                    .await?
            }
            Some(row) => {
                let next = row.fence.unwrap_or(0) + 1;
                self.session
                    .execute_unpaged(
                        &self.fence_present,
                        (next, item, bucket, user, row.edge.op_id, row.fence),
                    )
                    .await?
            }
        };
        Ok(not_applied(r)?.is_none())
    }

    /// The first write of an edge: `edge` (op_id 1 for a like, 0 for an unlike that changes
    /// nothing) and the request's key. None when it applied; otherwise the row as Paxos saw
    /// it (a failed `IF NOT EXISTS` answers with the whole row), or Some(None) if that row
    /// could not be read from the answer.
    pub async fn insert(&self, cas: &Cas, edge: &Edge) -> Result<Option<Option<EdgeRow>>> {
        let state = if edge.liked {
            EdgeState::Liked
        } else {
            EdgeState::Unliked
        } as i8;
        let at = (edge.op_id > 0).then_some(CqlTimestamp(edge.updated_at_ms));
        let keys = BTreeMap::from([(cas.slot, cas.value.as_str())]);
        let r = self
            .session
            .execute_unpaged(
                &self.insert,
                (
                    &cas.item,
                    cas.bucket,
                    &cas.user,
                    state,
                    edge.op_id,
                    at,
                    keys,
                    edge.platform,
                ),
            )
            .await?;
        Ok(not_applied(r)?.map(|cols| EdgeRow::of_columns(&cols)))
    }

    /// A flip from `seen` to `to`, with the request's key, if the row is still at `seen`'s
    /// op_id and its key as the request saw it. Returns whether it applied.
    pub async fn flip(&self, cas: &Cas, seen: &Edge, to: &Edge) -> Result<bool> {
        let state = if to.liked {
            EdgeState::Liked
        } else {
            EdgeState::Unliked
        } as i8;
        let r = self
            .session
            .execute_unpaged(
                &self.flip,
                (
                    state,
                    to.op_id,
                    CqlTimestamp(to.updated_at_ms),
                    CqlTimestamp(to.prev_at_ms),
                    to.earlier().to_vec(),
                    to.platform,
                    cas.slot,
                    &cas.value,
                    &cas.item,
                    cas.bucket,
                    &cas.user,
                    seen.op_id,
                    cas.slot,
                    cas.slot_was.as_deref(),
                    cas.fence_was,
                ),
            )
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// Only the request's key, if the row is still at `seen`'s op_id (so "already in that
    /// state" holds at the moment of the write) and its key as the request saw it.
    pub async fn keep(&self, cas: &Cas, seen: &Edge) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(
                &self.keep,
                (
                    cas.slot,
                    &cas.value,
                    &cas.item,
                    cas.bucket,
                    &cas.user,
                    seen.op_id,
                    cas.slot,
                    cas.slot_was.as_deref(),
                    cas.fence_was,
                ),
            )
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// Up to [`LIKERS_CHUNK`] rows of a bucket after `after`, in user order: (user, liked).
    pub async fn likers_chunk(
        &self,
        item: &str,
        bucket: i32,
        after: &str,
    ) -> Result<Vec<(String, bool)>> {
        let rows = self
            .session
            .execute_unpaged(&self.likers, (item, bucket, after))
            .await?
            .into_rows_result()?;
        let mut out = Vec::new();
        for row in rows.rows::<(String, Option<i8>)>()? {
            let (user, state) = row?;
            out.push((user, state == Some(EdgeState::Liked as i8)));
        }
        Ok(out)
    }
}
