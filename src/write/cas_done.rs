//! The moment a write is done with the database and waits only on the broker.
//!
//! Past its compare-and-set, a flip waits up to `api.publish_wait` for its event's ack
//! (docs/architecture.md, the write path). That wait is the broker's, bounded by time, and
//! says nothing about how many writes Cassandra can take: the API's adaptive limit
//! (src/api/limit.rs) must neither count it as a write in flight nor learn its latency, or a
//! broker outage or a broker's slow return shrinks the limit and sheds writes the database
//! could serve (`bench overload`'s broker outage: 22 % shed in the 15 s after the broker came
//! back, 2026-12-02). The admission runs each write inside [`scope`]; the write path calls
//! [`reached`] once its flip has applied. What follows is not counted either: the outbox
//! entry's delete after an ack (one plain write, no Paxos round), so
//! `likes_api_admitted_write_seconds` is the database's part of a write, not what its client
//! sees (`likes_api_request_duration_seconds` is that).

use std::cell::RefCell;
use std::future::Future;

/// Called with whether the write's latency so far is the database's (false: a forward).
type Hook = Box<dyn FnOnce(bool) + Send>;

tokio::task_local! {
    static HOOK: RefCell<Option<Hook>>;
}

/// Runs `f` with `hook` to be called once, when the write reaches its wait on the broker (or
/// never, for a write that does not: a replay, a no-op, a failure).
pub async fn scope<F: Future>(hook: impl FnOnce(bool) + Send + 'static, f: F) -> F::Output {
    HOOK.scope(RefCell::new(Some(Box::new(hook))), f).await
}

/// The write is done with the database: calls the scope's hook, if any.
pub(super) fn reached() {
    let hook = HOOK.try_with(|h| h.borrow_mut().take()).ok().flatten();
    if let Some(hook) = hook {
        hook(true);
    }
}

/// The write goes to another region (api/forward.rs): it holds no place among this region's
/// writes from here, and its latency is the other region's, not this database's (issue 43,
/// hole 6c: a hung peer's forwards took every slot).
pub fn forwarding() {
    let hook = HOOK.try_with(|h| h.borrow_mut().take()).ok().flatten();
    if let Some(hook) = hook {
        hook(false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn the_hook_runs_once_inside_its_scope_and_never_outside() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        super::scope(
            move |_| {
                c.fetch_add(1, Ordering::Relaxed);
            },
            async {
                super::reached();
                super::reached();
            },
        )
        .await;
        super::reached();
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }
}
