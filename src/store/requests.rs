//! What requests leave behind: `idempotency` (a request key's claim and its stored answer)
//! and `retractions` (the record of an operator's retraction).

use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::SerialConsistency;
use scylla::value::CqlTimestamp;

use super::{not_applied, prepare, Columns};
use crate::error::Result;

pub struct Requests {
    session: Arc<Session>,
    claim: PreparedStatement,
    answer: PreparedStatement,
    release: PreparedStatement,
    retraction_put: PreparedStatement,
}

impl Requests {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let mut claim = prepare(
            &session,
            format!(
                "INSERT INTO {ks}.idempotency (user_id, key, fingerprint, status, created_at) \
                 VALUES (?, ?, ?, 0, ?) IF NOT EXISTS"
            ),
        )
        .await?;
        let mut release = prepare(
            &session,
            format!(
                "DELETE FROM {ks}.idempotency WHERE user_id = ? AND key = ? IF response = null"
            ),
        )
        .await?;
        for st in [&mut claim, &mut release] {
            st.set_serial_consistency(Some(SerialConsistency::Serial));
        }
        Ok(Self {
            claim,
            // A plain write, not a third Paxos round: only the request that holds the claim
            // writes `response`, and no conditional write sets that cell, so the claim's
            // Paxos timestamp can never shadow it. A claim counts as answered once
            // `response` is set (`status` stays the claim's 0).
            answer: prepare(
                &session,
                format!("UPDATE {ks}.idempotency SET response = ? WHERE user_id = ? AND key = ?"),
            )
            .await?,
            release,
            retraction_put: prepare(
                &session,
                format!(
                    "INSERT INTO {ks}.retractions (item_id, user_id, retracted_at, reason, request_key) \
                     VALUES (?, ?, ?, ?, ?)"
                ),
            )
            .await?,
            session,
        })
    }

    /// Claims `key` for this request. None when the claim is ours; otherwise the existing
    /// claim's row (fingerprint, response, created_at).
    pub async fn claim(
        &self,
        user: &str,
        key: &str,
        fingerprint: &[u8],
        now_ms: i64,
    ) -> Result<Option<Columns>> {
        let claimed = self
            .session
            .execute_unpaged(&self.claim, (user, key, fingerprint, CqlTimestamp(now_ms)))
            .await?;
        not_applied(claimed)
    }

    /// Stores the answer a retry of `key` replays.
    pub async fn answer(&self, user: &str, key: &str, body: &str) -> Result<()> {
        self.session
            .execute_unpaged(&self.answer, (body, user, key))
            .await?;
        Ok(())
    }

    /// Gives up an unanswered claim, so a retry runs at once.
    pub async fn release(&self, user: &str, key: &str) -> Result<()> {
        self.session
            .execute_unpaged(&self.release, (user, key))
            .await?;
        Ok(())
    }

    /// Records an operator's retraction of (item, user).
    pub async fn record_retraction(
        &self,
        item: &str,
        user: &str,
        reason: &str,
        key: &str,
        at_ms: i64,
    ) -> Result<()> {
        self.session
            .execute_unpaged(
                &self.retraction_put,
                (item, user, CqlTimestamp(at_ms), reason, key),
            )
            .await?;
        Ok(())
    }
}
