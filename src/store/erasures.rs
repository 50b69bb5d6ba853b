//! `erasures`: account erasure requests, each the erase job's checkpoint while it works it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::TryStreamExt;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;

use super::prepare;
use crate::error::Result;

/// Where an erasure is: `pending` → `unliking` → `unliked` → `purged`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Erasure {
    pub id: String,
    /// None once purged: the record then no longer says whose account it was.
    pub user_id: Option<String>,
    pub state: String,
    pub requested_at_ms: i64,
    /// The last item whose edge the walk has finished (items in order).
    pub cursor: Option<String>,
    pub walked: i64,
    pub unliked: i64,
    pub updated_at_ms: Option<i64>,
    pub unliked_at_ms: Option<i64>,
    pub purged_at_ms: Option<i64>,
}

pub const PENDING: &str = "pending";
pub const UNLIKING: &str = "unliking";
pub const UNLIKED: &str = "unliked";
pub const PURGED: &str = "purged";

pub struct Erasures {
    session: Arc<Session>,
    ks: String,
    insert: PreparedStatement,
    get: PreparedStatement,
    checkpoint: PreparedStatement,
    unliked: PreparedStatement,
    purged: PreparedStatement,
    mark_erased: PreparedStatement,
    erased: PreparedStatement,
    erased_among: PreparedStatement,
    mark_recent: PreparedStatement,
    recent: PreparedStatement,
}

/// The key of a user in `erased_users`: SHA-256 of the id, hex. One-way, so the table that
/// must outlive the purge keeps no user id; the API recomputes it per write.
pub fn user_key(user: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(format!("likes-erased-user:{user}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const COLUMNS: &str =
    "id, user_id, state, requested_at, cursor, walked, unliked, updated_at, unliked_at, purged_at";

type Stored = (
    String,
    Option<String>,
    Option<String>,
    Option<CqlTimestamp>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<CqlTimestamp>,
    Option<CqlTimestamp>,
    Option<CqlTimestamp>,
);

fn of_row(r: Stored) -> Erasure {
    let ms = |t: Option<CqlTimestamp>| t.map(|t| t.0);
    Erasure {
        id: r.0,
        user_id: r.1,
        state: r.2.unwrap_or_else(|| PENDING.into()),
        requested_at_ms: ms(r.3).unwrap_or(0),
        cursor: r.4,
        walked: r.5.unwrap_or(0),
        unliked: r.6.unwrap_or(0),
        updated_at_ms: ms(r.7),
        unliked_at_ms: ms(r.8),
        purged_at_ms: ms(r.9),
    }
}

impl Erasures {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        Ok(Self {
            insert: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.erasures (id, user_id, state, requested_at, walked, unliked) \
                     VALUES (?, ?, 'pending', ?, 0, 0) IF NOT EXISTS"
                ),
            )
            .await?,
            get: prepare(
                &session,
                format!("SELECT {COLUMNS} FROM {ks}.erasures WHERE id = ?"),
            )
            .await?,
            checkpoint: prepare(
                &session,
                format!(
                    "UPDATE {ks}.erasures SET state = ?, cursor = ?, walked = ?, unliked = ?, \
                     updated_at = ? WHERE id = ?"
                ),
            )
            .await?,
            unliked: prepare(
                &session,
                format!(
                    "UPDATE {ks}.erasures SET state = 'unliked', unliked_at = ?, updated_at = ? \
                     WHERE id = ?"
                ),
            )
            .await?,
            purged: prepare(
                &session,
                format!(
                    "UPDATE {ks}.erasures SET state = 'purged', purged_at = ?, updated_at = ?, \
                     user_id = null, cursor = null WHERE id = ?"
                ),
            )
            .await?,
            mark_erased: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.erased_users (user_key, erasure_id, requested_at) \
                     VALUES (?, ?, ?)"
                ),
            )
            .await?,
            erased: prepare(
                &session,
                format!("SELECT erasure_id FROM {ks}.erased_users WHERE user_key = ?"),
            )
            .await?,
            erased_among: prepare(
                &session,
                format!("SELECT user_key, erasure_id FROM {ks}.erased_users WHERE user_key IN ?"),
            )
            .await?,
            mark_recent: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.erasures_by_minute (minute, user_key, erasure_id) \
                     VALUES (?, ?, ?)"
                ),
            )
            .await?,
            recent: prepare(
                &session,
                format!("SELECT user_key FROM {ks}.erasures_by_minute WHERE minute = ?"),
            )
            .await?,
            session,
            ks: ks.to_string(),
        })
    }

    /// Every erased account's fingerprint (a full read of `erased_users`, paged: one row per
    /// deleted account), for an API pod's set at its start.
    pub async fn all_keys(&self) -> Result<Vec<String>> {
        let mut rows = self
            .session
            .query_iter(format!("SELECT user_key FROM {}.erased_users", self.ks), ())
            .await?
            .rows_stream::<(String,)>()?;
        let mut out = Vec::new();
        while let Some((key,)) = rows.try_next().await? {
            out.push(key);
        }
        Ok(out)
    }

    /// The fingerprints of the erasures requested in `minute` (Unix ms / 60,000).
    pub async fn keys_in_minute(&self, minute: i64) -> Result<Vec<String>> {
        let rows = self
            .session
            .execute_unpaged(&self.recent, (minute,))
            .await?
            .into_rows_result()?;
        Ok(rows
            .rows::<(String,)>()?
            .collect::<std::result::Result<Vec<_>, _>>()?
            .into_iter()
            .map(|r| r.0)
            .collect())
    }

    /// The erasure of `user`'s account, if one was requested (pending, under way or done):
    /// the API refuses the user's writes from then on.
    pub async fn erased(&self, user: &str) -> Result<Option<String>> {
        Ok(self
            .session
            .execute_unpaged(&self.erased, (user_key(user),))
            .await?
            .into_rows_result()?
            .maybe_first_row::<(Option<String>,)>()?
            .map(|r| r.0.unwrap_or_default()))
    }

    /// Which of `users` were erased (user → erasure id), in one request: the write path's
    /// check gathered across concurrent writes (write/erased_check.rs).
    pub async fn erased_among(&self, users: &[String]) -> Result<HashMap<String, String>> {
        let by_key: HashMap<String, &String> = users.iter().map(|u| (user_key(u), u)).collect();
        let keys: Vec<&String> = by_key.keys().collect();
        let rows = self
            .session
            .execute_unpaged(&self.erased_among, (keys,))
            .await?
            .into_rows_result()?;
        let mut out = HashMap::new();
        for row in rows.rows::<(String, Option<String>)>()? {
            let (key, id) = row?;
            if let Some(user) = by_key.get(&key) {
                out.insert((*user).clone(), id.unwrap_or_default());
            }
        }
        Ok(out)
    }

    /// Every erasure (a small table: one row per deleted account).
    pub async fn all(&self) -> Result<Vec<Erasure>> {
        let mut rows = self
            .session
            .query_iter(format!("SELECT {COLUMNS} FROM {}.erasures", self.ks), ())
            .await?
            .rows_stream::<Stored>()?;
        let mut out = Vec::new();
        while let Some(r) = rows.try_next().await? {
            out.push(of_row(r));
        }
        out.sort_by_key(|e| e.requested_at_ms);
        Ok(out)
    }

    pub async fn get(&self, id: &str) -> Result<Option<Erasure>> {
        Ok(self
            .session
            .execute_unpaged(&self.get, (id,))
            .await?
            .into_rows_result()?
            .maybe_first_row::<Stored>()?
            .map(of_row))
    }

    /// The user's erasure not yet purged, or a new one: asking twice erases once.
    pub async fn request(&self, user: &str, now_ms: i64) -> Result<Erasure> {
        if let Some(e) = self
            .all()
            .await?
            .into_iter()
            .find(|e| e.user_id.as_deref() == Some(user) && e.state != PURGED)
        {
            return Ok(e);
        }
        let id = format!("er-{:016x}", rand::random::<u64>());
        // The account stops writing first: no like of it can start after the erasure is on
        // record (a retry of this request writes another fingerprint row with a new id:
        // harmless, it still refuses the user).
        self.session
            .execute_unpaged(
                &self.mark_erased,
                (user_key(user), &id, CqlTimestamp(now_ms)),
            )
            .await?;
        // And by minute, for the API pods' sets (write/erased_set.rs): a pod refuses the
        // user within one refresh of this write.
        self.session
            .execute_unpaged(&self.mark_recent, (now_ms / 60_000, user_key(user), &id))
            .await?;
        self.session
            .execute_unpaged(&self.insert, (&id, user, CqlTimestamp(now_ms)))
            .await?;
        Ok(self.get(&id).await?.expect("the erasure was just written"))
    }

    pub async fn checkpoint(&self, e: &Erasure, now_ms: i64) -> Result<()> {
        self.session
            .execute_unpaged(
                &self.checkpoint,
                (
                    &e.state,
                    &e.cursor,
                    e.walked,
                    e.unliked,
                    CqlTimestamp(now_ms),
                    &e.id,
                ),
            )
            .await?;
        Ok(())
    }

    pub async fn mark_unliked(&self, id: &str, now_ms: i64) -> Result<()> {
        self.session
            .execute_unpaged(
                &self.unliked,
                (CqlTimestamp(now_ms), CqlTimestamp(now_ms), id),
            )
            .await?;
        Ok(())
    }

    pub async fn mark_purged(&self, id: &str, now_ms: i64) -> Result<()> {
        self.session
            .execute_unpaged(
                &self.purged,
                (CqlTimestamp(now_ms), CqlTimestamp(now_ms), id),
            )
            .await?;
        Ok(())
    }
}
