//! A topic's partitions as the broker's metadata lists them, waited for.
//!
//! A topic just created (by `likes topics`, a test's own admin call, a stage's first run) is
//! in the controller's log before every broker's metadata cache holds it: a metadata answer
//! read once right after the create may not list it, or list it with an error and no
//! partitions. A test that took that answer as the truth passed or failed with the box's speed
//! (issue 60: `topics_snapshot` saw 0 of 4 topics on a fresh machine). So every read of a
//! topic's partitions in the tests waits, bounded, for the topic to be listed whole, and a
//! topic still missing at the bound is an error that names it.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

/// How long a topic may take to appear in the metadata after its create answered. Far above
/// what any broker here takes (milliseconds; seconds on a loaded box), far below a test's own
/// bound.
pub const METADATA_BOUND: Duration = Duration::from_secs(60);

/// The partition ids of `topic`, once the metadata lists it without error, with every
/// partition led (a partition whose leader is still being elected answers reads with
/// NotLeaderForPartition). Blocking: call it off an async runtime's worker (spawn_blocking).
pub fn partitions(client: &BaseConsumer, topic: &str, bound: Duration) -> Result<Vec<i32>, String> {
    partitions_after_misses(client, topic, bound, |_| {})
}

/// [`partitions`], calling `on_miss(n)` after the n-th answer (from 1) that did not list the
/// topic whole: a test holds the moment "the metadata does not list it yet" with it, by
/// creating the topic only after the first miss.
pub fn partitions_after_misses(
    client: &BaseConsumer,
    topic: &str,
    bound: Duration,
    mut on_miss: impl FnMut(usize),
) -> Result<Vec<i32>, String> {
    let deadline = Instant::now() + bound;
    let mut misses = 0;
    loop {
        let last = match listed(client, topic) {
            Ok(ids) => return Ok(ids),
            Err(why) => why,
        };
        misses += 1;
        on_miss(misses);
        if Instant::now() >= deadline {
            return Err(format!(
                "topic {topic} not in the broker's metadata after {bound:?}: {last}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Like [`partitions`] for several topics: each one's partition count, in the order given.
pub fn partition_counts(
    client: &BaseConsumer,
    topics: &[String],
    bound: Duration,
) -> Result<Vec<usize>, String> {
    let deadline = Instant::now() + bound;
    topics
        .iter()
        .map(|t| {
            let left = deadline.saturating_duration_since(Instant::now());
            partitions(client, t, left).map(|ids| ids.len())
        })
        .collect()
}

/// One metadata answer for `topic`: its partitions if listed whole, else why not.
fn listed(client: &BaseConsumer, topic: &str) -> Result<Vec<i32>, String> {
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| format!("metadata request: {e}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| "not listed".to_string())?;
    if let Some(e) = t.error() {
        return Err(format!("listed with error {e:?}"));
    }
    if t.partitions().is_empty() {
        return Err("listed with no partitions".into());
    }
    if let Some(p) = t
        .partitions()
        .iter()
        .find(|p| p.leader() < 0 || p.error().is_some())
    {
        return Err(format!("partition {} has no leader yet", p.id()));
    }
    let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    ids.sort_unstable();
    Ok(ids)
}
