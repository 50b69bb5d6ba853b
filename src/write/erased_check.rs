//! The check that a writing account was not erased, gathered across concurrent writes: while
//! a check is with the database, the checks that arrive queue, and the next request asks for
//! all of them at once (`user_key IN ?`). A lone write waits for nothing extra; under load
//! one request answers many writes (docs/design.md, "The database cost of a write": the
//! database's cost is per request as much as per row). With the pod's set of erased
//! accounts (`api.erased_refresh`, erased_set.rs), only a write by an account in the set, or
//! any write while the set is not current, asks.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::{Error, Result};
use crate::store::Stores;

/// Users per request at most.
const MAX_USERS: usize = 64;

/// Requests with the database at once. The checks that arrive while all are out gather into
/// the next. More than one: with one, a single slow read (a replica's pause, a read behind a
/// flush) held every write of the pod behind it, the write path's tail (issue 45); each
/// check is a read of its own, whichever request carries it, so how many run at once
/// changes nothing of what a check sees (the erasure walk's guarantee: docs/exactness.md).
pub const IN_FLIGHT: usize = 4;

type Answer = oneshot::Sender<std::result::Result<Option<String>, String>>;

/// The handle writes ask through; cheap to clone.
#[derive(Clone)]
pub struct ErasedCheck {
    tx: mpsc::UnboundedSender<(String, Answer)>,
    set: Option<Arc<super::erased_set::ErasedSet>>,
}

impl ErasedCheck {
    /// Starts the task that asks the database (needs a tokio runtime) and, with `set`, the
    /// pod's set of erased accounts that spares the asking.
    pub fn spawn(store: Arc<Stores>, set: Option<Arc<super::erased_set::ErasedSet>>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, rx));
        Self { tx, set }
    }

    /// True when the pod's set says `user` was not erased, and is current: no need to ask.
    pub fn known_clear(&self, user: &str) -> bool {
        self.set.as_ref().is_some_and(|s| s.known_clear(user))
    }

    /// An erasure this pod recorded: its set refuses the account from now on.
    pub fn note(&self, user: &str) {
        if let Some(set) = &self.set {
            set.note(user);
        }
    }

    /// The erasure that took `user`'s account, if one did.
    pub async fn erased(&self, user: &str) -> Result<Option<String>> {
        let (tx, rx) = oneshot::channel();
        let gone = || Error::CqlTransient("the erased-account check stopped".into());
        self.tx.send((user.to_string(), tx)).map_err(|_| gone())?;
        match rx.await.map_err(|_| gone())? {
            Ok(found) => Ok(found),
            Err(e) => Err(Error::CqlTransient(format!(
                "checking erased accounts: {e}"
            ))),
        }
    }
}

async fn run(store: Arc<Stores>, mut rx: mpsc::UnboundedReceiver<(String, Answer)>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Waiting for a slot is when the next checks gather.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut asks = vec![first];
        while asks.len() < MAX_USERS {
            match rx.try_recv() {
                Ok(a) => asks.push(a),
                Err(_) => break,
            }
        }
        let store = store.clone();
        tokio::spawn(async move {
            // A test holds one request here, as a slow replica would (tests/api_overload.rs).
            crate::runtime::hold::point("api-erased-check").await;
            let users: Vec<String> = asks.iter().map(|(u, _)| u.clone()).collect();
            let found = store.erasures.erased_among(&users).await;
            for (user, answer) in asks {
                let _ = answer.send(match &found {
                    Ok(map) => Ok(map.get(&user).cloned()),
                    Err(e) => Err(e.to_string()),
                });
            }
            drop(slot);
        });
    }
}
