//! `retractions`: the record of an operator's retraction (who, what, why, under which key).

use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;

use super::prepare;
use crate::error::Result;

pub struct Retractions {
    session: Arc<Session>,
    put: PreparedStatement,
    delete: PreparedStatement,
}

impl Retractions {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        Ok(Self {
            put: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.retractions (item_id, user_id, retracted_at, reason, request_key) \
                     VALUES (?, ?, ?, ?, ?)"
                ),
            )
            .await?,
            delete: prepare(
                &session,
                format!("DELETE FROM {ks}.retractions WHERE item_id = ? AND user_id = ?"),
            )
            .await?,
            session,
        })
    }

    /// Records an operator's retraction of (item, user); a retry writes the same row.
    pub async fn record(
        &self,
        item: &str,
        user: &str,
        reason: &str,
        key: &str,
        at_ms: i64,
    ) -> Result<()> {
        self.session
            .execute_unpaged(&self.put, (item, user, CqlTimestamp(at_ms), reason, key))
            .await?;
        Ok(())
    }

    /// Forgets the retractions of (item, user): the erase job's purge.
    pub async fn delete(&self, item: &str, user: &str) -> Result<()> {
        self.session
            .execute_unpaged(&self.delete, (item, user))
            .await?;
        Ok(())
    }
}
