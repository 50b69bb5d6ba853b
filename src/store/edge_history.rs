//! The edges' history as the operations jobs scan it: each row's state, op_id, its last two
//! flip times and the requests it remembers, enough for a cut to tell the edge's state at a
//! time K (ops/cut.rs, `liked_at`). Scans are for jobs, never for requests.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::unprepared::Statement;
use scylla::statement::Consistency;
use scylla::value::CqlTimestamp;

use super::prepare;
use crate::error::{Error, Result};
use crate::schema::v1::EdgeState;

/// One edge's history as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeHistory {
    pub liked: bool,
    pub op_id: i64,
    /// The last flip's time (ms), and the one before it.
    pub updated_at_ms: i64,
    pub prev_at_ms: i64,
    /// `recent_keys`: slot → remembered request (store/request_keys.rs).
    pub keys: BTreeMap<i32, String>,
}

/// The history columns as the driver reads them, behind the keys a scan selects.
type Columns = (Option<i8>, Option<i64>, Stamp, Stamp, Keys);
type Stamp = Option<CqlTimestamp>;
type Keys = Option<BTreeMap<i32, String>>;

impl EdgeHistory {
    fn of((state, op, at, prev, keys): Columns) -> Self {
        Self {
            liked: state == Some(EdgeState::Liked as i8),
            op_id: op.unwrap_or(0),
            updated_at_ms: at.map_or(0, |t| t.0),
            prev_at_ms: prev.map_or(0, |t| t.0),
            keys: keys.unwrap_or_default(),
        }
    }
}

const COLUMNS: &str = "state, op_id, updated_at, prev_at, recent_keys";

/// Rows read per page by a whole-table scan.
const SCAN_PAGE: i32 = 2000;

pub struct EdgeHistories {
    session: Arc<Session>,
    ks: String,
    /// One item's bucket at SERIAL: a Paxos round left half-done by a crashed writer is
    /// finished (or dropped) before the row is read, so no flip stamped before K can appear
    /// after the recount.
    of_bucket: PreparedStatement,
    /// The first item at or after a token: a random draw of items that have edges.
    at_token: PreparedStatement,
}

impl EdgeHistories {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let mut of_bucket = prepare(
            &session,
            format!("SELECT user_id, {COLUMNS} FROM {ks}.edges WHERE item_id = ? AND bucket = ?"),
        )
        .await?;
        of_bucket.set_consistency(Consistency::Serial);
        let at_token = prepare(
            &session,
            format!("SELECT item_id FROM {ks}.edges WHERE token(item_id, bucket) >= ? LIMIT 1"),
        )
        .await?;
        Ok(Self {
            session,
            ks: ks.to_string(),
            of_bucket,
            at_token,
        })
    }

    /// Every edge of one item's bucket, (user, history), read at SERIAL.
    pub async fn of_bucket(
        &self,
        item: &str,
        bucket: i32,
    ) -> Result<impl Stream<Item = Result<(String, EdgeHistory)>>> {
        Ok(self
            .session
            .execute_iter(self.of_bucket.clone(), (item, bucket))
            .await?
            .rows_stream::<(String, Option<i8>, Option<i64>, Stamp, Stamp, Keys)>()?
            .map_ok(|(user, s, o, a, p, k)| (user, EdgeHistory::of((s, o, a, p, k))))
            .map_err(Error::from))
    }

    /// Every edge of the table, (item, user, history), at QUORUM page by page.
    pub async fn all(&self) -> Result<impl Stream<Item = Result<(String, String, EdgeHistory)>>> {
        let mut q = Statement::new(format!(
            "SELECT item_id, user_id, {COLUMNS} FROM {}.edges",
            self.ks
        ));
        q.set_consistency(Consistency::Quorum);
        q.set_page_size(SCAN_PAGE);
        Ok(self
            .session
            .query_iter(q, ())
            .await?
            .rows_stream::<(String, String, Option<i8>, Option<i64>, Stamp, Stamp, Keys)>()?
            .map_ok(|(item, user, s, o, a, p, k)| (item, user, EdgeHistory::of((s, o, a, p, k))))
            .map_err(Error::from))
    }

    /// The item of the first edge partition at or after `token` (None past the last).
    pub async fn item_at_token(&self, token: i64) -> Result<Option<String>> {
        let rows = self
            .session
            .execute_unpaged(&self.at_token, (token,))
            .await?
            .into_rows_result()?;
        Ok(rows.maybe_first_row::<(String,)>()?.map(|r| r.0))
    }

    /// Every item that has an edge.
    pub async fn items(&self) -> Result<std::collections::BTreeSet<String>> {
        let mut items = std::collections::BTreeSet::new();
        let mut rows = self
            .session
            .query_iter(
                format!("SELECT DISTINCT item_id, bucket FROM {}.edges", self.ks),
                (),
            )
            .await?
            .rows_stream::<(String, i32)>()?;
        while let Some((item, _)) = rows.try_next().await? {
            items.insert(item);
        }
        Ok(items)
    }
}
