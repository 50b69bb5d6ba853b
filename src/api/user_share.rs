//! Each user's share of the pod's writes: a small token bucket per acting user, so one session
//! writing at full speed gets 429 while everyone else's writes go on (issue 44: one user
//! flooding with a valid token left another 3 of 70 writes answered).
//!
//! Memory is bounded: users are spread over shards, each holding at most `SHARD_USERS`
//! buckets; a full shard first forgets the buckets that have refilled (their users are idle:
//! a new bucket would be the same), then, if it is still over half full, half of them (so a
//! stream of new users costs one sweep per half a shard, not one per user). Forgetting a
//! bucket can only let its user write a burst again, never refuse anyone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

const SHARDS: usize = 16;
const SHARD_USERS: usize = 8192;

pub struct UserShare {
    per_s: f64,
    burst: f64,
    per_shard: usize,
    shards: Vec<Mutex<HashMap<String, (f64, Instant)>>>,
}

impl UserShare {
    /// `per_s` writes a second per user with bursts of `burst`; `per_s = 0` turns it off.
    pub fn new(per_s: f64, burst: f64) -> Self {
        Self::with_room(per_s, burst, SHARD_USERS)
    }

    fn with_room(per_s: f64, burst: f64, per_shard: usize) -> Self {
        Self {
            per_s,
            burst: burst.max(1.0),
            per_shard: per_shard.max(2),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    pub fn take(&self, user: &str) -> bool {
        self.take_at(user, Instant::now())
    }

    /// At a given instant: the unit test moves time itself.
    fn take_at(&self, user: &str, now: Instant) -> bool {
        if self.per_s <= 0.0 {
            return true;
        }
        let shard = crate::hash::partition_for(user.as_bytes(), SHARDS as u32) as usize;
        let mut users = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let refill = |(tokens, at): (f64, Instant)| {
            let now = now.max(at);
            (
                (tokens + now.duration_since(at).as_secs_f64() * self.per_s).min(self.burst),
                now,
            )
        };
        if !users.contains_key(user) && users.len() >= self.per_shard {
            users.retain(|_, b| refill(*b).0 < self.burst);
            if users.len() > self.per_shard / 2 {
                let gone: Vec<String> = users.keys().take(users.len() / 2).cloned().collect();
                for u in gone {
                    users.remove(&u);
                }
            }
        }
        let b = users.entry(user.to_string()).or_insert((self.burst, now));
        *b = refill(*b);
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            true
        } else {
            false
        }
    }

    #[cfg(test)]
    fn users(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_user_past_its_share_leaves_the_others_theirs() {
        let share = UserShare::new(10.0, 20.0);
        let t0 = Instant::now();
        let flood = (0..1000).filter(|_| share.take_at("mallory", t0)).count();
        assert_eq!(flood, 20, "a burst, then refused");
        assert!(share.take_at("alice", t0), "another user is untouched");
        let later = t0 + Duration::from_millis(500);
        let again = (0..1000)
            .filter(|_| share.take_at("mallory", later))
            .count();
        assert_eq!(again, 5, "500 ms at 10/s refills 5");
        let off = UserShare::new(0.0, 1.0);
        assert!((0..1000).all(|_| off.take_at("mallory", t0)));
    }

    #[test]
    fn memory_stays_bounded_however_many_users_write() {
        let share = UserShare::with_room(10.0, 20.0, 64);
        let t0 = Instant::now();
        for n in 0..(SHARDS * 64 * 10) {
            assert!(share.take_at(&format!("u{n}"), t0));
        }
        assert!(share.users() <= SHARDS * 64, "{}", share.users());
        // A user still writing keeps a bucket through the sweeps more often than not; one
        // forgotten gets a fresh burst, which never refuses anybody.
        assert!(share.take_at("u1", t0));
    }
}
