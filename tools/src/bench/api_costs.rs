//! Where Cassandra's CPU per API write goes (issue 26, item 4): each statement of the write
//! path alone, open loop at the same rate, with Cassandra's CPU per statement read from /proc
//! less what it burns idle (compaction, gossip, GC) over the same time.
//!
//! The write path's statements, docs/design.md ("The write path and its cost"): the edge's
//! one Paxos round, the check that the account is not erased, the user's side of a like
//! (`edges_by_user`) with the outbox entry, and the entry's delete once the event is on the
//! log. The batched forms are the ones the write path sends since issue 26: the user's side
//! and the entry in one unlogged batch, the deletes gathered into a few batches.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use serde::Serialize;

use super::harness::open_loop;
use super::scrape::cpu_seconds;

/// Deletes per batch in the grouped-delete loop.
const DELETES_PER_BATCH: usize = 8;

/// One statement's cost: Cassandra CPU ms per statement, idle CPU taken off.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    pub name: &'static str,
    pub cpu_ms: f64,
    pub p99_ms: f64,
}

/// The statements, prepared against the bench's keyspace.
pub struct Costs {
    session: Arc<Session>,
    lwt: PreparedStatement,
    erased: PreparedStatement,
    by_user: PreparedStatement,
    outbox_put: PreparedStatement,
    outbox_del: PreparedStatement,
}

impl Costs {
    pub async fn prepare(session: Arc<Session>, ks: &str) -> Result<Self> {
        let p = |cql: String| {
            let session = session.clone();
            async move {
                session
                    .prepare(cql.clone())
                    .await
                    .map_err(|e| anyhow!("prepare {cql}: {e}"))
            }
        };
        Ok(Self {
            lwt: p(format!(
                "INSERT INTO {ks}.edges (item_id, bucket, user_id, state, op_id, updated_at, epoch) \
                 VALUES (?, 0, ?, 1, 1, toTimestamp(now()), 0) IF NOT EXISTS"
            ))
            .await?,
            erased: p(format!(
                "SELECT erasure_id FROM {ks}.erased_users WHERE user_key = ?"
            ))
            .await?,
            by_user: p(format!(
                "INSERT INTO {ks}.edges_by_user (user_id, item_id, created_at) VALUES (?, ?, ?)"
            ))
            .await?,
            outbox_put: p(format!(
                "INSERT INTO {ks}.outbox (shard, minute, item_id, user_id, entry, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?)"
            ))
            .await?,
            outbox_del: p(format!(
                "DELETE FROM {ks}.outbox \
                 WHERE shard = ? AND minute = ? AND item_id = ? AND user_id = ? AND entry = ?"
            ))
            .await?,
            session,
        })
    }

    /// Every statement at `rate` for `seconds`, after the idle CPU over `seconds`.
    pub async fn measure(self: &Arc<Self>, tag: &str, rate: f64, seconds: u64) -> Vec<Cost> {
        let idle_ms_per_s = idle_cpu_ms_per_s(seconds).await;
        let mut out = Vec::new();
        for (name, kind, per_op) in KINDS {
            let me = self.clone();
            let tag = format!("{tag}-{kind:?}");
            let ops = rate / per_op as f64;
            let l = open_loop(ops, seconds, move |i| me.clone().run(kind, tag.clone(), i)).await;
            // CPU per op, less the idle share of each op's time, per statement.
            let net =
                (l.cassandra_cpu_ms - idle_ms_per_s / l.achieved_per_s.max(1.0)) / per_op as f64;
            eprintln!(
                "bench api: cost of {name}: {net:.2} ms Cassandra CPU each (idle {idle_ms_per_s:.0} ms/s taken off), p99 {:.1} ms",
                l.p99_ms
            );
            out.push(Cost {
                name,
                cpu_ms: net,
                p99_ms: l.p99_ms,
            });
        }
        out
    }

    async fn run(self: Arc<Self>, kind: Kind, tag: String, i: u64) -> bool {
        let s = &self.session;
        let (item, user) = (format!("cost-{}", i % 10_000), format!("c{tag}-{i}"));
        let shard = (i % 16) as i32;
        let now = CqlTimestamp(likes::runtime::clock::now_ms());
        let entry = format!("{i:016x}");
        let r = match kind {
            Kind::Lwt => s
                .execute_unpaged(&self.lwt, (&item, &user))
                .await
                .map(|_| ()),
            Kind::Erased => s
                .execute_unpaged(&self.erased, (likes::store::erasures::user_key(&user),))
                .await
                .map(|_| ()),
            Kind::ByUser => s
                .execute_unpaged(&self.by_user, (&user, &item, now))
                .await
                .map(|_| ()),
            Kind::OutboxPut => s
                .execute_unpaged(&self.outbox_put, (shard, 1i64, &item, &user, &entry, now))
                .await
                .map(|_| ()),
            Kind::OutboxDel => s
                .execute_unpaged(&self.outbox_del, (shard, 1i64, &item, &user, &entry))
                .await
                .map(|_| ()),
            Kind::ByUserAndOutbox => {
                let mut b = Batch::new(BatchType::Unlogged);
                b.append_statement(self.by_user.clone());
                b.append_statement(self.outbox_put.clone());
                s.batch(
                    &b,
                    (
                        (&user, &item, now),
                        (shard, 1i64, &item, &user, &entry, now),
                    ),
                )
                .await
                .map(|_| ())
            }
            Kind::GroupedDeletes => {
                let mut b = Batch::new(BatchType::Unlogged);
                let mut values = Vec::with_capacity(DELETES_PER_BATCH);
                for k in 0..DELETES_PER_BATCH {
                    b.append_statement(self.outbox_del.clone());
                    values.push((
                        shard,
                        1i64,
                        item.clone(),
                        format!("{user}-{k}"),
                        entry.clone(),
                    ));
                }
                s.batch(&b, values).await.map(|_| ())
            }
        };
        r.is_ok()
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Lwt,
    Erased,
    ByUser,
    OutboxPut,
    OutboxDel,
    ByUserAndOutbox,
    GroupedDeletes,
}

/// The loops: name in the report, kind, statements per operation.
const KINDS: [(&str, Kind, usize); 7] = [
    ("the edge's LWT (INSERT … IF NOT EXISTS)", Kind::Lwt, 1),
    ("erased_users read", Kind::Erased, 1),
    ("edges_by_user insert", Kind::ByUser, 1),
    ("outbox insert", Kind::OutboxPut, 1),
    ("outbox delete", Kind::OutboxDel, 1),
    (
        "edges_by_user + outbox insert, one unlogged batch",
        Kind::ByUserAndOutbox,
        1,
    ),
    (
        "outbox delete, 8 of one partition per batch (as the API clears them)",
        Kind::GroupedDeletes,
        DELETES_PER_BATCH,
    ),
];

/// Cassandra's CPU ms per second while nothing is sent (NaN without its pid).
async fn idle_cpu_ms_per_s(seconds: u64) -> f64 {
    let Some(pid) = super::harness::cassandra_pid() else {
        return f64::NAN;
    };
    let before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    (cpu_seconds(pid) - before) * 1000.0 / seconds as f64
}
