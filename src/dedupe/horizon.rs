//! The horizon in force for one input partition, across a change of `dedupe_ttl`
//! (docs/exactness.md, "Past the horizon"; issue 43, hole 4).
//!
//! The past-horizon rule reads "nothing remembered, and the op is inside the horizon" as
//! "never counted". That holds only if state was kept for the whole current horizon. After a
//! raise from `old` to `new` at time `since`, state was kept for `old` before the raise and
//! is kept for `new` from then on, so at `now` it reaches back `old + (now - since)`, and no
//! further than `new`: that is the horizon the rule must use until it reaches `new`. A
//! lowered horizon keeps less, at once: the new one applies immediately.
//!
//! The horizon travels with each committed input offset, in the metadata stage 1 commits
//! (`h=<ms>`, and `from=<old ms>@<since ms>` while a raise is under way), so a restarted or
//! rebalanced stage 1 knows what the previous owner kept.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    /// The configured horizon (`dedupe_ttl`), ms.
    pub ttl_ms: i64,
    /// A raise under way: the horizon before it, and when it took effect (ms).
    pub raised: Option<(i64, i64)>,
}

impl Horizon {
    pub fn new(ttl_ms: i64) -> Self {
        Horizon {
            ttl_ms,
            raised: None,
        }
    }

    /// The horizon for a partition whose last commit recorded `recorded` (None: a commit by
    /// a version that did not record it; taken as the configured one, as it always was),
    /// now that `ttl_ms` is configured.
    pub fn resume(recorded: Option<Horizon>, ttl_ms: i64, now_ms: i64) -> Self {
        let Some(before) = recorded else {
            return Horizon::new(ttl_ms);
        };
        let kept = before.effective(now_ms);
        if ttl_ms > kept {
            Horizon {
                ttl_ms,
                raised: Some((kept, now_ms)),
            }
            .settled(now_ms)
        } else {
            Horizon::new(ttl_ms)
        }
    }

    /// How far back, at `now_ms`, forgotten state means "counted".
    pub fn effective(&self, now_ms: i64) -> i64 {
        match self.raised {
            None => self.ttl_ms,
            Some((old, since)) => self.ttl_ms.min(old.saturating_add((now_ms - since).max(0))),
        }
    }

    /// The same, without a raise that has run its course.
    pub fn settled(self, now_ms: i64) -> Self {
        if self.raised.is_some() && self.effective(now_ms) >= self.ttl_ms {
            Horizon::new(self.ttl_ms)
        } else {
            self
        }
    }

    /// From the horizon part of a commit's metadata (`h=<ms>[;from=<ms>@<ms>]`).
    pub fn from_metadata(text: &str) -> Option<Self> {
        let mut parts = text.split(';');
        let h = parts.next().and_then(|p| p.strip_prefix("h="));
        let from = parts.next().and_then(|p| p.strip_prefix("from="));
        Self::parse(h, from)
    }

    /// Reads the `h` and `from` parts of a commit's metadata.
    pub fn parse(h: Option<&str>, from: Option<&str>) -> Option<Self> {
        let ttl_ms = h?.parse().ok()?;
        let raised = from.and_then(|f| {
            let (old, since) = f.split_once('@')?;
            Some((old.parse().ok()?, since.parse().ok()?))
        });
        Some(Horizon { ttl_ms, raised })
    }
}

/// The metadata parts: `h=<ms>` and, during a raise, `;from=<old>@<since>`.
impl fmt::Display for Horizon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "h={}", self.ttl_ms)?;
        if let Some((old, since)) = self.raised {
            write!(f, ";from={old}@{since}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn a_raise_reaches_back_only_as_far_as_state_was_kept() {
        let h = Horizon::resume(Some(Horizon::new(2 * MIN)), 60 * MIN, 1_000 * MIN);
        assert_eq!(h.raised, Some((2 * MIN, 1_000 * MIN)));
        assert_eq!(h.effective(1_000 * MIN), 2 * MIN);
        assert_eq!(h.effective(1_010 * MIN), 12 * MIN);
        assert_eq!(h.effective(2_000 * MIN), 60 * MIN);
        assert_eq!(h.settled(1_010 * MIN), h);
        assert_eq!(h.settled(1_058 * MIN), Horizon::new(60 * MIN));
    }

    #[test]
    fn a_lowered_horizon_applies_at_once_and_an_unrecorded_one_is_the_configured() {
        let h = Horizon::resume(Some(Horizon::new(60 * MIN)), 2 * MIN, 5 * MIN);
        assert_eq!(h, Horizon::new(2 * MIN));
        assert_eq!(Horizon::resume(None, 7 * MIN, 5), Horizon::new(7 * MIN));
        // Lowered in the middle of a raise: below what was kept, so at once.
        let mid = Horizon::resume(Some(Horizon::new(2 * MIN)), 60 * MIN, 0);
        assert_eq!(
            Horizon::resume(Some(mid), 3 * MIN, 10 * MIN),
            Horizon::new(3 * MIN)
        );
        // Raised again in the middle of a raise: from what was kept by then.
        let again = Horizon::resume(Some(mid), 120 * MIN, 10 * MIN);
        assert_eq!(again.raised, Some((12 * MIN, 10 * MIN)));
    }

    #[test]
    fn the_metadata_round_trips() {
        for h in [
            Horizon::new(604_800_000),
            Horizon {
                ttl_ms: 3_600_000,
                raised: Some((120_000, 1_765_000_000_000)),
            },
        ] {
            let text = h.to_string();
            let mut parts = text.split(';');
            let hv = parts.next().and_then(|p| p.strip_prefix("h="));
            let from = parts.next().and_then(|p| p.strip_prefix("from="));
            assert_eq!(Horizon::parse(hv, from), Some(h));
        }
        assert_eq!(Horizon::parse(None, Some("1@2")), None);
    }
}
