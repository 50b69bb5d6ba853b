//! Windows of stage 2, a pure function of the deltas log.
//!
//! Each `likes.deltas` partition has its own clock: the records' log-append time, made
//! monotonic (`clock = max(clock, timestamp)`). A window is `clock / window_ms`. Records are
//! read in offset order (read_committed), so once a record moves the clock into a later
//! window, every earlier window of that partition is complete and closes. Items are keyed,
//! so an item lives on exactly one partition and (item, window) is unique.
//!
//! After a restart the consumer resumes at the first record of the window that was open, with
//! the clock restored to that window's start (kept in the commit's metadata): the replay
//! rebuilds the same window from the same records.
//!
//! The window length in force travels in the same metadata. A restart with another length
//! (a deployment changing `window`) keeps the committed grid up to the first boundary both
//! grids share, then switches: windows the killed process had applied but not committed are
//! rebuilt on their own grid, so the fence (which compares window end times) skips them.
//! Without it, 250 ms windows applied before a kill would be re-applied inside the first
//! 1 s window after it (issue 23, item 4).

use std::collections::HashMap;

use crate::records::{Correction, Weight};

/// One item's change within a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemDelta {
    pub delta: i64,
    /// Earliest event time of the deltas summed here, Unix ms.
    pub event_time_ms: i64,
    /// The flips summed here and the sum of their event times: staleness is measured per
    /// event from their mean.
    pub events: u64,
    pub event_time_sum_ms: i128,
}

impl ItemDelta {
    /// The mean event time of the flips summed here.
    pub fn mean_event_time_ms(&self) -> i64 {
        (self.event_time_sum_ms / i128::from(self.events.max(1))) as i64
    }
}

/// A window that can no longer change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedWindow {
    pub partition: i32,
    pub id: i64,
    pub end_ms: i64,
    pub items: HashMap<String, ItemDelta>,
    /// Delta records combined into this window (ticks not counted).
    pub records: u64,
    /// Corrections in this window, in log order (their items also appear in `items`).
    pub corrections: Vec<(String, Correction)>,
}

#[derive(Debug, Default)]
struct Open {
    id: i64,
    start_ms: i64,
    end_ms: i64,
    first_offset: i64,
    items: HashMap<String, ItemDelta>,
    records: u64,
    corrections: Vec<(String, Correction)>,
}

#[derive(Debug, Default)]
struct PartitionState {
    clock_ms: i64,
    open: Option<Open>,
    next_offset: i64,
    grid: Grid,
}

/// The window lengths in force along a partition's clock: `(from_ms, len)` steps, the first
/// from the beginning of time. One step (this process's length) once nothing earlier
/// processes may have applied is left to replay.
#[derive(Debug, Clone, Default)]
struct Grid {
    steps: Vec<(i64, i64)>,
    /// The log's end when the partition was assigned, while the committed grid is kept: a
    /// process that stopped before this one started cannot have applied a window of a record
    /// at or past it. There the grid switches to this process's length, at the first boundary
    /// both lengths share.
    replay_to: Option<i64>,
}

impl Grid {
    fn len_at(&self, clock: i64, own: i64) -> i64 {
        self.steps
            .iter()
            .rev()
            .find(|(from, _)| *from <= clock)
            .map_or(own, |&(_, len)| len)
    }

    /// The steps that start after `clock`: what a run resuming there must follow.
    fn after(&self, clock: i64) -> Vec<(i64, i64)> {
        self.steps
            .iter()
            .copied()
            .filter(|(from, _)| *from > clock)
            .collect()
    }

    /// Past everything an earlier process read, at `clock`: steps it never reached are
    /// dropped, and this process's length starts at the next boundary both lengths share.
    fn switch_to(&mut self, own: i64, clock: i64) {
        self.steps.retain(|(from, _)| *from <= clock);
        let len = self.len_at(clock, own);
        if len != own {
            let lcm = (len / gcd(len, own)).saturating_mul(own);
            let at = if clock.rem_euclid(lcm) == 0 {
                clock
            } else {
                clock.div_euclid(lcm).saturating_add(1).saturating_mul(lcm)
            };
            self.steps.push((at, own));
        }
        self.replay_to = None;
    }
}

impl PartitionState {
    /// The window `clock` falls in: (start, end), on the grid in force at that clock.
    fn window_at(&self, clock: i64, window_ms: i64) -> (i64, i64) {
        let len = self.grid.len_at(clock, window_ms);
        let start = clock.div_euclid(len).saturating_mul(len);
        (start, start.saturating_add(len))
    }
}

/// Where a partition may be committed: the offset to resume from, the clock to resume with,
/// the length of the window that clock starts (0: not recorded, as by older versions), and
/// the lengths in force later, `(from_ms, len)`, when a window change is under way: windows
/// past the resume point may already be applied on them (issue 43, item 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    pub offset: i64,
    pub clock_ms: i64,
    pub window_ms: i64,
    pub then: Vec<(i64, i64)>,
}

impl ResumePoint {
    /// Whether a run resuming here must keep a grid other than `own` while it replays.
    pub fn needs_replay_end(&self, own: i64) -> bool {
        self.window_ms > 0 && (self.window_ms != own || !self.then.is_empty())
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The windows of every partition this stage-2 process owns.
#[derive(Debug)]
pub struct Windows {
    window_ms: i64,
    partitions: HashMap<i32, PartitionState>,
    closed: Vec<ClosedWindow>,
}

impl Windows {
    pub fn new(window_ms: i64) -> Self {
        Self {
            window_ms,
            partitions: HashMap::new(),
            closed: Vec::new(),
        }
    }

    /// The window length this process cuts new windows with.
    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// Starts (or restarts) a partition at a committed resume point. `replay_to` is the
    /// partition's end offset now: up to there an earlier process may have applied windows
    /// it never committed, so a resume point on another grid keeps that grid until then.
    pub fn assign(&mut self, partition: i32, resume: Option<ResumePoint>, replay_to: i64) {
        let r = resume.unwrap_or(ResumePoint {
            offset: 0,
            clock_ms: 0,
            window_ms: 0,
            then: Vec::new(),
        });
        let grid = if r.needs_replay_end(self.window_ms) {
            let mut steps = vec![(i64::MIN, r.window_ms)];
            steps.extend(
                r.then
                    .iter()
                    .copied()
                    .filter(|(from, _)| *from > r.clock_ms),
            );
            Grid {
                steps,
                replay_to: Some(replay_to),
            }
        } else {
            Grid::default()
        };
        self.partitions.insert(
            partition,
            PartitionState {
                clock_ms: r.clock_ms,
                open: None,
                next_offset: r.offset,
                grid,
            },
        );
    }

    /// Forgets a revoked partition: its open window is rebuilt by the next owner.
    pub fn revoke(&mut self, partition: i32) {
        self.partitions.remove(&partition);
        self.closed.retain(|w| w.partition != partition);
    }

    pub fn owns(&self, partition: i32) -> bool {
        self.partitions.contains_key(&partition)
    }

    /// Feeds one record: a tick (`delta` = None) only moves the clock.
    pub fn observe(
        &mut self,
        partition: i32,
        offset: i64,
        timestamp_ms: i64,
        delta: Option<(&str, i64, i64, Weight)>,
    ) {
        let window_ms = self.window_ms;
        let p = self.partitions.entry(partition).or_default();
        p.clock_ms = p.clock_ms.max(timestamp_ms);
        if p.grid.replay_to.is_some_and(|end| offset >= end) {
            // Past anything an earlier process saw: switch at the next shared boundary.
            p.grid.switch_to(window_ms, p.clock_ms);
        }
        // Saturating: a log time near i64::MAX (a corrupt timestamp) must not panic.
        let (start_ms, end_ms) = p.window_at(p.clock_ms, window_ms);
        if let Some(open) = p.open.take_if(|o| o.start_ms < start_ms) {
            if !open.items.is_empty() {
                self.closed.push(ClosedWindow {
                    partition,
                    id: open.id,
                    end_ms: open.end_ms,
                    items: open.items,
                    records: open.records,
                    corrections: open.corrections,
                });
            }
        }
        let open = p.open.get_or_insert_with(|| Open {
            id: start_ms.div_euclid(end_ms.saturating_sub(start_ms).max(1)),
            start_ms,
            end_ms,
            first_offset: offset,
            items: HashMap::new(),
            records: 0,
            corrections: Vec::new(),
        });
        if let Some((item, d, event_time_ms, weight)) = delta {
            let e = open.items.entry(item.to_string()).or_insert(ItemDelta {
                delta: 0,
                event_time_ms,
                events: 0,
                event_time_sum_ms: 0,
            });
            e.delta += d;
            e.event_time_ms = e.event_time_ms.min(event_time_ms);
            e.events += weight.events;
            e.event_time_sum_ms +=
                i128::from(weight.mean_event_time_ms) * i128::from(weight.events);
            open.records += 1;
        }
        p.next_offset = offset + 1;
    }

    /// Feeds a correction: its window gets an entry for the item (so the fence sees the
    /// window), and the correction rides along for the sink to apply or refuse.
    pub fn observe_correction(
        &mut self,
        partition: i32,
        offset: i64,
        timestamp_ms: i64,
        item: &str,
        correction: Correction,
    ) {
        let none = Weight {
            events: 0,
            mean_event_time_ms: timestamp_ms,
        };
        self.observe(
            partition,
            offset,
            timestamp_ms,
            Some((item, 0, timestamp_ms, none)),
        );
        if let Some(open) = self
            .partitions
            .get_mut(&partition)
            .and_then(|p| p.open.as_mut())
        {
            open.corrections.push((item.to_string(), correction));
        }
    }

    /// Takes the windows closed since the last call.
    pub fn take_closed(&mut self) -> Vec<ClosedWindow> {
        std::mem::take(&mut self.closed)
    }

    /// Where each partition may be committed once every window taken so far is applied:
    /// the first record of its open window (with that window's start as the clock), or the
    /// next record when no window is open.
    pub fn resume_points(&self) -> Vec<(i32, ResumePoint)> {
        let mut v: Vec<(i32, ResumePoint)> = self
            .partitions
            .iter()
            .map(|(&partition, p)| {
                let point = match &p.open {
                    Some(o) => ResumePoint {
                        offset: o.first_offset,
                        clock_ms: o.start_ms,
                        window_ms: o.end_ms - o.start_ms,
                        then: p.grid.after(o.start_ms),
                    },
                    None => {
                        let (start, end) = p.window_at(p.clock_ms, self.window_ms);
                        ResumePoint {
                            offset: p.next_offset,
                            clock_ms: p.clock_ms,
                            window_ms: end - start,
                            then: p.grid.after(p.clock_ms),
                        }
                    }
                };
                (partition, point)
            })
            .collect();
        v.sort_by_key(|(p, _)| *p);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (offset, timestamp, item delta)
    type Rec = (i64, i64, Option<(&'static str, i64)>);

    fn feed(w: &mut Windows, recs: &[Rec]) -> Vec<ClosedWindow> {
        for &(o, ts, d) in recs {
            w.observe(0, o, ts, d.map(|(i, n)| (i, n, ts, Weight::one(ts))));
        }
        w.take_closed()
    }

    fn sums(closed: &[ClosedWindow]) -> Vec<(i64, &str, i64)> {
        let mut v: Vec<_> = closed
            .iter()
            .flat_map(|w| {
                w.items
                    .iter()
                    .map(move |(i, d)| (w.id, i.as_str(), d.delta))
            })
            .collect();
        v.sort();
        v
    }

    const LOG: &[Rec] = &[
        (0, 1000, Some(("a", 1))),
        (1, 1500, Some(("a", 2))),
        (2, 1400, Some(("b", -1))), // clock went backwards: stays in window 1
        (3, 2100, None),            // tick: closes window 1
        (4, 2200, Some(("a", 5))),
        (5, 3000, Some(("b", 1))), // closes window 2
        (6, 3100, None),
    ];

    #[test]
    fn windows_close_when_the_clock_passes_them() {
        let mut w = Windows::new(1000);
        w.assign(0, None, 0);
        let closed = feed(&mut w, LOG);
        assert_eq!(sums(&closed), vec![(1, "a", 3), (1, "b", -1), (2, "a", 5)]);
        assert_eq!(closed[0].end_ms, 2000);
        // Window 3 is open; resume at its first record with its start as the clock.
        assert_eq!(
            w.resume_points(),
            vec![(
                0,
                ResumePoint {
                    offset: 5,
                    clock_ms: 3000,
                    window_ms: 1000,
                    then: Vec::new(),
                }
            )]
        );
    }

    #[test]
    fn a_restart_at_the_resume_point_rebuilds_the_same_windows() {
        let mut w = Windows::new(1000);
        w.assign(0, None, 0);
        let mut all = feed(&mut w, &LOG[..5]); // crash after offset 4: window 2 open since the tick at 3
        let resume = w.resume_points()[0].1.clone();
        assert_eq!(
            resume,
            ResumePoint {
                offset: 3,
                clock_ms: 2000,
                window_ms: 1000,
                then: Vec::new(),
            }
        );
        let mut w2 = Windows::new(1000);
        let from = resume.offset as usize;
        w2.assign(0, Some(resume), 0);
        all.extend(feed(&mut w2, &LOG[from..]));
        let mut once = Windows::new(1000);
        once.assign(0, None, 0);
        assert_eq!(sums(&all), sums(&feed(&mut once, LOG)));
    }

    #[test]
    fn a_late_record_after_restart_joins_the_open_window() {
        // The record that opened window 2 is followed by one stamped in window 1's range.
        let log: &[Rec] = &[
            (0, 1900, Some(("a", 1))),
            (1, 2050, Some(("a", 1))),
            (2, 1990, Some(("a", 1))),
            (3, 3000, None),
        ];
        let mut w = Windows::new(1000);
        w.assign(0, None, 0);
        feed(&mut w, &log[..1]);
        let first = feed(&mut w, &log[1..2]);
        let resume = w.resume_points()[0].1.clone();
        let mut w2 = Windows::new(1000);
        w2.assign(0, Some(resume), 0);
        let replayed = feed(&mut w2, &log[1..]);
        assert_eq!(sums(&first), vec![(1, "a", 1)]);
        assert_eq!(sums(&replayed), vec![(2, "a", 2)]);
    }

    /// A kill between the sink's write and the offset commit, then a restart with another
    /// window length: the windows the killed run applied are rebuilt on their own grid (so
    /// the fence, comparing end times, skips them), and only from the first shared boundary
    /// does the new length apply. Every record lands in exactly one applied window.
    #[test]
    fn a_window_change_after_an_unclean_stop_keeps_the_old_grid_to_a_shared_boundary() {
        // One record every 100 ms from 10.0 s to 12.9 s, item "a", +1 each.
        let log: Vec<Rec> = (0..30)
            .map(|i| (i, 10_000 + i * 100, Some(("a", 1))))
            .collect();
        for (old, new) in [(250, 1000), (1000, 250), (400, 1000), (1000, 300)] {
            let mut w = Windows::new(old);
            w.assign(0, None, 0);
            // Run to 11.4 s: the windows closed by then (say) applied.
            let first = feed(&mut w, &log[..15]);
            let applied_to = first.iter().map(|c| c.end_ms).max().unwrap();
            // The kill: nothing committed since the start, so the restart replays from the
            // last commit, here the resume point before the first closed window.
            let resume = ResumePoint {
                offset: 0,
                clock_ms: 10_000,
                window_ms: old,
                then: Vec::new(),
            };
            let mut w2 = Windows::new(new);
            // The killed run had read up to offset 15.
            w2.assign(0, Some(resume), 15);
            let mut replayed = feed(&mut w2, &log);
            replayed.extend(feed(&mut w2, &[(30, 20_000, None)]));
            // The fence: a window at or below the row's last_window is skipped.
            let mut total: i64 = first.iter().map(|c| c.items["a"].delta).sum();
            let mut last = applied_to;
            for c in &replayed {
                if c.end_ms > last {
                    total += c.items["a"].delta;
                    last = c.end_ms;
                }
            }
            assert_eq!(total, 30, "{old} ms -> {new} ms: every record once");
            // And it resumes on the new grid once past the shared boundary.
            let p = w2.resume_points()[0].1.clone();
            assert_eq!(p.window_ms, new, "{old} -> {new}: {p:?}");
        }
    }

    /// Issue 43, item 8: a crash inside a window change's replay phase, after the switch to
    /// the new grid but before a commit past it, then a restart with either length (the change
    /// rolled back, or carried on). The commit made before the switch was on the old grid, yet
    /// the killed run applied new-grid windows after it: the next run must rebuild those on
    /// their own grid, or the fence lets a wider window that covers them through.
    #[test]
    fn a_crash_inside_a_window_changes_replay_then_any_length_counts_every_record_once() {
        // One record every 100 ms from 10.0 s to 19.9 s, item "a", +1 each.
        let log: Vec<Rec> = (0..100)
            .map(|i| (i, 10_000 + i * 100, Some(("a", 1))))
            .collect();
        let apply = |closed: &[ClosedWindow], last: &mut i64, total: &mut i64| {
            for c in closed {
                if c.end_ms > *last {
                    *total += c.items["a"].delta;
                    *last = c.end_ms;
                }
            }
        };
        for (first, second, third) in [(1000, 300, 1000), (1000, 300, 300), (250, 1000, 250)] {
            let (mut last, mut total) = (i64::MIN, 0);
            // The first run, on `first`, applied windows to 11.4 s and committed nothing.
            let mut w1 = Windows::new(first);
            w1.assign(0, None, 0);
            apply(&feed(&mut w1, &log[..15]), &mut last, &mut total);
            let commit1 = ResumePoint {
                offset: 0,
                clock_ms: 10_000,
                window_ms: first,
                then: Vec::new(),
            };
            // The second run, on `second`, replays to offset 15, commits at offset 17 (its
            // open window still on the old grid), runs on past the switch to 14.0 s applying
            // windows, and is killed before its next commit.
            let mut w2 = Windows::new(second);
            w2.assign(0, Some(commit1), 15);
            apply(&feed(&mut w2, &log[..17]), &mut last, &mut total);
            let (_, commit2) = w2.resume_points().remove(0);
            apply(&feed(&mut w2, &log[17..41]), &mut last, &mut total);
            // The third run, on `third`, from the second's commit; the second had read to 41.
            let mut w3 = Windows::new(third);
            let from = commit2.offset as usize;
            w3.assign(0, Some(commit2), 41);
            apply(&feed(&mut w3, &log[from..]), &mut last, &mut total);
            apply(
                &feed(&mut w3, &[(100, 30_000, None)]),
                &mut last,
                &mut total,
            );
            assert_eq!(
                total, 100,
                "{first} -> {second} (killed in its replay) -> {third}: every record once"
            );
            let p = w3.resume_points()[0].1.clone();
            assert_eq!(p.window_ms, third, "ends on its own grid: {p:?}");
            assert!(p.then.is_empty(), "{p:?}");
        }
    }

    /// Metadata without a window length (older versions): the current length, as before.
    #[test]
    fn a_resume_point_without_a_length_uses_the_current_one() {
        let mut w = Windows::new(1000);
        w.assign(
            0,
            Some(ResumePoint {
                offset: 0,
                clock_ms: 1000,
                window_ms: 0,
                then: Vec::new(),
            }),
            100,
        );
        let closed = feed(&mut w, LOG);
        assert_eq!(closed[0].end_ms, 2000);
    }
}
