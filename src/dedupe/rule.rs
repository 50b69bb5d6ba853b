//! The delta rule of stage 1: what one LikeEvent changes in its item's count, given what the
//! stage remembers of the edge. Pure, so it is tested exhaustively without a stack.
//!
//! An edge's contribution to its item's count is 1 while LIKED, 0 otherwise. op_id grows by
//! exactly one per real flip, so states alternate: op 1 is always a like, op 2 an unlike, ...
//! Per edge the stage remembers the last (op_id, state) it counted, until `horizon` after
//! that op's event time:
//! - op_id <= remembered: a duplicate or a stale reorder: drop it.
//! - op_id > remembered: delta = new contribution - remembered contribution. A gap (a flip
//!   superseded before it was published) is fine: only the end state counts.
//! - nothing remembered: no earlier op inside the horizon was counted (it would be
//!   remembered), so the edge's counted baseline is the state of the newest earlier op that
//!   is already past the horizon: every op that stayed the edge's current version longer
//!   than the relay takes to publish was counted, and one past the horizon did (docs/
//!   exactness.md, "Past the horizon"). The event carries the times of the flips before it
//!   (`prev_event_time_ms` and `earlier_event_times_ms`, newest first), so the rule walks
//!   them to the first one past the horizon: its state is the baseline. None past it and
//!   the list reaches op 1: the baseline is "never liked". None past it and the list ends
//!   before op 1 (more than 16 flips inside the horizon, or an event of an older writer):
//!   the baseline is unknown. The rule then guesses "never liked" and says so
//!   ([`Verdict::Apply::guessed`]); stage 1 turns every guess into a recount record that
//!   `likes reconcile --dead-letters` drains, so a guess is never a silent +1.
//!   (the textbook rule, +1/-1 always, miscounts a reordered or superseded unlike
//!   within the horizon by -1; a rule that looks only at op_id - 1 counts an expired like
//!   twice when op_id - 1 was never published.)
//! - a baseline op that passed the horizon only within the arriving flip's own delay may not
//!   have been counted yet (flips of one outage reach the log out of order): the rule uses
//!   it, and says it guessed, so the item is recounted.
//! - nothing remembered and the flip itself older than the horizon: its state, if it was
//!   ever counted, has expired, so it cannot be told from a redelivery; counting it would
//!   count a redelivered version again. It is refused ([`Verdict::Expired`]).

use crate::records::EARLIER_FLIPS;

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
    /// Event times of op_id - 2, op_id - 3, ..., newest first; 0 past the known ones.
    pub earlier_event_times_ms: [i64; EARLIER_FLIPS],
    /// When the item's range came home to the region that wrote the flip (0 without home
    /// regions): flips before it were the previous home's.
    pub home_since_ms: i64,
}

impl Flip {
    /// The earlier ops this flip knows the time of, newest first: (op_id, event time).
    fn known_earlier(&self) -> impl Iterator<Item = (u64, i64)> + '_ {
        std::iter::once(self.prev_event_time_ms)
            .chain(self.earlier_event_times_ms.iter().copied())
            .take_while(|&t| t > 0)
            .zip((1..self.op_id).rev())
            .map(|(t, op)| (op, t))
    }
}

/// The rule's verdict on one flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Duplicate or stale: no delta, state unchanged.
    Drop,
    /// Count `delta` (-1, 0 or +1) and remember `state`. `guessed`: nothing was remembered
    /// and the event did not reach back far enough to know the counted baseline, so
    /// "never liked" was assumed; the item must be recounted.
    Apply {
        delta: i64,
        state: EdgeVersion,
        guessed: bool,
    },
    /// Older than the horizon with nothing remembered: a redelivery of a version counted
    /// once and since forgotten, or a flip stage 1 saw only after its horizon. Neither can
    /// be counted safely; the stage dead-letters it (reconciliation is the backstop).
    Expired,
    /// A flip from before its range came home to this region (a move's leftover, published
    /// by the new home's relay): the previous home's pipeline counted it, or the move's
    /// recount did. Not counted here, state unchanged.
    PreviousHome,
}

/// What the stage remembers of an edge, if it may be trusted for `flip`: not when it dates
/// from before the range last came home here (a flip of an earlier stay, since when another
/// region's pipeline counted the edge's flips). Then the rule goes by the flips the event
/// carries, as with nothing remembered, with the time it came home as the line before which
/// flips are counted (docs/multi-region.md, "Stage-1 state after a move").
fn trusted(remembered: Option<EdgeVersion>, flip: &Flip) -> Option<EdgeVersion> {
    remembered.filter(|r| r.event_time_ms >= flip.home_since_ms)
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
    let mut guessed = false;
    if matches!(remembered, Some(r) if flip.op_id <= r.op_id) {
        return Verdict::Drop;
    }
    if flip.event_time_ms < flip.home_since_ms {
        return Verdict::PreviousHome;
    }
    let delta = match trusted(remembered, &flip) {
        Some(r) => new - i64::from(r.liked),
        None if expired(flip.event_time_ms, now_ms, horizon_ms) => return Verdict::Expired,
        None => {
            let mut reached_op_1 = flip.op_id == 1;
            let mut baseline = None;
            // How late this flip arrived: flips of one outage reach the log out of order, each
            // about this late (issue 43, hole 7b).
            let lag = (now_ms - flip.event_time_ms).max(0);
            for (op, t) in flip.known_earlier() {
                // The previous home's (counted there or by the move's recount).
                if t < flip.home_since_ms {
                    baseline = Some(i64::from(op % 2 == 1));
                    break;
                }
                // Counted and forgotten. Unless it passed the horizon only within the lag:
                // then it may itself be on its way, never counted, and the baseline is a
                // guess the recount settles (never a silent ±1).
                if expired(t, now_ms, horizon_ms) {
                    guessed = !expired(t, now_ms - lag, horizon_ms);
                    // Odd ops are likes.
                    baseline = Some(i64::from(op % 2 == 1));
                    break;
                }
                reached_op_1 = op == 1;
            }
            match baseline {
                Some(b) => new - b,
                None => {
                    guessed = !reached_op_1;
                    new
                }
            }
        }
    };
    Verdict::Apply {
        delta,
        state,
        guessed,
    }
}

/// Where on the edge clock a flip's delta happened, as (event time, delta) parts. A flip
/// that skips ops stage 1 never counted (superseded before it was published, or overtaken by
/// it) changes the count in two steps: to op_id − 1's state, at that op's time
/// (`prev_event_time_ms`), and to its own state at its own time. Reconcile and rebuild split
/// the deltas log at a second of that clock (ops/cut.rs); without the split, the skipped
/// op's change would land in the later flip's second and a cut between the two would see a
/// false ±1. The parts sum to `delta`.
pub fn placed(remembered: Option<EdgeVersion>, flip: Flip, delta: i64) -> [(i64, i64); 2] {
    let skipped = match trusted(remembered, &flip) {
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
        let times: Vec<i64> = (1..=op_id as i64).map(|k| NOW - 1000 * (100 - k)).collect();
        history_flip(op_id, &times)
    }

    #[test]
    fn after_a_move_home_the_flips_of_the_other_stay_are_not_counted_again() {
        // Ops 1-5 one second apart. This region counted op 3 (a like) during an earlier
        // stay; the range then moved away, the other region flipped op 4 (an unlike, counted
        // there), and came home here just before op 5 (a like).
        let since = flip(5).event_time_ms - 500;
        let at_home = |op| Flip {
            home_since_ms: since,
            ..flip(op)
        };
        let liked3 = EdgeVersion {
            op_id: 3,
            liked: true,
            event_time_ms: flip(3).event_time_ms,
        };
        // Trusting the old memory would count 0 (like after like); the row holds op 4's
        // unlike, so op 5 is +1.
        assert!(matches!(
            apply(Some(liked3), flip(5), NOW, H),
            Verdict::Apply { delta: 0, .. }
        ));
        let v = apply(Some(liked3), at_home(5), NOW, H);
        assert!(
            matches!(
                v,
                Verdict::Apply {
                    delta: 1,
                    guessed: false,
                    ..
                }
            ),
            "{v:?}"
        );
        assert_eq!(
            placed(Some(liked3), at_home(5), 1),
            [(flip(4).event_time_ms, 0), (flip(5).event_time_ms, 1)],
            "all of it at op 5's own time: op 4's change is the other region's"
        );
        // Nothing remembered: op 4 is the baseline too.
        assert!(matches!(
            apply(None, at_home(5), NOW, H),
            Verdict::Apply { delta: 1, .. }
        ));
        // Op 4 itself, published late by this region's relay: the other region's to count.
        assert_eq!(apply(None, at_home(4), NOW, H), Verdict::PreviousHome);
        // A redelivery is a duplicate whenever it was made.
        let liked5 = EdgeVersion {
            op_id: 5,
            liked: true,
            event_time_ms: flip(5).event_time_ms,
        };
        assert_eq!(apply(Some(liked5), at_home(4), NOW, H), Verdict::Drop);
        assert_eq!(apply(Some(liked5), at_home(5), NOW, H), Verdict::Drop);
        // Memory from this stay is trusted: op 6 after op 5 is -1.
        assert!(matches!(
            apply(Some(liked5), at_home(6), NOW, H),
            Verdict::Apply { delta: -1, .. }
        ));
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

    /// Op `op_id` of an edge whose flips 1..=op_id happened at `times` (oldest first).
    /// Issue 43, hole 7b, as the chaos run saw it: after an outage the APIs' producers
    /// flushed out of order, op 28 of an edge reached stage 1 before op 23; op 22's state
    /// had expired and op 23's time had just passed the horizon. Taking op 23 as the counted
    /// baseline counted -1 in silence (op 23, never counted, was dropped when it came). A
    /// baseline that passed the horizon only within the arriving flip's own delay may still
    /// be on its way: the rule counts it as a guess, with a recount record.
    #[test]
    fn a_baseline_that_passed_the_horizon_within_the_lag_is_a_guess() {
        // Ops 1..=28 one second apart; the horizon passed op 23's time 2 s ago.
        let t = |k: i64| NOW - H - 2_000 + (k - 23) * 1_000;
        let times: Vec<i64> = (1..=28).map(t).collect();
        let late = history_flip(28, &times);
        match apply(None, late, NOW, H) {
            Verdict::Apply { guessed, delta, .. } => {
                assert!(guessed, "a silent baseline (delta {delta})");
            }
            v => panic!("{v:?}"),
        }
        // The same flip arriving promptly (its baseline long past the horizon) is exact.
        let t = |k: i64| NOW - 2 * H + k * 1_000;
        let times: Vec<i64> = (1..=28).map(t).collect();
        let mut prompt = history_flip(28, &times);
        prompt.event_time_ms = NOW - 1_000;
        assert!(matches!(
            apply(None, prompt, NOW, H),
            Verdict::Apply {
                guessed: false,
                delta: -1,
                ..
            }
        ));
    }

    fn history_flip(op_id: u64, times: &[i64]) -> Flip {
        let n = times.len();
        let mut earlier = [0; EARLIER_FLIPS];
        for (slot, &t) in earlier
            .iter_mut()
            .zip(times[..n.saturating_sub(2)].iter().rev())
        {
            *slot = t;
        }
        Flip {
            op_id,
            liked: op_id % 2 == 1,
            event_time_ms: times[n - 1],
            prev_event_time_ms: if n > 1 { times[n - 2] } else { 0 },
            earlier_event_times_ms: earlier,
            home_since_ms: 0,
        }
    }

    fn run(order: &[u64], start: Option<EdgeVersion>) -> i64 {
        let mut state = start;
        let mut total = 0;
        for &op in order {
            if let Verdict::Apply {
                delta, state: s, ..
            } = apply(state, flip(op), NOW, H)
            {
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
            earlier_event_times_ms: [0; EARLIER_FLIPS],
            home_since_ms: 0,
        };
        assert_eq!(
            apply(None, unlike, NOW, H),
            Verdict::Apply {
                delta: -1,
                state: EdgeVersion {
                    op_id: 2,
                    liked: false,
                    event_time_ms: NOW
                },
                guessed: false,
            }
        );
    }

    /// Delta of one flip delivered again long after it was counted: its state has expired
    /// (nothing remembered), so only the event's own age can tell it is not new.
    fn redelivered_long_after(op_id: u64) -> i64 {
        let t = NOW - 8 * 24 * 3600 * 1000; // counted 8 days ago; the horizon is 7
        let times: Vec<i64> = (1..=op_id as i64)
            .map(|k| t - 1000 * (op_id as i64 - k))
            .collect();
        match apply(None, history_flip(op_id, &times), NOW, H) {
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

    /// Issue 23, item 1: op 1 (a like) counted 8 days ago and expired from state; on day 8 the
    /// user unlikes (op 2) and likes again (op 3) a second apart. Whatever order ops 2 and 3
    /// reach stage 1 in, and if op 2 never does, the edge ends LIKED and was counted once
    /// already: the deltas must sum to 0. The symmetric case (op 3 lost, op 4 an unlike) must
    /// sum to -1.
    #[test]
    fn an_expired_like_flipped_twice_is_counted_once_in_every_order() {
        let day = 24 * 3600 * 1000;
        // Op 1 counted and expired; ops 2 and 3 today: LIKED, counted already: 0 more.
        let t = [NOW - 8 * day, NOW - 3000, NOW - 2000, NOW - 1000];
        for order in [&[2, 3][..], &[3, 2], &[3]] {
            let sum = sum_of(&t, order);
            assert_eq!(sum, 0, "ops {order:?} after a counted, expired like");
        }
        // Ops 1 and 2 counted and expired (the edge counts 0 so far); ops 3 and 4 today end
        // UNLIKED: nothing more to count.
        let t = [NOW - 9 * day, NOW - 8 * day, NOW - 2000, NOW - 1000];
        for order in [&[3, 4][..], &[4, 3], &[4]] {
            let sum = sum_of(&t, order);
            assert_eq!(sum, 0, "ops {order:?} after a counted, expired unlike");
        }
        // Op 1 counted and expired, then ops 2, 3 and 4 (op 3 lost): LIKED to UNLIKED: -1.
        let t = [NOW - 8 * day, NOW - 3000, NOW - 2000, NOW - 1000];
        for order in [&[2, 4][..], &[4, 2], &[4]] {
            let sum = sum_of(&t, order);
            assert_eq!(sum, -1, "ops {order:?}: a counted like, now unliked");
        }
    }

    /// The deltas of `ops` of an edge whose flips 1.. happened at `times`, reaching stage 1
    /// in that order with nothing remembered at first.
    fn sum_of(times: &[i64], ops: &[u64]) -> i64 {
        let mut state = None;
        let mut total = 0;
        for &op in ops {
            let f = history_flip(op, &times[..op as usize]);
            if let Verdict::Apply {
                delta, state: s, ..
            } = apply(state, f, NOW, H)
            {
                total += delta;
                state = Some(s);
            }
        }
        total
    }

    /// The baseline is the newest op past the horizon, however deep in the event's list.
    #[test]
    fn the_baseline_is_the_newest_op_past_the_horizon() {
        let day = 24 * 3600 * 1000;
        // Ops 1-3 long ago (op 3, a like, counted and expired), then ops 4-12 today.
        let mut times = vec![NOW - 30 * day, NOW - 20 * day, NOW - 10 * day];
        times.extend((4..=12).map(|k| NOW - 1000 * (20 - k)));
        for n in 4..=12u64 {
            let v = apply(None, history_flip(n, &times[..n as usize]), NOW, H);
            let Verdict::Apply { delta, guessed, .. } = v else {
                panic!("op {n} applies: {v:?}")
            };
            assert!(!guessed, "op {n}: the list reaches op 3");
            // The baseline is op 3's like.
            assert_eq!(delta, i64::from(n % 2 == 1) - 1, "op {n}");
        }
    }

    /// More flips inside the horizon than the event carries, or an event of a writer older
    /// than `earlier_event_times_ms`: the baseline is unknown, the verdict says it guessed.
    #[test]
    fn an_unknown_baseline_is_a_guess_and_says_so() {
        let times: Vec<i64> = (1..=20).map(|k| NOW - 1000 * (30 - k)).collect();
        let v = apply(None, history_flip(20, &times), NOW, H);
        assert!(
            matches!(v, Verdict::Apply { guessed: true, .. }),
            "20 flips, 16 known: {v:?}"
        );
        let v = apply(None, history_flip(16, &times[..16]), NOW, H);
        assert!(
            matches!(v, Verdict::Apply { guessed: false, .. }),
            "16 flips, all known: {v:?}"
        );
        let older_writer = Flip {
            earlier_event_times_ms: [0; EARLIER_FLIPS],
            ..history_flip(3, &times[..3])
        };
        let v = apply(None, older_writer, NOW, H);
        assert!(matches!(v, Verdict::Apply { guessed: true, .. }), "{v:?}");
        // Known down to op 1, or remembered: never a guess.
        let v = apply(None, history_flip(2, &times[..2]), NOW, H);
        assert!(matches!(v, Verdict::Apply { guessed: false, .. }), "{v:?}");
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
