//! The delta rule of stage 1: what one LikeEvent changes in its item's count, given what the
//! stage remembers of the edge. Pure, so it is tested exhaustively without a stack.
//!
//! An edge's contribution to its item's count is 1 while LIKED, 0 otherwise. op_id grows by
//! exactly one per real flip, so states alternate: op 1 is always a like, op 2 an unlike, ...
//! Per edge the stage remembers the last (op_id, state) it counted:
//! - op_id <= remembered: a duplicate or a stale reorder: drop it.
//! - op_id > remembered: delta = new contribution - remembered contribution. A gap (a flip
//!   superseded before it was published) is fine: only the end state counts.
//! - nothing remembered: the previous flip (op_id - 1) was either counted and has since
//!   expired from state (it is older than the horizon), so its opposite state counted and
//!   delta = +1 / -1; or it was never counted (not yet seen: reordered, or superseded before
//!   it was published), so the baseline is "not liked" and delta = +1 / 0. The event's
//!   `prev_event_time_ms` tells the two apart. (DESIGN.md's shorter rule, +1/-1 always,
//!   miscounts a reordered or superseded unlike within the horizon by -1.)
//! - nothing remembered and the flip itself older than the horizon: its state, if it was
//!   ever counted, has expired, so it cannot be told from a redelivery; counting it would
//!   count a redelivered version again. It is refused ([`Verdict::Expired`]).

/// What stage 1 remembers of one edge: the last op it counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeVersion {
    pub op_id: u64,
    pub liked: bool,
    /// Event time of that op, Unix ms: state expires `horizon` after it.
    pub event_time_ms: i64,
}

/// One incoming flip, as far as the rule cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flip {
    pub op_id: u64,
    pub liked: bool,
    pub event_time_ms: i64,
    /// Event time of op_id - 1; 0 when op_id is 1 or unknown.
    pub prev_event_time_ms: i64,
}

/// The rule's verdict on one flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Duplicate or stale: no delta, state unchanged.
    Drop,
    /// Count `delta` (-1, 0 or +1) and remember `state`.
    Apply { delta: i64, state: EdgeVersion },
    /// Older than the horizon with nothing remembered: a redelivery of a version counted
    /// once and since forgotten, or a flip stage 1 saw only after its horizon. Neither can
    /// be counted safely; the stage dead-letters it (reconciliation is the backstop).
    Expired,
}

/// The one notion of expiry: state for an op whose event time is `event_time_ms` is gone at
/// `now_ms`. Reads, the rule and (with a margin, see `state`) compaction all use it.
pub fn expired(event_time_ms: i64, now_ms: i64, horizon_ms: i64) -> bool {
    event_time_ms.saturating_add(horizon_ms) < now_ms
}

/// Applies the rule. `now_ms` is the stage's clock and `horizon_ms` the state TTL.
pub fn apply(remembered: Option<EdgeVersion>, flip: Flip, now_ms: i64, horizon_ms: i64) -> Verdict {
    let state = EdgeVersion {
        op_id: flip.op_id,
        liked: flip.liked,
        event_time_ms: flip.event_time_ms,
    };
    let new = i64::from(flip.liked);
    let delta = match remembered {
        Some(r) if flip.op_id <= r.op_id => return Verdict::Drop,
        Some(r) => new - i64::from(r.liked),
        None if expired(flip.event_time_ms, now_ms, horizon_ms) => return Verdict::Expired,
        None => {
            let prev_expired = flip.op_id > 1
                && flip.prev_event_time_ms > 0
                && expired(flip.prev_event_time_ms, now_ms, horizon_ms);
            if prev_expired {
                // The previous flip counted its opposite state.
                new - i64::from(!flip.liked)
            } else {
                new
            }
        }
    };
    Verdict::Apply { delta, state }
}

/// Where on the edge clock a flip's delta happened, as (event time, delta) parts. A flip
/// that skips ops stage 1 never counted (superseded before it was published, or overtaken by
/// it) changes the count in two steps: to op_id − 1's state, at that op's time
/// (`prev_event_time_ms`), and to its own state at its own time. Reconcile and rebuild split
/// the deltas log at a second of that clock (ops/cut.rs); without the split, the skipped
/// op's change would land in the later flip's second and a cut between the two would see a
/// false ±1. The parts sum to `delta`.
pub fn placed(remembered: Option<EdgeVersion>, flip: Flip, delta: i64) -> [(i64, i64); 2] {
    let skipped = match remembered {
        Some(r) => flip.op_id > r.op_id + 1,
        None => flip.op_id > 1,
    };
    if !skipped || flip.prev_event_time_ms <= 0 {
        return [(flip.event_time_ms, delta), (flip.event_time_ms, 0)];
    }
    // op_id − 1 is the opposite state (flips alternate).
    let last = i64::from(flip.liked) - i64::from(!flip.liked);
    [
        (flip.prev_event_time_ms, delta - last),
        (flip.event_time_ms, last),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 7 * 24 * 3600 * 1000;
    const NOW: i64 = 100 * H;

    /// The flips of one edge: op n is a like when n is odd; one second apart.
    fn flip(op_id: u64) -> Flip {
        let t = NOW - 1000 * (100 - op_id as i64);
        Flip {
            op_id,
            liked: op_id % 2 == 1,
            event_time_ms: t,
            prev_event_time_ms: if op_id > 1 { t - 1000 } else { 0 },
        }
    }

    #[test]
    fn a_skipped_op_is_placed_at_its_own_time() {
        let liked3 = EdgeVersion {
            op_id: 3,
            liked: true,
            event_time_ms: flip(3).event_time_ms,
        };
        // Op 5 (like) after op 3 (like), op 4 (unlike) never seen: -1 at op 4's time, +1 at
        // op 5's; the net 0 is what `apply` counts.
        let Verdict::Apply { delta, .. } = apply(Some(liked3), flip(5), NOW, H) else {
            panic!("applies")
        };
        let parts = placed(Some(liked3), flip(5), delta);
        assert_eq!(
            parts,
            [(flip(4).event_time_ms, -1), (flip(5).event_time_ms, 1)]
        );
        // Nothing remembered, op 4 (unlike) first: op 3's like never counted, so +1 then -1.
        let Verdict::Apply { delta, .. } = apply(None, flip(4), NOW, H) else {
            panic!("applies")
        };
        assert_eq!(
            placed(None, flip(4), delta),
            [(flip(3).event_time_ms, 1), (flip(4).event_time_ms, -1)]
        );
        // The next op: all at its own time.
        assert_eq!(
            placed(Some(liked3), flip(4), -1)[0],
            (flip(4).event_time_ms, -1)
        );
        // Every order of every flip: the parts sum to the delta.
        for from in 0..6u64 {
            for to in (from + 1)..8 {
                let r = (from > 0).then(|| EdgeVersion {
                    op_id: from,
                    liked: from % 2 == 1,
                    event_time_ms: flip(from).event_time_ms,
                });
                if let Verdict::Apply { delta, .. } = apply(r, flip(to), NOW, H) {
                    let p = placed(r, flip(to), delta);
                    assert_eq!(p[0].1 + p[1].1, delta);
                }
            }
        }
    }

    fn run(order: &[u64], start: Option<EdgeVersion>) -> i64 {
        let mut state = start;
        let mut total = 0;
        for &op in order {
            if let Verdict::Apply { delta, state: s } = apply(state, flip(op), NOW, H) {
                total += delta;
                state = Some(s);
            }
        }
        total
    }

    #[test]
    fn any_order_with_any_duplicates_counts_the_last_state() {
        // Every permutation of 4 flips, each delivered once or twice, plus superseded ones.
        let ops = [1u64, 2, 3, 4];
        let mut perms = vec![vec![]];
        for _ in 0..ops.len() {
            let mut next = vec![];
            for p in &perms {
                for &o in &ops {
                    if !p.contains(&o) {
                        let mut q = p.clone();
                        q.push(o);
                        next.push(q);
                    }
                }
            }
            perms = next;
        }
        for p in perms {
            assert_eq!(run(&p, None), 0, "{p:?}: 4 flips end unliked");
            let mut twice = p.clone();
            twice.extend(p.iter().rev());
            assert_eq!(run(&twice, None), 0, "{twice:?}");
            let liked: Vec<u64> = p.iter().copied().filter(|&o| o != 4).collect();
            assert_eq!(run(&liked, None), 1, "{liked:?}: op 3 is the last, a like");
        }
    }

    #[test]
    fn superseded_flips_need_not_arrive() {
        assert_eq!(run(&[3], None), 1); // ops 1 and 2 never published
        assert_eq!(run(&[2], None), 0); // a like superseded by an unlike: nothing counted
        assert_eq!(run(&[1, 4], None), 0);
        assert_eq!(
            run(&[1, 5], None),
            1,
            "from liked to liked: the like stays counted once"
        );
    }

    #[test]
    fn past_the_horizon_the_previous_flip_counted() {
        // op 1 counted 30 days ago and expired from state; now the unlike arrives.
        let unlike = Flip {
            op_id: 2,
            liked: false,
            event_time_ms: NOW,
            prev_event_time_ms: NOW - 30 * 24 * 3600 * 1000,
        };
        assert_eq!(
            apply(None, unlike, NOW, H),
            Verdict::Apply {
                delta: -1,
                state: EdgeVersion {
                    op_id: 2,
                    liked: false,
                    event_time_ms: NOW
                }
            }
        );
    }

    /// Delta of one flip delivered again long after it was counted: its state has expired
    /// (nothing remembered), so only the event's own age can tell it is not new.
    fn redelivered_long_after(op_id: u64) -> i64 {
        let t = NOW - 8 * 24 * 3600 * 1000; // counted 8 days ago; the horizon is 7
        let f = Flip {
            op_id,
            liked: op_id % 2 == 1,
            event_time_ms: t,
            prev_event_time_ms: if op_id > 1 { t - 1000 } else { 0 },
        };
        match apply(None, f, NOW, H) {
            Verdict::Apply { delta, .. } => delta,
            _ => 0,
        }
    }

    #[test]
    fn a_version_redelivered_past_the_horizon_counts_nothing() {
        // The like counted once, 8 days ago; any number of redeliveries adds nothing.
        assert_eq!(
            redelivered_long_after(1),
            0,
            "a redelivered like re-counted"
        );
        assert_eq!(redelivered_long_after(3), 0);
        // The unlike took its -1 once; a redelivery must not take another.
        assert_eq!(
            redelivered_long_after(2),
            0,
            "a redelivered unlike re-counted"
        );
        assert_eq!(redelivered_long_after(4), 0);
    }

    #[test]
    fn duplicates_and_stale_ops_drop() {
        let s = Some(EdgeVersion {
            op_id: 3,
            liked: true,
            event_time_ms: NOW,
        });
        assert_eq!(apply(s, flip(3), NOW, H), Verdict::Drop);
        assert_eq!(apply(s, flip(2), NOW, H), Verdict::Drop);
        assert!(matches!(
            apply(s, flip(4), NOW, H),
            Verdict::Apply { delta: -1, .. }
        ));
    }
}
