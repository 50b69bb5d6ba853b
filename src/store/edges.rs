//! `edges` (one row per (item, user), flipped by compare-and-set on its op_id) and
//! `edges_by_user`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::TryStreamExt;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlTimestamp, CqlValue};

use super::{prepare, Columns};
use crate::error::Result;
use crate::schema::v1::EdgeState;

/// Edges read per query while walking who-liked (unliked rows are skipped client-side).
pub const LIKERS_CHUNK: usize = 200;

/// An edge as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub liked: bool,
    pub op_id: i64,
    /// When the current state was set (its flip's event time).
    pub updated_at_ms: i64,
    /// The previous flip's event time; 0 when this is the first flip. Events carry it so
    /// stage 1 can tell a first-seen edge's history (see the README's delta rule note).
    pub prev_at_ms: i64,
}

impl Edge {
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
        })
    }
}

pub struct Edges {
    session: Arc<Session>,
    ks: String,
    read: PreparedStatement,
    peek: PreparedStatement,
    /// `INSERT ... IF NOT EXISTS`: the first flip of an edge (state, updated_at).
    pub(crate) insert: PreparedStatement,
    /// `UPDATE ... IF op_id = ?`: a later flip (state, op_id, updated_at, prev_at, key, old op_id).
    pub(crate) update: PreparedStatement,
    /// The user's side of a like (user, item, created_at), for erasure and "my likes".
    pub(crate) by_user: PreparedStatement,
    likers: PreparedStatement,
}

impl Edges {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let select = format!(
            "SELECT state, op_id, updated_at, prev_at FROM {ks}.edges \
             WHERE item_id = ? AND bucket = ? AND user_id = ?"
        );
        let mut read = prepare(&session, select.clone()).await?;
        // The actor's own reads and the read before a flip see every committed LWT.
        read.set_consistency(Consistency::Serial);
        let mut insert = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.edges (item_id, bucket, user_id, state, op_id, updated_at, epoch) \
                 VALUES (?, ?, ?, ?, 1, ?, 0) IF NOT EXISTS"
            ),
        )
        .await?;
        let mut update = prepare(
            &session,
            format!(
                "UPDATE {ks}.edges SET state = ?, op_id = ?, updated_at = ?, prev_at = ? \
                 WHERE item_id = ? AND bucket = ? AND user_id = ? IF op_id = ?"
            ),
        )
        .await?;
        for st in [&mut insert, &mut update] {
            st.set_serial_consistency(Some(SerialConsistency::Serial));
        }
        Ok(Self {
            read,
            // A guess to aim the compare-and-set with: a stale guess only fails the CAS.
            peek: prepare(&session, select).await?,
            insert,
            update,
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
            session,
            ks: ks.to_string(),
        })
    }

    /// Every edge's state, (item, user) → liked, read page by page: for checks and jobs over
    /// the whole keyspace, never for requests.
    pub async fn all_states(&self) -> Result<HashMap<(String, String), bool>> {
        let mut rows = self
            .session
            .query_iter(
                format!("SELECT item_id, user_id, state FROM {}.edges", self.ks),
                (),
            )
            .await?
            .rows_stream::<(String, String, Option<i8>)>()?;
        let mut out = HashMap::new();
        while let Some((item, user, state)) = rows.try_next().await? {
            out.insert((item, user), state == Some(EdgeState::Liked as i8));
        }
        Ok(out)
    }

    /// LIKED edges per item over the whole keyspace: what each count must converge to.
    pub async fn liked_per_item(&self) -> Result<BTreeMap<String, i64>> {
        let mut out = BTreeMap::new();
        for ((item, _), liked) in self.all_states().await? {
            if liked {
                *out.entry(item).or_insert(0) += 1;
            }
        }
        Ok(out)
    }

    /// The edge at SERIAL consistency: every committed flip is visible.
    pub async fn read(&self, item: &str, bucket: i32, user: &str) -> Result<Option<Edge>> {
        self.query(&self.read, item, bucket, user).await
    }

    /// The edge at the session's consistency, without Paxos: a guess that may be stale.
    pub async fn peek(&self, item: &str, bucket: i32, user: &str) -> Result<Option<Edge>> {
        self.query(&self.peek, item, bucket, user).await
    }

    async fn query(
        &self,
        statement: &PreparedStatement,
        item: &str,
        bucket: i32,
        user: &str,
    ) -> Result<Option<Edge>> {
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
        );
        let row = rows.maybe_first_row::<Stored>()?;
        Ok(row.map(|(state, op_id, at, prev)| Edge {
            liked: state == Some(EdgeState::Liked as i8),
            op_id: op_id.unwrap_or(0),
            updated_at_ms: at.map(|t| t.0).unwrap_or(0),
            prev_at_ms: prev.map(|t| t.0).unwrap_or(0),
        }))
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
