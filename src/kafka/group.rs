//! Consumer groups as the stages and the operations jobs share them: committed positions read
//! and written with their metadata, the two stages' metadata formats as typed values, and
//! waiting for a group to have no members. The stages write these positions; `likes replay`,
//! `likes rebuild`, the cut and the recount queue read or move them, so the formats live
//! here, in neither.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};
use tracing::info;

use crate::config::KafkaSettings;
use crate::error::{Error, Result};

/// A partition's committed position in a group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub partition: i32,
    /// None when the group never committed this partition.
    pub offset: Option<i64>,
    pub metadata: String,
}

/// The group's committed positions of `partitions` of `topic` (the consumer's `group.id`).
pub fn committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<Position>> {
    let mut ask = TopicPartitionList::new();
    for &p in partitions {
        ask.add_partition(topic, p);
    }
    let got = consumer.committed_offsets(ask, timeout)?;
    Ok(partitions
        .iter()
        .map(|&p| {
            let e = got.find_partition(topic, p);
            Position {
                partition: p,
                offset: match e.as_ref().map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                },
                metadata: e.map(|e| e.metadata().to_string()).unwrap_or_default(),
            }
        })
        .collect())
}

/// Commits `(partition, offset, metadata)` for `topic` in the consumer's group, synchronously.
pub fn commit<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    positions: &[(i32, i64, String)],
) -> Result<()> {
    consumer.commit(&positions_list(topic, positions)?, CommitMode::Sync)?;
    Ok(())
}

/// Adds `(partition, offset, metadata)` of `topic` to the producer's open transaction (stage
/// 1's exactly-once commit: the positions commit with the records or not at all).
pub fn send_in_transaction<C: rdkafka::producer::ProducerContext>(
    producer: &rdkafka::producer::BaseProducer<C>,
    group: &rdkafka::consumer::ConsumerGroupMetadata,
    topic: &str,
    positions: &[(i32, i64, String)],
    timeout: Duration,
) -> Result<()> {
    use rdkafka::producer::Producer;
    producer.send_offsets_to_transaction(&positions_list(topic, positions)?, group, timeout)?;
    Ok(())
}

/// The offsets list of a commit.
fn positions_list(topic: &str, positions: &[(i32, i64, String)]) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (p, offset, metadata) in positions {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*offset))?;
        if let Some(mut e) = tpl.find_partition(topic, *p) {
            e.set_metadata(metadata.clone());
        }
    }
    Ok(tpl)
}

/// Waits until `group` has no members, for as long as a stopped one may still hold its place
/// (the stages are static members: a stopped or killed one stays until its session times
/// out). A group that keeps members is refused: `stop_first` tells the operator what to stop.
/// Blocks.
pub fn wait_until_empty(settings: &KafkaSettings, group: &str, stop_first: &str) -> Result<()> {
    let c: BaseConsumer = super::client_config(settings).create()?;
    let patience = settings.session_timeout + Duration::from_secs(5);
    let started = Instant::now();
    loop {
        // A coordinator moving or loading is waited out like a member leaving.
        let live: usize = match c.fetch_group_list(Some(group), settings.request_timeout) {
            Ok(list) => list.groups().iter().map(|g| g.members().len()).sum(),
            Err(e) => {
                let e = Error::from(e);
                if !e.is_retryable() || started.elapsed() > patience {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if live == 0 {
            return Ok(());
        }
        if started.elapsed() > patience {
            return Err(Error::Refused(format!(
                "group {group} still has live members ({live}): {stop_first}; a stopped or \
                 killed member leaves the group after kafka.session_timeout ({:?})",
                settings.session_timeout
            )));
        }
        if started.elapsed().as_secs().is_multiple_of(5) {
            info!(%group, live, waited = ?Duration::from_secs(started.elapsed().as_secs()),
                "waiting for the group to have no members");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Stage 1's position of a partition (`emitted=<E>;txn=<token>[;was=<token>]` on the offset;
/// docs/exactness.md and dedupe/recovery.rs say how a start uses it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DedupeOffset {
    /// None when the group never committed this partition.
    pub offset: Option<i64>,
    /// Deltas were emitted below this offset (None: not recorded, e.g. an outside reset).
    pub emitted: Option<i64>,
    /// The transaction that committed it (None: not a stage-1 commit).
    pub token: Option<String>,
    /// Set by `likes replay`: the transaction that committed the position the reset moved
    /// away from. A local state written by that transaction is exactly the changelog's
    /// history, which a reset never rewinds.
    pub was: Option<String>,
    /// The dedupe horizon in force for the partition at that commit, as stage 1 wrote it
    /// (`h=<ms>[;from=<ms>@<ms>]`, dedupe/horizon.rs); None before it was recorded.
    pub horizon: Option<String>,
}

/// The token prefix of a position `likes replay` committed (no transaction wrote it).
const RESET: &str = "reset-";

impl DedupeOffset {
    /// The metadata stage 1 commits with each input offset; `horizon` is the partition's
    /// (dedupe/horizon.rs), empty for none.
    pub fn metadata(emitted: i64, token: &str, horizon: &str) -> String {
        if horizon.is_empty() {
            format!("emitted={emitted};txn={token}")
        } else {
            format!("emitted={emitted};txn={token};{horizon}")
        }
    }

    /// A fresh token for a `likes replay` reset.
    pub fn reset_token() -> String {
        format!("{RESET}{:016x}", rand::random::<u64>())
    }

    /// The metadata `likes replay` commits over this position: [`DedupeOffset::metadata`]
    /// with its own token, and the transaction whose state the history ends with (`was=`):
    /// the one that committed this position, or, when this was itself a reset nothing
    /// committed after, the one that reset named.
    pub fn reset_metadata(&self, emitted: i64, token: &str) -> String {
        let history = match &self.token {
            Some(t) if t.starts_with(RESET) => self.was.as_deref(),
            t => t.as_deref(),
        };
        // The horizon in force stays with the position: a reset rewinds the input, not what
        // state was kept.
        let horizon = self.horizon.as_deref().unwrap_or("");
        match history {
            Some(w) if horizon.is_empty() => format!("emitted={emitted};txn={token};was={w}"),
            Some(w) => format!("emitted={emitted};txn={token};was={w};{horizon}"),
            None => Self::metadata(emitted, token, horizon),
        }
    }

    /// From a committed offset and its metadata (parts it does not know are ignored).
    pub fn parse(offset: Option<i64>, metadata: &str) -> Self {
        let mut c = DedupeOffset {
            offset,
            ..Default::default()
        };
        for part in metadata.split(';') {
            match part.split_once('=') {
                Some(("emitted", v)) => c.emitted = v.parse().ok(),
                Some(("txn", v)) if !v.is_empty() => c.token = Some(v.to_string()),
                Some(("was", v)) if !v.is_empty() => c.was = Some(v.to_string()),
                Some(("h", v)) => c.horizon = Some(format!("h={v}")),
                Some(("from", v)) => {
                    if let Some(h) = &mut c.horizon {
                        h.push_str(&format!(";from={v}"));
                    }
                }
                _ => {}
            }
        }
        c
    }

    pub fn of(p: &Position) -> Self {
        Self::parse(p.offset, &p.metadata)
    }
}

/// Stage 2's position metadata: the partition's window clock, the length of the window it
/// starts (`clock=<ms>;window=<ms>`; a length of 0 is left out, for a position on no grid),
/// and, while a window change is under way, the lengths in force after it
/// (`;then=<from_ms>:<len>,...`): windows past the position may already be applied on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CountClock {
    pub clock_ms: i64,
    /// 0 when the metadata does not say (written by older versions, or by a replay).
    pub window_ms: i64,
    pub then: Vec<(i64, i64)>,
}

impl CountClock {
    pub fn metadata(&self) -> String {
        let mut m = format!("clock={}", self.clock_ms);
        if self.window_ms > 0 {
            m.push_str(&format!(";window={}", self.window_ms));
            if !self.then.is_empty() {
                let steps: Vec<String> = self
                    .then
                    .iter()
                    .map(|(from, len)| format!("{from}:{len}"))
                    .collect();
                m.push_str(&format!(";then={}", steps.join(",")));
            }
        }
        m
    }

    /// None when the metadata is not stage 2's.
    pub fn parse(metadata: &str) -> Option<Self> {
        let rest = metadata.strip_prefix("clock=")?;
        let (rest, then) = match rest.split_once(";then=") {
            Some((r, t)) => {
                let steps = t
                    .split(',')
                    .map(|s| {
                        let (from, len) = s.split_once(':')?;
                        Some((from.parse().ok()?, len.parse().ok()?))
                    })
                    .collect::<Option<Vec<(i64, i64)>>>()?;
                (r, steps)
            }
            None => (rest, Vec::new()),
        };
        let (clock, window) = match rest.split_once(";window=") {
            Some((c, w)) => (c, w.parse().ok()?),
            None => (rest, 0),
        };
        Some(Self {
            clock_ms: clock.parse().ok()?,
            window_ms: window,
            then,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_clock_round_trips_with_a_change_under_way() {
        for c in [
            CountClock::default(),
            CountClock {
                clock_ms: 11_000,
                window_ms: 1000,
                then: Vec::new(),
            },
            CountClock {
                clock_ms: 11_000,
                window_ms: 1000,
                then: vec![(12_000, 300), (15_000, 500)],
            },
        ] {
            assert_eq!(CountClock::parse(&c.metadata()), Some(c.clone()));
        }
        assert_eq!(CountClock::parse("clock=5;window=9;then=x"), None);
    }

    #[test]
    fn dedupe_metadata_round_trips_and_tolerates_strangers() {
        let c = DedupeOffset::parse(Some(7), &DedupeOffset::metadata(42, "abc", ""));
        assert_eq!(c.offset, Some(7));
        let h = DedupeOffset::parse(Some(7), &DedupeOffset::metadata(42, "abc", "h=5;from=2@9"));
        assert_eq!(
            (h.token.as_deref(), h.horizon.as_deref()),
            (Some("abc"), Some("h=5;from=2@9"))
        );
        let reset = DedupeOffset::parse(Some(0), &h.reset_metadata(42, "reset-1"));
        assert_eq!(
            (reset.was.as_deref(), reset.horizon.as_deref()),
            (Some("abc"), Some("h=5;from=2@9")),
            "a reset keeps the horizon"
        );
        assert_eq!((c.emitted, c.token.as_deref()), (Some(42), Some("abc")));
        let outside = DedupeOffset::parse(Some(0), "");
        assert_eq!((outside.emitted, outside.token), (None, None));
        let old = DedupeOffset::parse(Some(3), "clock=5");
        assert_eq!((old.emitted, old.token), (None, None));
    }

    #[test]
    fn a_reset_names_the_history_it_keeps_even_over_another_reset() {
        let c = DedupeOffset::parse(Some(7), &DedupeOffset::metadata(42, "abc", ""));
        let reset = DedupeOffset::parse(Some(0), &c.reset_metadata(42, "reset-1"));
        assert_eq!(
            (reset.emitted, reset.token.as_deref(), reset.was.as_deref()),
            (Some(42), Some("reset-1"), Some("abc"))
        );
        let again = DedupeOffset::parse(Some(0), &reset.reset_metadata(42, "reset-2"));
        assert_eq!(
            (again.token.as_deref(), again.was.as_deref()),
            (Some("reset-2"), Some("abc"))
        );
    }

    #[test]
    fn count_clock_round_trips() {
        let c = CountClock {
            clock_ms: 123_000,
            window_ms: 250,
            then: Vec::new(),
        };
        assert_eq!(CountClock::parse(&c.metadata()), Some(c.clone()));
        // Written by versions before the window length was recorded.
        assert_eq!(
            CountClock::parse("clock=5"),
            Some(CountClock {
                clock_ms: 5,
                window_ms: 0,
                then: Vec::new(),
            })
        );
        // A replay's position: on no grid, the length left out.
        let replay = CountClock::default();
        assert_eq!(replay.metadata(), "clock=0");
        assert_eq!(CountClock::parse(&replay.metadata()), Some(replay));
        assert_eq!(CountClock::parse(""), None);
    }
}
