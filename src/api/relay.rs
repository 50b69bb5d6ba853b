//! `likes relay`: publishes the events a write could not (a crash or a broker error between
//! the edge flip and the produce), so no flip is ever lost.
//!
//! Every outbox entry older than `min_age` (so requests in flight finish first) names an edge;
//! the relay publishes that edge's current (op_id, state) and then deletes exactly the
//! entries it read. An entry written meanwhile stays for the next pass. Publishing an edge
//! whose event is already on the log is harmless: stage 1 drops it by op_id.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use scylla::value::CqlTimestamp;
use tracing::{info, warn};

use super::write::{publish, read_edge, OUTBOX_SHARDS};
use super::App;
use crate::dedupe::state::now_ms;
use crate::error::Result;
use crate::hash;
use crate::schema::v1::Source;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Events published (one per edge with pending entries and a flip to publish).
    pub published: u64,
    /// Outbox entries deleted.
    pub cleared: u64,
}

/// One pass over every outbox shard.
pub async fn pass(app: &App, min_age: Duration) -> Result<Pass> {
    let cutoff = now_ms() - min_age.as_millis() as i64;
    let mut done = Pass::default();
    for shard in 0..OUTBOX_SHARDS as i32 {
        let rows = app
            .session
            .execute_unpaged(&app.stmts.outbox_scan, (shard,))
            .await?
            .into_rows_result()?;
        // Edge → its entries old enough to act on.
        let mut due: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for row in rows.rows::<(String, String, String, Option<CqlTimestamp>)>()? {
            let (item, user, entry, at) = row?;
            if at.map(|t| t.0).unwrap_or(0) <= cutoff {
                due.entry((item, user)).or_default().push(entry);
            }
        }
        for ((item, user), entries) in due {
            let bucket = hash::bucket_of(&user, app.topology.buckets) as i32;
            if let Some(edge) = read_edge(&app.session, &app.stmts, &item, bucket, &user).await? {
                if edge.op_id > 0 {
                    publish(app, &item, &user, bucket, &edge, Source::Relay)
                        .await
                        .map_err(|e| crate::error::Error::State(format!("{e:?}")))?;
                    done.published += 1;
                    info!(%item, %user, op_id = edge.op_id, "relay published a pending event");
                }
            }
            for entry in entries {
                app.session
                    .execute_unpaged(&app.stmts.outbox_del, (shard, &item, &user, &entry))
                    .await?;
                done.cleared += 1;
            }
        }
    }
    Ok(done)
}

/// Runs passes every `every` until `stop`; a failed pass is logged and retried.
pub async fn run(app: Arc<App>, every: Duration, min_age: Duration, stop: Arc<AtomicBool>) {
    info!(?every, ?min_age, "relay running");
    while !stop.load(Ordering::Relaxed) {
        match pass(&app, min_age).await {
            Ok(p) if p.cleared > 0 => info!(?p, "relay pass"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "relay pass failed; retrying"),
        }
        tokio::time::sleep(every).await;
    }
}
