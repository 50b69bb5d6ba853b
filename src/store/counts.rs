//! `like_counts`: the counter rows, read by the API and the operations jobs, and written only
//! through [`Fence`] (stage 2's sink and `likes rebuild`; docs/design.md, "The fence").

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::TryStreamExt;

use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use scylla::value::{CqlTimestamp, CqlValue, Row};

use crate::error::{Error, Result};

/// A counter row as a writer last saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterRow {
    /// The sum of every window applied (may be negative for a moment; served as 0).
    pub count: i64,
    /// The end time (ms, log clock) of the last window applied: the fence.
    pub last_window: i64,
    /// The snapshot time of the last correction applied (the correction fence). None when the
    /// row has none, or when the answer it came from did not carry it (a write that decides a
    /// correction always conditions on it, so a wrong None only fails that write).
    pub last_correction: Option<i64>,
}

/// The conditional writes of `like_counts`, prepared once: every write of a counter row is
/// a compare-and-set on the row as the writer saw it.
pub struct Fence {
    insert: PreparedStatement,
    update: PreparedStatement,
    /// The update of a row whose write decides a correction: it also conditions on, and sets,
    /// last_correction.
    update_corrected: PreparedStatement,
}

/// One counter row's conditional write: from the row as the writer saw it (`seen`, None: no
/// row) to `to`, stamped `as_of`. `correcting` says the write decides a correction: it then
/// conditions on the row's last_correction too and sets `to`'s.
#[derive(Debug, Clone, Copy)]
pub struct RowWrite<'a> {
    pub shard: i32,
    pub item: &'a str,
    pub seen: Option<CounterRow>,
    pub to: CounterRow,
    pub as_of: i64,
    pub correcting: bool,
}

/// The values of a batch being built, one list per statement.
pub type BatchValues = Vec<Vec<Option<CqlValue>>>;

impl Fence {
    /// Prepared at each incarnation of stage 2, perhaps while a node restarts: a failure is
    /// worth another incarnation.
    pub async fn prepare(session: &Session, ks: &str) -> Result<Self> {
        let p = |q: String| async move {
            session
                .prepare(q.clone())
                .await
                .map_err(|e| Error::CqlTransient(format!("prepare {q}: {e}")))
        };
        Ok(Self {
            insert: p(format!(
                "INSERT INTO {ks}.like_counts \
                 (shard, item_id, count, last_window, as_of, last_correction) \
                 VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS"
            ))
            .await?,
            update: p(format!(
                "UPDATE {ks}.like_counts SET count = ?, last_window = ?, as_of = ? \
                 WHERE shard = ? AND item_id = ? IF count = ? AND last_window = ?"
            ))
            .await?,
            update_corrected: p(format!(
                "UPDATE {ks}.like_counts \
                 SET count = ?, last_window = ?, as_of = ?, last_correction = ? \
                 WHERE shard = ? AND item_id = ? \
                 IF count = ? AND last_window = ? AND last_correction = ?"
            ))
            .await?,
        })
    }

    /// Adds the write `w` to `batch`.
    pub fn append(&self, batch: &mut Batch, values: &mut BatchValues, w: &RowWrite<'_>) {
        let RowWrite {
            shard,
            item,
            seen,
            to,
            as_of,
            correcting,
        } = *w;
        let big = |v: i64| Some(CqlValue::BigInt(v));
        let as_of = Some(CqlValue::Timestamp(CqlTimestamp(as_of)));
        let corr = to.last_correction.map(CqlValue::BigInt);
        let key = [
            Some(CqlValue::Int(shard)),
            Some(CqlValue::Text(item.to_string())),
        ];
        match seen {
            None => {
                batch.append_statement(self.insert.clone());
                let mut v = key.to_vec();
                v.extend([big(to.count), big(to.last_window), as_of, corr]);
                values.push(v);
            }
            Some(was) if correcting => {
                batch.append_statement(self.update_corrected.clone());
                let mut v = vec![big(to.count), big(to.last_window), as_of, corr];
                v.extend(key);
                v.extend([
                    big(was.count),
                    big(was.last_window),
                    was.last_correction.map(CqlValue::BigInt),
                ]);
                values.push(v);
            }
            Some(was) => {
                batch.append_statement(self.update.clone());
                let mut v = vec![big(to.count), big(to.last_window), as_of];
                v.extend(key);
                v.extend([big(was.count), big(was.last_window)]);
                values.push(v);
            }
        }
    }

    /// A new, empty conditional batch (the rows of one shard: one Paxos round).
    pub fn batch() -> Batch {
        Batch::new(BatchType::Unlogged)
    }

    /// Sends a batch built by [`Fence::append`]: `None` when it applied; otherwise the rows as
    /// the database has them, by item (an item absent there has no row).
    pub async fn send(
        session: &Session,
        batch: &Batch,
        values: BatchValues,
    ) -> Result<Option<HashMap<String, CounterRow>>> {
        answer(session.batch(batch, values).await?)
    }

    /// One row's write, alone in its batch (`likes rebuild`): whether it applied, else the
    /// row as it is.
    pub async fn write_one(
        &self,
        session: &Session,
        w: &RowWrite<'_>,
    ) -> Result<std::result::Result<(), Option<CounterRow>>> {
        let (mut batch, mut values) = (Self::batch(), BatchValues::new());
        self.append(&mut batch, &mut values, w);
        Ok(match Self::send(session, &batch, values).await? {
            None => Ok(()),
            Some(mut rows) => Err(rows.remove(w.item)),
        })
    }
}

/// `None` when a conditional batch applied; otherwise the rows it returned, by item.
fn answer(
    result: scylla::response::query_result::QueryResult,
) -> Result<Option<HashMap<String, CounterRow>>> {
    let rows = result.into_rows_result()?;
    let names = crate::cql::column_names(&rows);
    let at = |name: &str| names.iter().position(|n| n == name);
    let (item, count, last) = (at("item_id"), at("count"), at("last_window"));
    let corrected = at("last_correction");
    let mut current = HashMap::new();
    for row in rows.rows::<Row>()? {
        let row = row?;
        let col = |i: Option<usize>| i.and_then(|i| row.columns.get(i).cloned().flatten());
        if crate::records::lwt_applied(&names, &row.columns) == Some(true) {
            return Ok(None);
        }
        if let (Some(CqlValue::Text(i)), Some(CqlValue::BigInt(c)), Some(CqlValue::BigInt(w))) =
            (col(item), col(count), col(last))
        {
            let last_correction = match col(corrected) {
                Some(CqlValue::BigInt(v)) => Some(v),
                _ => None,
            };
            current.insert(
                i,
                CounterRow {
                    count: c,
                    last_window: w,
                    last_correction,
                },
            );
        }
    }
    Ok(Some(current))
}

pub struct Counts {
    session: Arc<Session>,
    ks: String,
    read: PreparedStatement,
    /// The whole row at SERIAL: a Paxos round a crashed writer left half-done is finished
    /// (or dropped) before it is read.
    read_row: PreparedStatement,
}

impl Counts {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let read = super::prepare(
            &session,
            format!("SELECT count, as_of FROM {ks}.like_counts WHERE shard = ? AND item_id = ?"),
        )
        .await?;
        let mut read_row = super::prepare(
            &session,
            format!(
                "SELECT count, last_window, last_correction FROM {ks}.like_counts \
                 WHERE shard = ? AND item_id = ?"
            ),
        )
        .await?;
        read_row.set_consistency(Consistency::Serial);
        Ok(Self {
            session,
            ks: ks.to_string(),
            read,
            read_row,
        })
    }

    /// An item's counter row at SERIAL (None: no row yet).
    pub async fn row(&self, shard: i32, item: &str) -> Result<Option<CounterRow>> {
        let row = self
            .session
            .execute_unpaged(&self.read_row, (shard, item))
            .await?
            .into_rows_result()?
            .maybe_first_row::<(Option<i64>, Option<i64>, Option<i64>)>()?;
        Ok(row.map(|(count, last_window, last_correction)| CounterRow {
            count: count.unwrap_or(0),
            last_window: last_window.unwrap_or(0),
            last_correction,
        }))
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
