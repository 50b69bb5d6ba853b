//! `likes replay`: resets a stage's consumer group to the start of its input, or to a time.
//!
//! Safe by construction: stage 1 emits nothing for input below each partition's
//! emitted-up-to offset (which this reset carries forward in the offsets' metadata, and the
//! changelog carries too), and stage 2's fence skips every window already applied, so
//! counts do not move. A stage-1 target older than the dedupe horizon is refused: state for
//! it no longer exists. It refuses while the group has live members (their next commit would
//! undo the reset), waiting first for as long as a stopped member may keep its place.

use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka;
use crate::kafka::group::{self, CountClock, DedupeOffset, Position};
use crate::runtime::clock::now_ms;
use crate::topology::Topology;

/// Where to reset to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Earliest,
    /// The first record at or after this time, Unix ms.
    Time(i64),
}

/// Per partition: (partition, new offset).
#[derive(Debug)]
pub struct ReplayReport {
    pub group: String,
    pub topic: String,
    pub offsets: Vec<(i32, i64)>,
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (p, o) in &self.offsets {
            writeln!(f, "group {} {}/{p}: offset {o}", self.group, self.topic)?;
        }
        write!(
            f,
            "reset {} partitions; start the stage again to replay",
            self.offsets.len()
        )
    }
}

/// Resets `group` (a stage group name as it exists on the cluster, with the prefix).
pub fn run(
    settings: &Settings,
    topology: &Topology,
    group: &str,
    target: Target,
) -> Result<ReplayReport> {
    let prefix = &settings.kafka.topic_prefix;
    let dedupe = format!("{prefix}{}", topology.groups.dedupe);
    let count = format!("{prefix}{}", topology.groups.count);
    let (topic, is_count) = if group == dedupe {
        (settings.topic(&topology.topics.events.name), false)
    } else if group == count {
        (settings.topic(&topology.topics.deltas.name), true)
    } else {
        return Err(Error::Input(format!(
            "unknown group {group:?}: the stage groups are {dedupe:?} and {count:?}"
        )));
    };
    let timeout = settings.kafka.request_timeout;
    let consumer: BaseConsumer = kafka::client_config(&settings.kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut offsets = Vec::new();
    for e in kafka::offsets::extents(&consumer, &topic, timeout)? {
        let offset = match target {
            Target::Earliest => e.low,
            // Nothing at or after that time: the end.
            Target::Time(ms) => {
                kafka::offsets::at_time(&consumer, &topic, &[e.partition], ms, timeout)?[0]
                    .1
                    .unwrap_or(e.high)
            }
        };
        offsets.push((e.partition, offset));
    }
    let parts: Vec<i32> = offsets.iter().map(|&(p, _)| p).collect();
    let committed = group::committed(&consumer, &topic, &parts, timeout)?;
    refuse_skips(&committed, group, &topic, &offsets)?;
    if !is_count {
        refuse_past_horizon(&consumer, topology, &topic, &offsets, target, timeout)?;
    }

    let token = DedupeOffset::reset_token();
    let positions: Vec<(i32, i64, String)> = offsets
        .iter()
        .zip(&committed)
        .map(|(&(p, o), old)| {
            let metadata = if is_count {
                // Stage 2 restarts its window clock from the records themselves.
                CountClock::default().metadata()
            } else {
                // Everything below the old position was emitted: the reset rewinds the
                // input, never the history.
                let was = DedupeOffset::of(old);
                let emitted = was.emitted.unwrap_or(0).max(old.offset.unwrap_or(0));
                was.reset_metadata(emitted, &token)
            };
            (p, o, metadata)
        })
        .collect();
    // A live member's next commit would undo the reset.
    group::wait_until_empty(
        &settings.kafka,
        group,
        "stop every process of the stage before a replay",
    )?;
    // The broker refuses a commit from outside a group that has members: one that joined
    // since the check is refused here too. A coordinator moving or loading is waited out.
    let patience = settings.kafka.session_timeout + Duration::from_secs(5);
    let started = std::time::Instant::now();
    loop {
        match group::commit(&consumer, &topic, &positions) {
            Ok(()) => break,
            Err(e) if e.is_retryable() && started.elapsed() < patience => {
                info!(%group, error = %e, "the group's coordinator is away; committing the reset again");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) => {
                return Err(Error::Refused(format!(
                    "group {group} refused the reset ({e}): a member joined it. Stop every \
                     process of the stage and run the replay again"
                )))
            }
        }
    }
    info!(%group, %topic, partitions = offsets.len(), ?target, "group offsets reset");
    // Give the broker a moment so a stage started right after sees the new offsets.
    std::thread::sleep(Duration::from_millis(100));
    Ok(ReplayReport {
        group: group.to_string(),
        topic,
        offsets,
    })
}

/// Stage 1 keeps state for `dedupe_ttl`: a replay that starts at records older than that
/// would meet flips it no longer remembers. Refused, naming the oldest time that is safe.
fn refuse_past_horizon(
    consumer: &BaseConsumer,
    topology: &Topology,
    topic: &str,
    offsets: &[(i32, i64)],
    target: Target,
    timeout: Duration,
) -> Result<()> {
    // A margin, so the replay's first records are not crossing the horizon as it starts.
    let ttl = topology.dedupe_ttl.as_millis() as i64;
    let floor = now_ms() - ttl + (ttl / 10).min(60_000);
    let safe = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(floor.max(0) as u64 + 1000),
    );
    let explain = |what: String| {
        Error::Refused(format!(
            "refusing to replay stage 1 from records older than the dedupe horizon \
             (dedupe_ttl = {:?}): its state for them no longer exists. {what}. Replay from \
             within the horizon instead, e.g. --to-time {safe}",
            topology.dedupe_ttl
        ))
    };
    if let Target::Time(ms) = target {
        if ms < floor {
            return Err(explain(format!("--to-time {ms} is before {safe}")));
        }
        return Ok(());
    }
    let parts: Vec<i32> = offsets.iter().map(|&(p, _)| p).collect();
    let found = kafka::offsets::at_time(consumer, topic, &parts, floor, timeout)?;
    let mut old = Vec::new();
    for (&(p, to), &(_, at)) in offsets.iter().zip(&found) {
        let first_safe = match at {
            Some(o) => o,
            // No record at or after the floor: every record is older.
            None => kafka::offsets::extent(consumer, topic, p, timeout)?.high,
        };
        if first_safe > to {
            old.push(format!("{topic}/{p}: {} records", first_safe - to));
        }
    }
    if old.is_empty() {
        return Ok(());
    }
    Err(explain(format!(
        "The earliest records are older: {}",
        old.join(", ")
    )))
}

/// [`run`], after the checks that need the keyspace: a count-group replay must not cross a
/// window change its window length does not divide (see `crate::store::recorded`).
pub async fn run_checked(
    settings: &Settings,
    topology: &Topology,
    group: &str,
    target: Target,
) -> Result<ReplayReport> {
    let count = settings.group(&topology.groups.count);
    if group == count {
        let session = crate::cql::connect(&settings.cql).await?;
        let from = match target {
            Target::Earliest => 0,
            Target::Time(ms) => ms,
        };
        crate::store::recorded::check_count_replay(
            &session,
            &settings.cql.keyspace,
            topology,
            from,
        )
        .await?;
    }
    tokio::task::block_in_place(|| run(settings, topology, group, target))
}

/// A replay only moves a group back. Moving it past its committed offset would skip records
/// the stage never read: likes that would never be counted.
fn refuse_skips(
    committed: &[Position],
    group: &str,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Result<()> {
    let skips: Vec<String> = offsets
        .iter()
        .zip(committed)
        .filter_map(|(&(p, to), c)| {
            // Never committed: the stage starts from the earliest record.
            let at = c.offset.unwrap_or(0);
            (to > at).then(|| format!("{topic}/{p}: {} records ({at}..{to})", to - at))
        })
        .collect();
    if skips.is_empty() {
        return Ok(());
    }
    Err(Error::Refused(format!(
        "refusing to move group {group} forward past records it has not read; a replay only \
         moves back (pick an earlier --to-time). Would skip: {}",
        skips.join(", ")
    )))
}

/// Parses `--to-time`: Unix milliseconds or RFC 3339 (`2026-11-29T12:00:00Z`).
pub fn parse_time(s: &str) -> Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
        .map_err(|e| Error::Input(format!("--to-time {s:?}: {e} (use Unix ms or RFC 3339)")))
        .map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
        })
}

/// Reset a stage's consumer group to replay its input; counts do not move.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The group, as on the cluster (with the topic prefix), e.g. likes-count.
    #[arg(long)]
    pub group: String,
    /// Replay the whole retained input.
    #[arg(long, conflicts_with = "to_time", required_unless_present = "to_time")]
    pub to_earliest: bool,
    /// Replay from the first record at or after this time (Unix ms or RFC 3339).
    #[arg(long, value_parser = |s: &str| parse_time(s).map_err(|e| e.to_string()))]
    pub to_time: Option<i64>,
}

/// `likes replay`.
pub async fn command(args: Args, ctx: &super::Ctx) -> Result<super::Done> {
    let target = args.to_time.map_or(Target::Earliest, Target::Time);
    let report = run_checked(&ctx.settings, &ctx.topology, &args.group, target).await?;
    Ok(super::Done::report(report))
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_parse() {
        assert_eq!(
            super::parse_time("1700000000000").unwrap(),
            1_700_000_000_000
        );
        assert_eq!(
            super::parse_time("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        assert!(super::parse_time("yesterday").is_err());
    }
}
