//! `like_counts` as the API reads it (stage 2's sink writes it through its fence).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::TryStreamExt;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;

use crate::error::Result;

pub struct Counts {
    session: Arc<Session>,
    ks: String,
    read: PreparedStatement,
}

impl Counts {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let read = super::prepare(
            &session,
            format!("SELECT count, as_of FROM {ks}.like_counts WHERE shard = ? AND item_id = ?"),
        )
        .await?;
        Ok(Self {
            session,
            ks: ks.to_string(),
            read,
        })
    }

    /// An item's count and as_of (ms); (0, None) before its first window is applied. A
    /// negative sum on the row (transient, and alerting: see count/sink.rs) is served as 0.
    pub async fn read(&self, shard: i32, item: &str) -> Result<(i64, Option<i64>)> {
        let row = self
            .session
            .execute_unpaged(&self.read, (shard, item))
            .await?
            .into_rows_result()?
            .maybe_first_row::<(Option<i64>, Option<CqlTimestamp>)>()?;
        Ok(row.map_or((0, None), |(c, at)| {
            (c.unwrap_or(0).max(0), at.map(|t| t.0))
        }))
    }

    /// Every counter row, item → (count, as_of ms), read page by page: for checks and jobs
    /// over the whole keyspace (a demo, a benchmark, drift), never for requests.
    pub async fn all(&self) -> Result<BTreeMap<String, (i64, Option<i64>)>> {
        let mut rows = self
            .session
            .query_iter(
                format!("SELECT item_id, count, as_of FROM {}.like_counts", self.ks),
                (),
            )
            .await?
            .rows_stream::<(String, Option<i64>, Option<CqlTimestamp>)>()?;
        let mut out = BTreeMap::new();
        while let Some((item, count, as_of)) = rows.try_next().await? {
            out.insert(item, (count.unwrap_or(0), as_of.map(|t| t.0)));
        }
        Ok(out)
    }
}
