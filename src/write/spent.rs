//! What one write cost the database on its answer's path (issue 57, docs/performance.md,
//! "What a write costs"): the requests it sent, the waits on an answer it made one after the
//! other (requests sent together are one wait), and the Paxos rounds among them (a
//! compare-and-set, or a read at SERIAL). Counted by the write path where it sends, and
//! exported per kind of write, so a benchmark divides them by the writes of each kind.
//! The clears of outbox entries go behind the answer, gathered across writes: not counted.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::runtime::metrics as m;

#[derive(Debug, Default)]
pub struct Spent {
    requests: AtomicU32,
    waits: AtomicU32,
    paxos: AtomicU32,
}

impl Spent {
    /// One wait on the answers of `requests` sent together, `paxos` of them Paxos rounds.
    pub fn wait(&self, requests: u32, paxos: u32) {
        if requests > 0 {
            self.requests.fetch_add(requests, Relaxed);
            self.waits.fetch_add(1, Relaxed);
            self.paxos.fetch_add(paxos, Relaxed);
        }
    }

    /// Exports an answered write's cost under its kind ([`Kind::label`]).
    pub fn record(&self, kind: Kind) {
        let kind = kind.label();
        metrics::counter!(m::WRITES_BY_KIND, "kind" => kind).increment(1);
        let add = |name: &'static str, n: &AtomicU32| {
            metrics::counter!(name, "kind" => kind).increment(u64::from(n.load(Relaxed)));
        };
        add(m::WRITE_CQL_REQUESTS, &self.requests);
        add(m::WRITE_CQL_WAITS, &self.waits);
        add(m::WRITE_PAXOS_ROUNDS, &self.paxos);
    }
}

/// The kinds of answered write whose costs differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A like of an edge with no row yet.
    FirstLike,
    /// A like that flipped a row already there (a like again after an unlike).
    LikeOfRow,
    /// An unlike that flipped a like.
    Unlike,
    /// A request that found its key on the row: its answer replayed.
    KeyedRetry,
    /// A like of a liked edge, or an unlike of an unliked or absent one: only the key written.
    NoOp,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::FirstLike,
        Kind::LikeOfRow,
        Kind::Unlike,
        Kind::KeyedRetry,
        Kind::NoOp,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Kind::FirstLike => "first_like",
            Kind::LikeOfRow => "like_of_row",
            Kind::Unlike => "unlike",
            Kind::KeyedRetry => "keyed_retry",
            Kind::NoOp => "no_op",
        }
    }
}
