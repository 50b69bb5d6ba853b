//! How a process learns it should stop: SIGINT or SIGTERM, once, for every task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::info;

/// Resolves on SIGINT or SIGTERM.
pub async fn signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    info!("signal received: finishing what is in flight");
}

/// A flag set on SIGINT or SIGTERM, for loops (and stage 1's blocking thread) that check it
/// between batches.
pub fn flag_on_signal() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        signal().await;
        flag.store(true, Ordering::Relaxed);
    });
    stop
}
