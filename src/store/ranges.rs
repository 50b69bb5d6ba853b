//! The range table (`ranges`): each item range's home region and epoch, and a move under way
//! (docs/multi-region.md). Written rarely and only by compare-and-set at the session's SERIAL,
//! committed in every datacenter (EACH_QUORUM with NetworkTopologyStrategy), so a writer's
//! local read in any region sees a move once it has committed.

use std::sync::Arc;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use scylla::value::CqlTimestamp;

use super::{not_applied, prepare};
use crate::config::ReplicationClass;
use crate::error::Result;

/// One range's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRow {
    pub range: i32,
    pub home: String,
    /// Bumped by every move, at its start.
    pub epoch: i64,
    /// Set while a move is under way: the region that held the range before this epoch. The
    /// new home (`home`) does not write until the move clears it; the old one no longer may.
    pub moving_from: Option<String>,
    /// When the move under way, or the last one, started (ms).
    pub moved_at: Option<i64>,
    /// When the last move settled (ms): the home's flips are stamped no earlier, and stage 1
    /// leaves flips before it to the previous home (docs/multi-region.md, "Stage-1 state
    /// after a move"). None for a range that never moved.
    pub home_since: Option<i64>,
    /// Settled, and its move's recount not done yet: a rerun of the move (`--from` too)
    /// recounts it.
    pub recount_due: bool,
}

pub struct Ranges {
    session: Arc<Session>,
    all: PreparedStatement,
    one: PreparedStatement,
    create: PreparedStatement,
    bump: PreparedStatement,
    reassert: PreparedStatement,
    settle: PreparedStatement,
    recounted: PreparedStatement,
}

impl Ranges {
    pub async fn prepare(
        session: Arc<Session>,
        ks: &str,
        replication: ReplicationClass,
    ) -> Result<Self> {
        // The commit of a range's compare-and-set reaches a quorum in every datacenter, so a
        // writer's LOCAL_QUORUM read anywhere sees a committed move. EACH_QUORUM is only
        // accepted with NetworkTopologyStrategy; one datacenter needs no more than QUORUM.
        let commit = match replication {
            ReplicationClass::NetworkTopologyStrategy => Consistency::EachQuorum,
            ReplicationClass::SimpleStrategy => Consistency::Quorum,
        };
        let cas = |mut st: PreparedStatement| {
            st.set_consistency(commit);
            st
        };
        let mut all = prepare(
            &session,
            format!(
                "SELECT range, home, epoch, moving_from, moved_at, home_since, recount_due FROM {ks}.ranges"
            ),
        )
        .await?;
        all.set_consistency(Consistency::LocalQuorum);
        let mut one = prepare(
            &session,
            format!(
                "SELECT range, home, epoch, moving_from, moved_at, home_since, recount_due FROM {ks}.ranges WHERE range = ?"
            ),
        )
        .await?;
        one.set_consistency(Consistency::Serial);
        let create = cas(prepare(
            &session,
            format!("INSERT INTO {ks}.ranges (range, home, epoch) VALUES (?, ?, 1) IF NOT EXISTS"),
        )
        .await?);
        let bump = cas(prepare(
            &session,
            format!(
                "UPDATE {ks}.ranges SET home = ?, epoch = ?, moving_from = ?, moved_at = ? \
                 WHERE range = ? IF home = ? AND epoch = ?"
            ),
        )
        .await?);
        let reassert = cas(prepare(
            &session,
            format!(
                "UPDATE {ks}.ranges SET moving_from = ? WHERE range = ? IF home = ? AND epoch = ?"
            ),
        )
        .await?);
        let settle = cas(prepare(
            &session,
            format!("UPDATE {ks}.ranges SET moving_from = null, home_since = ?, recount_due = true WHERE range = ? IF home = ? AND epoch = ?"),
        )
        .await?);
        let recounted = cas(prepare(
            &session,
            format!("UPDATE {ks}.ranges SET recount_due = null WHERE range = ? IF home = ? AND epoch = ?"),
        )
        .await?);
        Ok(Self {
            session,
            recounted,
            all,
            one,
            create,
            bump,
            reassert,
            settle,
        })
    }

    /// Every range, read locally (what writers cache).
    pub async fn all(&self) -> Result<Vec<RangeRow>> {
        let rows = self
            .session
            .execute_unpaged(&self.all, ())
            .await?
            .into_rows_result()?;
        let mut out = Vec::new();
        for row in rows.rows::<Row>()? {
            out.push(of(row?));
        }
        out.sort_by_key(|r| r.range);
        Ok(out)
    }

    /// One range, read at SERIAL (what a move decides on).
    pub async fn one(&self, range: i32) -> Result<Option<RangeRow>> {
        let rows = self
            .session
            .execute_unpaged(&self.one, (range,))
            .await?
            .into_rows_result()?;
        Ok(rows.maybe_first_row::<Row>()?.map(of))
    }

    /// Gives the range to `home` at epoch 1 unless it has a home already. Returns whether it
    /// was created.
    pub async fn create(&self, range: i32, home: &str) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.create, (range, home))
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// A move's start: the range goes to `to` at `epoch + 1`, marked moving from `from`, if it
    /// still is `from`'s at `epoch`. Returns whether it applied.
    pub async fn bump(
        &self,
        range: i32,
        from: &str,
        to: &str,
        epoch: i64,
        now_ms: i64,
    ) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(
                &self.bump,
                (
                    to,
                    epoch + 1,
                    from,
                    CqlTimestamp(now_ms),
                    range,
                    from,
                    epoch,
                ),
            )
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// A resumed move's bump, written again with the commit in every datacenter: the serial
    /// read that found it may have finished it at a plain quorum. Returns whether it applied.
    pub async fn reassert(&self, range: i32, home: &str, epoch: i64, from: &str) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.reassert, (from, range, home, epoch))
            .await?;
        Ok(not_applied(r)?.is_none())
    }

    /// A move's end: `home` may write the range at `epoch`, from `now_ms` on. Returns
    /// whether it applied.
    pub async fn settle(&self, range: i32, home: &str, epoch: i64, now_ms: i64) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.settle, (CqlTimestamp(now_ms), range, home, epoch))
            .await?;
        Ok(not_applied(r)?.is_none())
    }
}

impl Ranges {
    /// A settled range's recount is done (if it still is `home`'s at `epoch`).
    pub async fn recounted(&self, range: i32, home: &str, epoch: i64) -> Result<bool> {
        let r = self
            .session
            .execute_unpaged(&self.recounted, (range, home, epoch))
            .await?;
        Ok(not_applied(r)?.is_none())
    }
}

type Row = (
    i32,
    String,
    i64,
    Option<String>,
    Option<CqlTimestamp>,
    Option<CqlTimestamp>,
    Option<bool>,
);

fn of((range, home, epoch, moving_from, moved_at, home_since, recount_due): Row) -> RangeRow {
    RangeRow {
        range,
        home,
        epoch,
        moving_from,
        moved_at: moved_at.map(|t| t.0),
        home_since: home_since.map(|t| t.0),
        recount_due: recount_due.unwrap_or(false),
    }
}
