//! Each API pod's set of erased accounts, so that a write by an account nobody erased (all but
//! a handful) asks the database nothing (issue 57, item 3: the erased-account read was one of
//! three sequential waits on every write's path). Loaded whole from `erased_users` at start
//! (before the pod serves), then kept current from `erasures_by_minute` every
//! `api.erased_refresh`, each refresh reading the minutes since the last good one began, widened
//! by the clock bound on both sides (an erasure is stamped by another pod's clock).
//!
//! What it promises, and what covers the rest (docs/exactness.md, "Erasure"): an erasure whose
//! record was written before a refresh's read began is in the set once that refresh ends. A
//! write by the account that starts between the erasure and that refresh is let through, as a
//! write that had passed the database check a moment before the erasure would have been; the
//! erasure's walk, which starts after it, takes its like back, and the purge's own walk takes
//! back any that landed after the walk. The set holds 64-bit prefixes of the fingerprints:
//! a hit is confirmed by the database read (which names the erasure for the 403), so a
//! collision costs one read, never a refusal. A set that has not refreshed for five intervals
//! (the database away) is not trusted: every write asks the database, as before.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::runtime::clock::now_ms;
use crate::store::erasures::user_key;
use crate::store::Stores;

/// Refreshes missed before the set is not trusted.
const STALE_AFTER_REFRESHES: u32 = 5;
/// A gap longer than this (a pod cut off from the database half a day) reloads the whole
/// table: `erasures_by_minute` keeps a day.
const RELOAD_AFTER_MS: i64 = 12 * 3600 * 1000;

pub struct ErasedSet {
    keys: RwLock<HashSet<u64>>,
    /// When the read of the last good refresh (or the load) began: monotonic for the trust
    /// bound, wall clock (ms) for the minutes the next refresh reads from.
    fresh: Mutex<(Instant, i64)>,
    refresh: Duration,
    skew_ms: i64,
}

/// The set's form of an account: the first 64 bits of its `erased_users` fingerprint.
fn prefix_of_key(key: &str) -> Option<u64> {
    key.get(..16).and_then(|h| u64::from_str_radix(h, 16).ok())
}

impl ErasedSet {
    /// Loads every erased account, then refreshes every `refresh` in a task of its own.
    pub async fn start(store: Arc<Stores>, refresh: Duration, skew: Duration) -> Result<Arc<Self>> {
        let (began, began_ms) = (Instant::now(), now_ms());
        let keys: HashSet<u64> = store
            .erasures
            .all_keys()
            .await?
            .iter()
            .filter_map(|k| prefix_of_key(k))
            .collect();
        metrics::gauge!(crate::runtime::metrics::API_ERASED_SET).set(keys.len() as f64);
        let set = Arc::new(Self {
            keys: RwLock::new(keys),
            fresh: Mutex::new((began, began_ms)),
            refresh,
            skew_ms: skew.as_millis() as i64,
        });
        tokio::spawn(refresh_forever(set.clone(), store));
        Ok(set)
    }

    /// True when `user` is known not erased: the set is current and does not hold it. False
    /// sends the write to the database's check.
    pub fn known_clear(&self, user: &str) -> bool {
        let trusted = self.fresh.lock().unwrap().0.elapsed() < self.refresh * STALE_AFTER_REFRESHES;
        trusted
            && prefix_of_key(&user_key(user))
                .is_some_and(|p| !self.keys.read().unwrap().contains(&p))
    }

    /// An erasure this pod recorded itself: refused here at once, not a refresh later.
    pub fn note(&self, user: &str) {
        if let Some(p) = prefix_of_key(&user_key(user)) {
            self.keys.write().unwrap().insert(p);
        }
    }

    /// One refresh: the minutes from the last good one's start (less the clock bound) to
    /// now (plus it).
    async fn refresh_once(&self, store: &Stores) -> Result<()> {
        let (began, began_ms) = (Instant::now(), now_ms());
        let since_ms = self.fresh.lock().unwrap().1;
        let mut found = Vec::new();
        if began_ms - since_ms > RELOAD_AFTER_MS {
            found = store.erasures.all_keys().await?;
        } else {
            let (from, to) = (
                (since_ms - self.skew_ms) / 60_000,
                (began_ms + self.skew_ms) / 60_000,
            );
            for minute in from..=to {
                found.extend(store.erasures.keys_in_minute(minute).await?);
            }
        }
        let mut keys = self.keys.write().unwrap();
        keys.extend(found.iter().filter_map(|k| prefix_of_key(k)));
        metrics::gauge!(crate::runtime::metrics::API_ERASED_SET).set(keys.len() as f64);
        drop(keys);
        *self.fresh.lock().unwrap() = (began, began_ms);
        Ok(())
    }
}

async fn refresh_forever(set: Arc<ErasedSet>, store: Arc<Stores>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(set.refresh).await;
        // A test holds the refresh here: the gap a write by a just-erased account falls in.
        crate::runtime::hold::point("api-erased-refresh").await;
        match set.refresh_once(&store).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("erased-account set: refreshing again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "erased-account set: refresh failed; writes ask the database once it is five intervals old");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fingerprint_prefix_is_its_first_64_bits() {
        let key = super::user_key("alice");
        let p = super::prefix_of_key(&key).unwrap();
        assert_eq!(format!("{p:016x}"), key[..16]);
        assert_eq!(super::prefix_of_key("xyz"), None);
    }
}
