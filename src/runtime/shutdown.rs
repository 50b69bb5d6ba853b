//! How a process stops: one cancellation token, cancelled on SIGINT or SIGTERM, that every
//! task checks (stage 1's blocking loop between batches included), and named tasks that are
//! joined before the process exits, so none is cut off mid-batch.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::JoinSet;
pub use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{Error, Result};

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

/// A token cancelled on SIGINT or SIGTERM: the root of the process's tree.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        signal().await;
        t.cancel();
    });
    token
}

/// Named tasks under one token. The first to end, with an error or not, cancels the others;
/// [`Tasks::join`] then waits for all of them and names the one that failed.
pub struct Tasks {
    token: CancellationToken,
    set: JoinSet<Result<()>>,
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Tasks {
    pub fn new(token: CancellationToken) -> Self {
        Self {
            token,
            set: JoinSet::new(),
            names: HashMap::new(),
        }
    }

    /// The token the tasks stop on.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = Result<()>> + Send + 'static,
    ) {
        let id = self.set.spawn(task).id();
        self.names.insert(id, name);
    }

    /// A task on a thread of its own (it blocks: stage 1's transactional calls).
    pub fn spawn_blocking(
        &mut self,
        name: &'static str,
        task: impl FnOnce() -> Result<()> + Send + 'static,
    ) {
        let id = self.set.spawn_blocking(task).id();
        self.names.insert(id, name);
    }

    /// Waits for every task. Returns the first error, named after its task.
    pub async fn join(mut self) -> Result<()> {
        let mut first: Option<Error> = None;
        while let Some(joined) = self.set.join_next_with_id().await {
            self.token.cancel();
            let (id, result) = match joined {
                Ok((id, r)) => (id, r),
                Err(e) => (
                    e.id(),
                    Err(Error::State(format!("it panicked or was aborted: {e}"))),
                ),
            };
            let name = self.names.get(&id).copied().unwrap_or("a task");
            match result {
                Ok(()) => info!(task = name, "stopped"),
                Err(e) => {
                    warn!(task = name, error = %e, "ended with an error; stopping the others");
                    first.get_or_insert(Error::Stage {
                        stage: name,
                        source: Box::new(e),
                    });
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}
