//! Request keys as the edge row remembers them (DESIGN.md, "One Paxos round per write"):
//! `recent_keys map<text, text>`, stored key → the request's operation and its answer, for the
//! last [`KEPT`] requests on the edge younger than [`KEPT_FOR_MS`].
//!
//! Keys are namespaced by who sent them, so no key a user can send ever equals one an operator
//! uses: a user's `K` is stored as `u:K`, a retraction's as `r:K`, an erasure's as `e:K`.
//! The stored value is `<like|unlike>,<changed 0|1>,<op_id>,<at_ms>`: everything the answer
//! holds besides the edge's own item and user, and the time it was written, to age it out.

use std::collections::BTreeMap;

use crate::schema::v1::Source;

/// The most request keys one edge row keeps.
pub const KEPT: usize = 16;

/// A key older than this is forgotten: its retry is a new request (one day).
pub const KEPT_FOR_MS: i64 = 86_400_000;

/// The key as stored on the edge: namespaced by who sent it.
pub fn stored(source: Source, key: &str) -> String {
    let ns = match source {
        Source::Retraction => "r",
        Source::Erasure => "e",
        // Every other source is a user's request through the API.
        _ => "u",
    };
    format!("{ns}:{key}")
}

/// What a remembered request asked for and what it was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remembered {
    pub liked: bool,
    pub changed: bool,
    pub op_id: i64,
    pub at_ms: i64,
}

impl Remembered {
    pub fn encode(&self) -> String {
        let op = if self.liked { "like" } else { "unlike" };
        format!(
            "{op},{},{},{}",
            u8::from(self.changed),
            self.op_id,
            self.at_ms
        )
    }

    pub fn decode(s: &str) -> Option<Remembered> {
        let mut parts = s.split(',');
        let liked = match parts.next()? {
            "like" => true,
            "unlike" => false,
            _ => return None,
        };
        let changed = match parts.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        let op_id = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some(Remembered {
            liked,
            changed,
            op_id,
            at_ms,
        })
    }

    fn live(&self, now_ms: i64) -> bool {
        now_ms - self.at_ms < KEPT_FOR_MS
    }
}

/// The live request stored under `key`, if the row remembers one.
pub fn lookup(keys: &BTreeMap<String, String>, key: &str, now_ms: i64) -> Option<Remembered> {
    keys.get(key)
        .and_then(|v| Remembered::decode(v))
        .filter(|r| r.live(now_ms))
}

/// The keys to drop from the row in the same write that adds `adding`, so that afterwards it
/// holds at most [`KEPT`] live keys: the expired and unreadable ones, then the oldest.
/// `adding` itself is never in the list: a removal and a set of one map entry in one write
/// share a timestamp, and the removal would win.
pub fn to_drop(keys: &BTreeMap<String, String>, adding: &str, now_ms: i64) -> Vec<String> {
    let mut drop = Vec::new();
    let mut live: Vec<(i64, &String)> = Vec::new();
    for (k, v) in keys.iter().filter(|(k, _)| *k != adding) {
        match Remembered::decode(v).filter(|r| r.live(now_ms)) {
            Some(r) => live.push((r.at_ms, k)),
            None => drop.push(k.clone()),
        }
    }
    live.sort();
    let excess = live.len().saturating_sub(KEPT - 1);
    drop.extend(live.into_iter().take(excess).map(|(_, k)| k.clone()));
    drop
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> String {
        Remembered {
            liked: true,
            changed: false,
            op_id: 1,
            at_ms: ms,
        }
        .encode()
    }

    #[test]
    fn a_remembered_answer_round_trips_and_garbage_is_none() {
        let r = Remembered {
            liked: false,
            changed: true,
            op_id: 42,
            at_ms: 1_700_000_000_123,
        };
        assert_eq!(r.encode(), "unlike,1,42,1700000000123");
        assert_eq!(Remembered::decode(&r.encode()), Some(r));
        for bad in [
            "",
            "like",
            "like,2,1,1",
            "like,1,x,1",
            "like,1,1,1,1",
            "LIKE,1,1,1",
        ] {
            assert_eq!(Remembered::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn user_and_operator_keys_never_meet() {
        assert_eq!(stored(Source::Api, "r:k"), "u:r:k");
        assert_ne!(stored(Source::Api, "k"), stored(Source::Retraction, "k"));
        assert_ne!(
            stored(Source::Erasure, "k"),
            stored(Source::Retraction, "k")
        );
    }

    #[test]
    fn a_key_older_than_a_day_is_forgotten() {
        let keys = BTreeMap::from([("u:a".to_string(), at(1_000))]);
        assert!(lookup(&keys, "u:a", 1_000 + KEPT_FOR_MS - 1).is_some());
        assert!(lookup(&keys, "u:a", 1_000 + KEPT_FOR_MS).is_none());
        assert!(lookup(&keys, "u:b", 1_000).is_none());
    }

    #[test]
    fn the_row_keeps_the_newest_live_keys_and_never_drops_the_one_being_added() {
        let now = 10 * KEPT_FOR_MS;
        let mut keys: BTreeMap<String, String> = (0..20)
            .map(|i| (format!("u:k{i:02}"), at(now - 1000 + i)))
            .collect();
        keys.insert("u:old".into(), at(now - KEPT_FOR_MS));
        keys.insert("u:bad".into(), "?".into());
        let drop = to_drop(&keys, "u:k00", now);
        // Expired and unreadable go; of the 19 other live keys the 4 oldest go, leaving 15
        // (plus the one being added: 16).
        let mut want: Vec<String> = vec!["u:bad".into(), "u:old".into()];
        want.extend((1..=4).map(|i| format!("u:k{i:02}")));
        assert_eq!(drop, want);
        let small = BTreeMap::from([("u:a".to_string(), at(now))]);
        assert!(to_drop(&small, "u:b", now).is_empty());
    }
}
