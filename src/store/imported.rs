//! The import's writes (`likes import`, docs/adoption.md): edges in the shape the write path
//! leaves them, each by a conditional statement, so an edge the live write path has touched is
//! never overwritten, and the users' index before them, as the write path orders it.
//!
//! An imported row carries a marker in `recent_keys` slot 0 (`import,<source ms>,<1|0>`):
//! it tells a re-run, a resumed run and a later row of the same edge in the file that the row
//! is the import's own. No request key ever decodes as it (`request_keys::Remembered` needs
//! `like`/`unlike` first), and a live request takes slot 1, the first free one, so "slot 1
//! is empty" is "no live request has touched this edge".

use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlTimestamp, CqlValue};

use super::{not_applied, prepare, Columns};
use crate::error::Result;
use crate::schema::v1::EdgeState;

/// Rows per conditional batch: one Paxos round for the rows of one partition.
pub const PARTITION_BATCH: usize = 32;

/// Partitions per unlogged batch of the users' index (Cassandra warns past 10).
const USER_BATCH: usize = 10;

/// One edge as the import writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedEdge {
    pub item: String,
    pub bucket: i32,
    pub user: String,
    pub liked: bool,
    /// When the source says the edge took its state (what the marker keeps).
    pub source_ms: i64,
    /// `updated_at` as stored: see `import::shape`.
    pub updated_at_ms: Option<i64>,
}

impl ImportedEdge {
    /// The write path's op_id for the state: a like is the edge's first flip, an unlike
    /// none (an unlike that created the row).
    pub fn op_id(&self) -> i64 {
        i64::from(self.liked)
    }

    /// The `state` column as the write path stores it (`EdgeState`).
    pub fn state(&self) -> i8 {
        if self.liked {
            EdgeState::Liked as i8
        } else {
            EdgeState::Unliked as i8
        }
    }

    pub fn marker(&self) -> String {
        marker(self.source_ms, self.liked)
    }
}

pub fn marker(source_ms: i64, liked: bool) -> String {
    format!("import,{source_ms},{}", u8::from(liked))
}

/// The (source ms, liked) of an import marker; None for anything else.
pub fn parse_marker(s: &str) -> Option<(i64, bool)> {
    let mut p = s.split(',');
    if p.next()? != "import" {
        return None;
    }
    let ms = p.next()?.parse().ok()?;
    let liked = match p.next()? {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    p.next().is_none().then_some((ms, liked))
}

/// What an existing edge row says to the import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The import's own row, untouched since: its marker and op_id.
    Imported {
        source_ms: i64,
        liked: bool,
        op_id: i64,
    },
    /// Anything else: the live write path (or an operator's job) has the edge.
    Live,
}

impl Found {
    pub fn of_columns(cols: &Columns) -> Found {
        let col = |n: &str| {
            cols.iter()
                .find(|(k, _)| k == n)
                .and_then(|(_, v)| v.as_ref())
        };
        let op_id = match col("op_id") {
            Some(CqlValue::BigInt(v)) => *v,
            _ => return Found::Live,
        };
        let Some(CqlValue::Map(keys)) = col("recent_keys") else {
            return Found::Live;
        };
        let slot = |n: i32| {
            keys.iter().find_map(|(k, v)| match (k, v) {
                (CqlValue::Int(s), CqlValue::Text(t)) if *s == n => Some(t.as_str()),
                _ => None,
            })
        };
        match (slot(0).and_then(parse_marker), slot(1), keys.len()) {
            (Some((source_ms, liked)), None, 1) if op_id == i64::from(liked) => Found::Imported {
                source_ms,
                liked,
                op_id,
            },
            _ => Found::Live,
        }
    }
}

pub struct Imported {
    session: Arc<Session>,
    insert: PreparedStatement,
    replace: PreparedStatement,
    by_user: PreparedStatement,
    bare: PreparedStatement,
}

impl Imported {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let insert = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.edges \
                 (item_id, bucket, user_id, state, op_id, updated_at, epoch, recent_keys, platform) \
                 VALUES (?, ?, ?, ?, ?, ?, 0, ?, 0) IF NOT EXISTS"
            ),
        )
        .await?;
        // Only the import's own row, with no live request on it (slot 1 empty).
        let replace = prepare(
            &session,
            format!(
                "UPDATE {ks}.edges SET state = ?, op_id = ?, updated_at = ?, recent_keys[0] = ? \
                 WHERE item_id = ? AND bucket = ? AND user_id = ? \
                 IF op_id = ? AND recent_keys[0] = ? AND recent_keys[1] = null"
            ),
        )
        .await?;
        let by_user = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.edges_by_user (user_id, item_id, created_at) VALUES (?, ?, ?)"
            ),
        )
        .await?;
        // The benchmark's baseline (tools' bench import): the same row, unconditionally.
        let bare = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.edges \
                 (item_id, bucket, user_id, state, op_id, updated_at, epoch, recent_keys, platform) \
                 VALUES (?, ?, ?, ?, ?, ?, 0, ?, 0)"
            ),
        )
        .await?;
        Ok(Self {
            session,
            insert,
            replace,
            by_user,
            bare,
        })
    }

    fn insert_values(
        e: &ImportedEdge,
    ) -> (
        &str,
        i32,
        &str,
        i8,
        i64,
        Option<CqlTimestamp>,
        std::collections::BTreeMap<i32, String>,
    ) {
        (
            &e.item,
            e.bucket,
            &e.user,
            e.state(),
            e.op_id(),
            e.updated_at_ms.map(CqlTimestamp),
            std::collections::BTreeMap::from([(0, e.marker())]),
        )
    }

    /// The users' side of the edges, before the edges (erasure walks it to find them).
    pub async fn index_users(&self, edges: &[&ImportedEdge]) -> Result<()> {
        for part in edges.chunks(USER_BATCH) {
            let mut batch = Batch::new(BatchType::Unlogged);
            let mut values = Vec::with_capacity(part.len());
            for e in part {
                batch.append_statement(self.by_user.clone());
                values.push((e.user.as_str(), e.item.as_str(), CqlTimestamp(e.source_ms)));
            }
            self.session.batch(&batch, values).await?;
        }
        Ok(())
    }

    /// Inserts edges of one partition, all or none, in one Paxos round: whether they went in.
    pub async fn insert_all(&self, edges: &[&ImportedEdge]) -> Result<bool> {
        let mut batch = Batch::new(BatchType::Unlogged);
        let mut values = Vec::with_capacity(edges.len());
        for e in edges {
            batch.append_statement(self.insert.clone());
            values.push(Self::insert_values(e));
        }
        let rows = self
            .session
            .batch(&batch, values)
            .await?
            .into_rows_result()?;
        let names = crate::cql::column_names(&rows);
        let first = rows.rows::<scylla::value::Row>()?.next().transpose()?;
        Ok(first
            .map(|r| crate::records::lwt_applied(&names, &r.columns) == Some(true))
            .unwrap_or(false))
    }

    /// Inserts one edge if it has no row: None if it went in, else the row there.
    pub async fn insert(&self, e: &ImportedEdge) -> Result<Option<Columns>> {
        let r = self
            .session
            .execute_unpaged(&self.insert, Self::insert_values(e))
            .await?;
        not_applied(r)
    }

    /// Replaces the import's own row (at `was`'s marker and op_id) with a newer state of the
    /// edge from the source: whether it did.
    pub async fn replace(&self, e: &ImportedEdge, was: (i64, bool)) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(
                &self.replace,
                (
                    e.state(),
                    e.op_id(),
                    e.updated_at_ms.map(CqlTimestamp),
                    e.marker(),
                    &e.item,
                    e.bucket,
                    &e.user,
                    i64::from(was.1),
                    marker(was.0, was.1),
                ),
            )
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// The benchmark's baseline: the edge row written without a condition.
    pub async fn insert_bare(&self, e: &ImportedEdge) -> Result<()> {
        let v = Self::insert_values(e);
        self.session.execute_unpaged(&self.bare, v).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_no_request_key_reads_as_one() {
        assert_eq!(
            parse_marker(&marker(1_700_000_000_123, true)),
            Some((1_700_000_000_123, true))
        );
        assert_eq!(parse_marker(&marker(5, false)), Some((5, false)));
        assert_eq!(parse_marker("like,1,1,5,u:import,5,1"), None);
        assert_eq!(parse_marker("import,5,1,extra"), None);
        assert!(crate::store::request_keys::Remembered::decode(&marker(5, true)).is_none());
    }

    fn cols(op_id: i64, keys: &[(i32, &str)]) -> Columns {
        vec![
            ("op_id".into(), Some(CqlValue::BigInt(op_id))),
            (
                "recent_keys".into(),
                Some(CqlValue::Map(
                    keys.iter()
                        .map(|(s, v)| (CqlValue::Int(*s), CqlValue::Text(v.to_string())))
                        .collect(),
                )),
            ),
        ]
    }

    #[test]
    fn only_an_untouched_imported_row_is_the_imports() {
        let m = marker(7, true);
        assert_eq!(
            Found::of_columns(&cols(1, &[(0, &m)])),
            Found::Imported {
                source_ms: 7,
                liked: true,
                op_id: 1
            }
        );
        // A live request in slot 1, a flip since (op_id moved), a live row: the live path's.
        assert_eq!(
            Found::of_columns(&cols(1, &[(0, &m), (1, "like,0,1,9,u:k")])),
            Found::Live
        );
        assert_eq!(Found::of_columns(&cols(2, &[(0, &m)])), Found::Live);
        assert_eq!(
            Found::of_columns(&cols(1, &[(0, "like,1,1,9,u:k")])),
            Found::Live
        );
        assert_eq!(Found::of_columns(&Vec::new()), Found::Live);
    }
}
