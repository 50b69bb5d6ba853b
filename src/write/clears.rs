//! The outbox entries writes are done with, deleted behind their answers: gathered for
//! [`GATHER`] and sent in a few unlogged batches (docs/design.md, "The database cost of a
//! write"). A delete sent alone costs the database about as much as the entry's insert: most
//! of a small statement's cost is its request.
//!
//! A clear that is never sent (the process stopped, the queue full, the database failing)
//! leaves its entry to the relay, as a crash between the publish and the delete always did:
//! the relay publishes the edge's current state once more, a duplicate stage 1 drops by op_id,
//! then deletes the entry. So nothing here waits for the database on a write's behalf.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::outbox::Named;
use crate::store::Stores;

/// How long clears gather before their batches go out: short against the relay's
/// `api.relay_min_age`, so that a cleared entry is rarely published again.
pub const GATHER: Duration = Duration::from_millis(100);

/// Clears waiting at most; past it a clear is left to the relay (the database is behind).
const QUEUE: usize = 20_000;

enum Msg {
    Clear((i32, i64), Named),
    /// Answered once every clear queued before it was sent (or failed).
    Flush(oneshot::Sender<()>),
}

/// The handle writes queue their clears on; cheap to clone.
#[derive(Clone)]
pub struct Clears {
    tx: mpsc::Sender<Msg>,
}

impl Clears {
    /// Starts the task that sends the batches (needs a tokio runtime).
    pub fn spawn(store: Arc<Stores>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        metrics::counter!("likes_api_outbox_clears_left_total", "reason" => "queue_full")
            .increment(0);
        metrics::counter!("likes_api_outbox_clears_left_total", "reason" => "error").increment(0);
        tokio::spawn(run(store, rx));
        Self { tx }
    }

    /// Queues the delete of one entry of `partition` (shard, minute).
    pub fn clear(&self, partition: (i32, i64), item: &str, user: &str, entry: &str) {
        let named = Named {
            item: item.to_string(),
            user: user.to_string(),
            entry: entry.to_string(),
        };
        if self.tx.try_send(Msg::Clear(partition, named)).is_err() {
            metrics::counter!("likes_api_outbox_clears_left_total", "reason" => "queue_full")
                .increment(1);
        }
    }

    /// Waits until every clear queued so far was sent: before a process that wrote exits.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

async fn run(store: Arc<Stores>, mut rx: mpsc::Receiver<Msg>) {
    while let Some(first) = rx.recv().await {
        let mut flushes = Vec::new();
        let mut due: BTreeMap<(i32, i64), Vec<Named>> = BTreeMap::new();
        let mut take = |m: Msg, flushes: &mut Vec<oneshot::Sender<()>>| match m {
            Msg::Clear(p, n) => due.entry(p).or_default().push(n),
            Msg::Flush(tx) => flushes.push(tx),
        };
        let flush_now = matches!(first, Msg::Flush(_));
        take(first, &mut flushes);
        if !flush_now {
            tokio::time::sleep(GATHER).await;
        }
        while let Ok(m) = rx.try_recv() {
            take(m, &mut flushes);
        }
        if let Err(e) = store.outbox.delete_many(&due).await {
            let n: usize = due.values().map(Vec::len).sum();
            metrics::counter!("likes_api_outbox_clears_left_total", "reason" => "error")
                .increment(n as u64);
            tracing::warn!(entries = n, error = %e,
                "clearing outbox entries failed: the relay publishes them again and deletes them");
        }
        for tx in flushes {
            let _ = tx.send(());
        }
    }
}
