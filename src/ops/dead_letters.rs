//! The recount queue: `likes.dlq` read as a list of items to recount (issue 23, items 1 and
//! 6). Stage 1 dead-letters a flip it cannot count (undecodable, invalid, older than the
//! horizon with no state left) and sends a recount record for a flip it counted on a guessed
//! baseline; either way the item's count may be off until it is recounted at a cut.
//! `likes reconcile --dead-letters` reads the queue from the recount group's committed
//! position to the log's end, reconciles those items, and only when every one of them is
//! settled commits that end: a killed or failed run leaves the queue where it was and the
//! next run recounts the same items again (a recount is idempotent: the correction fence).
//! `likes drift --dead-letters` reads the same items without committing anything.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::cut::Pipeline;
use crate::error::{Error, Result};
use crate::kafka::group;
use crate::schema::v1::LikeEvent;

/// The items the queue names, and where it ends.
#[derive(Debug, Default)]
pub struct Queued {
    pub items: Vec<String>,
    /// Records read.
    pub records: u64,
    /// Records that name no item (neither an `item#bucket` key nor a decodable event): they
    /// are counted and logged, and stay on the topic for a person to look at.
    pub unattributed: u64,
    /// Partition → the offset to commit once every item is settled.
    ends: HashMap<i32, i64>,
}

/// The item a dead letter is about. Stage 2's (an unusable `likes.deltas` record) keeps its
/// key, the item itself; stage 1's keeps `item#bucket`, else its value may decode as a
/// LikeEvent.
pub fn item_of_record(
    from_deltas: bool,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
) -> Option<String> {
    if from_deltas {
        return key
            .and_then(|k| std::str::from_utf8(k).ok())
            .filter(|k| !k.is_empty())
            .map(str::to_string);
    }
    item_of(key, payload)
}

/// The item of one of stage 1's dead letters: from its key (`item#bucket`, kept verbatim),
/// else from its value when that decodes as a LikeEvent.
pub fn item_of(key: Option<&[u8]>, payload: Option<&[u8]>) -> Option<String> {
    if let Some(item) = key
        .and_then(|k| std::str::from_utf8(k).ok())
        .and_then(|k| k.rsplit_once('#'))
        .map(|(item, _)| item)
        .filter(|item| !item.is_empty())
    {
        return Some(item.to_string());
    }
    let event = LikeEvent::decode(payload?).ok()?;
    (!event.item_id.is_empty()).then_some(event.item_id)
}

fn consumer(p: &Pipeline) -> Result<BaseConsumer> {
    Ok(crate::kafka::client_config(&p.settings.kafka)
        .set("group.id", p.settings.group(&p.topology.groups.recount))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()?)
}

/// Reads the queue: every record from the recount group's position to the current end.
pub fn read(p: &Pipeline) -> Result<Queued> {
    let topic = p.settings.topic(&p.topology.topics.dlq.name);
    let deltas = p.settings.topic(&p.topology.topics.deltas.name);
    let ends = p.ends(&topic)?;
    let c = consumer(p)?;
    let timeout = p.settings.kafka.request_timeout;
    let parts: Vec<i32> = ends.iter().map(|&(part, _, _)| part).collect();
    let committed: HashMap<i32, Option<i64>> =
        tokio::task::block_in_place(|| group::committed(&c, &topic, &parts, timeout))?
            .into_iter()
            .map(|p| (p.partition, p.offset))
            .collect();
    let mut q = Queued::default();
    let mut items = BTreeSet::new();
    for &(part, low, high) in &ends {
        let from = committed
            .get(&part)
            .copied()
            .flatten()
            .map_or(low, |o| o.max(low));
        q.ends.insert(part, high);
        if from >= high {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, part, Offset::Offset(from))?;
        c.assign(&tpl)?;
        let deadline = Instant::now() + timeout * 4;
        tokio::task::block_in_place(|| -> Result<()> {
            loop {
                match c.poll(Duration::from_millis(500)) {
                    Some(Ok(m)) => {
                        q.records += 1;
                        let from_deltas = m.headers().is_some_and(|h| {
                            h.iter().any(|x| {
                                x.key == "likes.source.topic" && x.value == Some(deltas.as_bytes())
                            })
                        });
                        match item_of_record(from_deltas, m.key(), m.payload()) {
                            Some(item) => {
                                items.insert(item);
                            }
                            None => {
                                q.unattributed += 1;
                                warn!(
                                    partition = part,
                                    offset = m.offset(),
                                    "dead letter names no item; left for a person to look at"
                                );
                            }
                        }
                        if m.offset() + 1 >= high {
                            return Ok(());
                        }
                    }
                    Some(Err(e)) => {
                        let e = Error::from(e);
                        if !e.is_retryable() {
                            return Err(e);
                        }
                        warn!(error = %e, "reading {topic}: the broker is away; waiting");
                    }
                    None => {
                        // Transaction markers take offsets too: the end may hold no record.
                        let at = c
                            .position()?
                            .find_partition(&topic, part)
                            .map(|e| e.offset());
                        if matches!(at, Some(Offset::Offset(o)) if o >= high) {
                            return Ok(());
                        }
                        if Instant::now() > deadline {
                            return Err(Error::Timeout(
                                timeout * 4,
                                format!("reading {topic} partition {part} up to offset {high}"),
                            ));
                        }
                    }
                }
            }
        })?;
        c.unassign()?;
    }
    q.items = items.into_iter().collect();
    info!(
        records = q.records,
        items = q.items.len(),
        unattributed = q.unattributed,
        "recount queue read"
    );
    Ok(q)
}

/// Marks the queue drained up to where [`read`] found its end.
pub fn drained(p: &Pipeline, q: &Queued) -> Result<()> {
    let topic = p.settings.topic(&p.topology.topics.dlq.name);
    let positions: Vec<(i32, i64, String)> = q
        .ends
        .iter()
        .map(|(&part, &end)| (part, end, String::new()))
        .collect();
    if positions.is_empty() {
        return Ok(());
    }
    let c = consumer(p)?;
    tokio::task::block_in_place(|| group::commit(&c, &topic, &positions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_names_its_item_by_key_or_by_value() {
        assert_eq!(item_of(Some(b"item-7#12"), None).as_deref(), Some("item-7"));
        assert_eq!(item_of(Some(b"a#b#3"), None).as_deref(), Some("a#b"));
        let event = LikeEvent {
            item_id: "item-9".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(item_of(None, Some(&event)).as_deref(), Some("item-9"));
        assert_eq!(item_of(Some(b"no-bucket"), Some(&[0xff, 0xff])), None);
        assert_eq!(item_of(None, None), None);
        // Stage 2's dead letters keep the item as the key.
        assert_eq!(
            item_of_record(true, Some(b"item-3"), Some(&[0xff])).as_deref(),
            Some("item-3")
        );
    }
}
