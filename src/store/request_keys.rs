//! Request keys as the edge row remembers them (docs/design.md, "One Paxos round per write"):
//! `recent_keys map<int, text>`, a ring of [`KEPT`] slots, each holding one request's key,
//! operation and answer. A new request takes a slot by overwriting it, never by deleting:
//! a deleted map entry is a tombstone that every read of the row would scan until
//! `gc_grace_seconds` passed, and a user tapping one edge all day would pile them up past
//! Cassandra's tombstone failure threshold. Overwriting a map cell shadows it and leaves none.
//!
//! The slot taken is the one the request saw empty, or else expired (older than
//! [`KEPT_FOR_MS`]), or else holding the oldest key, sparing two kinds of key while others
//! exist: the key of the edge's last real flip (its retry after later no-ops must still
//! replay) and an operator's keys (a user's taps must not push a retraction's key out).
//!
//! Keys are namespaced by who sent them, so no key a user can send ever equals one an operator
//! uses: a user's `K` is stored as `u:K`, a retraction's as `r:K`, an erasure's as `e:K`.
//! A slot's value is `<like|unlike>,<changed 0|1>,<op_id>,<at_ms>,<stored key>`: everything the
//! answer holds besides the edge's own item and user, when it was written (to age it out),
//! and the key last (it may itself hold commas).

use std::collections::BTreeMap;

use crate::schema::v1::Source;

/// The slots of one edge row: the most request keys it keeps.
pub const KEPT: i32 = 16;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub liked: bool,
    pub changed: bool,
    pub op_id: i64,
    pub at_ms: i64,
    /// The stored (namespaced) key.
    pub key: String,
}

impl Remembered {
    pub fn encode(&self) -> String {
        let op = if self.liked { "like" } else { "unlike" };
        format!(
            "{op},{},{},{},{}",
            u8::from(self.changed),
            self.op_id,
            self.at_ms,
            self.key
        )
    }

    pub fn decode(s: &str) -> Option<Remembered> {
        let mut parts = s.splitn(5, ',');
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
        let key = parts.next().filter(|k| !k.is_empty())?.to_string();
        Some(Remembered {
            liked,
            changed,
            op_id,
            at_ms,
            key,
        })
    }

    fn live(&self, now_ms: i64) -> bool {
        now_ms - self.at_ms < KEPT_FOR_MS
    }

    fn is_operators(&self) -> bool {
        !self.key.starts_with("u:")
    }
}

/// The live request stored under `key`, if the row remembers one.
pub fn lookup(slots: &BTreeMap<i32, String>, key: &str, now_ms: i64) -> Option<Remembered> {
    slots
        .values()
        .filter_map(|v| Remembered::decode(v))
        .find(|r| r.key == key && r.live(now_ms))
}

/// The slot a new request on this row writes its key into (see the module's rule).
/// `last_flip` is the edge's op_id: the key that flipped it to that version is spared.
pub fn slot_for(slots: &BTreeMap<i32, String>, last_flip: i64, now_ms: i64) -> i32 {
    if let Some(free) = (0..KEPT).find(|s| !slots.contains_key(s)) {
        return free;
    }
    let mut spared = Vec::new();
    let mut candidates = Vec::new();
    for (&slot, v) in slots.iter().filter(|(s, _)| (0..KEPT).contains(*s)) {
        match Remembered::decode(v).filter(|r| r.live(now_ms)) {
            None => return slot, // expired, or unreadable
            Some(r) if r.is_operators() || (r.changed && r.op_id == last_flip) => {
                spared.push((r.at_ms, slot))
            }
            Some(r) => candidates.push((r.at_ms, slot)),
        }
    }
    let oldest = |v: &[(i64, i32)]| v.iter().min().map(|&(_, s)| s);
    oldest(&candidates).or_else(|| oldest(&spared)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(key: &str, changed: bool, op_id: i64, at_ms: i64) -> String {
        Remembered {
            liked: true,
            changed,
            op_id,
            at_ms,
            key: key.into(),
        }
        .encode()
    }

    #[test]
    fn a_remembered_answer_round_trips_and_garbage_is_none() {
        let a = Remembered {
            liked: false,
            changed: true,
            op_id: 42,
            at_ms: 1_700_000_000_123,
            key: "u:a,b".into(),
        };
        assert_eq!(a.encode(), "unlike,1,42,1700000000123,u:a,b");
        assert_eq!(Remembered::decode(&a.encode()), Some(a));
        for bad in [
            "",
            "like",
            "like,2,1,1,u:k",
            "like,1,x,1,u:k",
            "like,1,1,1,",
            "LIKE,1,1,1,k",
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
        let slots = BTreeMap::from([(3, r("u:a", true, 1, 1_000))]);
        assert!(lookup(&slots, "u:a", 1_000 + KEPT_FOR_MS - 1).is_some());
        assert!(lookup(&slots, "u:a", 1_000 + KEPT_FOR_MS).is_none());
        assert!(lookup(&slots, "u:b", 1_000).is_none());
    }

    #[test]
    fn a_new_key_takes_a_free_slot_then_an_expired_one_then_the_oldest_unspared() {
        let now = 10 * KEPT_FOR_MS;
        let mut slots: BTreeMap<i32, String> = (0..KEPT - 1)
            .map(|s| {
                (
                    s,
                    r(&format!("u:k{s}"), false, 7, now - 1000 + i64::from(s)),
                )
            })
            .collect();
        assert_eq!(slot_for(&slots, 7, now), KEPT - 1, "the free slot");
        slots.insert(KEPT - 1, r("u:new", false, 7, now));
        // Slot 0 is the oldest: taken.
        assert_eq!(slot_for(&slots, 7, now), 0);
        // The last flip's key and an operator's are spared while others exist.
        slots.insert(0, r("u:flip", true, 7, now - 5000));
        slots.insert(1, r("r:retract", true, 6, now - 4000));
        assert_eq!(slot_for(&slots, 7, now), 2);
        // An expired or unreadable slot goes first.
        slots.insert(9, r("u:old", false, 7, now - KEPT_FOR_MS));
        assert_eq!(slot_for(&slots, 7, now), 9);
        slots.insert(9, "?".into());
        assert_eq!(slot_for(&slots, 7, now), 9);
    }
}
