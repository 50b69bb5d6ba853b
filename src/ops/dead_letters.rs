//! The recount queue: `likes.dlq` read as a list of items to recount (issue 23, items 1 and
//! 6). Stage 1 dead-letters a flip it cannot count (undecodable, invalid, older than the
//! horizon with no state left) and sends a recount record for a flip it counted on a guessed
//! baseline; either way the item's count may be off until it is recounted at a cut.
//! `likes reconcile --dead-letters` ([`recount`]) reads the queue from the recount group's
//! committed position to the log's end, reconciles the items this region homes, puts back on
//! the queue every item it could not settle (in flight at every cut, or its range closed by a
//! move under way), and only then commits that end: the queue moves on every run, and no item
//! leaves it unsettled (issue 43, hole 3: one item that kept flipping held the whole queue
//! until retention took it). Records that retention deleted before a run read them are
//! counted and logged ([`Queued::lost`]); items another region homes are left to it (its
//! move's recount covers what this region's queue named). `likes drift --dead-letters` reads
//! the same items without committing anything.

use std::collections::{BTreeSet, HashMap};

use rdkafka::consumer::BaseConsumer;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::{info, warn};

use super::cut::Pipeline;
use super::reconcile::correct::ReconcileReport;
use crate::error::Result;
use crate::kafka::group;
use crate::kafka::offsets::{self, Extent};
use crate::region::Route;
use crate::runtime::clock::now_ms;

/// The reason a requeued record carries (`likes.error`).
pub const REQUEUED: &str = "requeued by likes reconcile --dead-letters: not settled at any cut";

/// The items the queue names, and where it ends.
#[derive(Debug, Default)]
pub struct Queued {
    pub items: Vec<String>,
    /// Records read.
    pub records: u64,
    /// Records that name no item (neither an `item#bucket` key nor a decodable event): they
    /// are counted and logged, and stay on the topic for a person to look at.
    pub unattributed: u64,
    /// Records retention deleted before any run read them (the group's position was below
    /// the log's start): their items were never recounted by the queue.
    pub lost: u64,
    /// Items named here that another region homes: its pipeline counts them.
    pub elsewhere: Vec<String>,
    /// Items whose range is closed by a move under way: put back on the queue.
    pub closed: Vec<String>,
    /// The latest event time among the records that carry a flip to recount (ms): the
    /// recount's cut is after it (issue 43, item 8: a writer's clock ahead could put a flip
    /// past the cut). Never past now plus twice the clock bound ([`cut_floor`]).
    pub latest_event_ms: i64,
    /// Records whose event time lay past now plus twice the clock bound, taken at that bound
    /// for the cut (issue 56: one such record set a cut no run could reach).
    pub clamped: u64,
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
    let event = crate::records::decode_event(payload).ok()?;
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
    let parts: Vec<i32> = ends.iter().map(|e| e.partition).collect();
    let committed: HashMap<i32, Option<i64>> =
        tokio::task::block_in_place(|| group::committed(&c, &topic, &parts, timeout))?
            .into_iter()
            .map(|p| (p.partition, p.offset))
            .collect();
    let mut q = Queued::default();
    let mut items = BTreeSet::new();
    let skew_ms = p.settings.cql.max_clock_skew.as_millis() as i64;
    for &Extent {
        partition: part,
        low,
        high,
    } in &ends
    {
        let position = committed.get(&part).copied().flatten();
        if let Some(at) = position.filter(|&at| at < low) {
            // Never silent: these records' items were not recounted by the queue.
            q.lost += (low - at) as u64;
            warn!(
                partition = part,
                position = at,
                log_start = low,
                lost = low - at,
                "the recount queue lost records to retention before a run read them; run `likes drift --all` and reconcile what it names"
            );
        }
        let from = position.map_or(low, |o| o.max(low));
        q.ends.insert(part, high);
        tokio::task::block_in_place(|| {
            offsets::read_range(&c, &topic, part, from, high, timeout, |m| {
                q.records += 1;
                let from_deltas = m.headers().is_some_and(|h| {
                    h.iter().any(|x| {
                        x.key == "likes.source.topic" && x.value == Some(deltas.as_bytes())
                    })
                });
                let kind = m.headers().and_then(|h| {
                    h.iter()
                        .find(|x| x.key == "likes.kind")
                        .and_then(|x| x.value)
                        .and_then(|v| std::str::from_utf8(v).ok())
                });
                if !from_deltas {
                    if let Ok(e) = crate::records::decode_event(m.payload()) {
                        let floor = cut_floor(kind, e.event_time_ms, now_ms(), skew_ms);
                        if let Some((at, clamped)) = floor {
                            q.latest_event_ms = q.latest_event_ms.max(at);
                            if clamped {
                                q.clamped += 1;
                                warn!(
                                    partition = part,
                                    offset = m.offset(),
                                    event_time_ms = e.event_time_ms,
                                    "a dead letter's event time is past every clock the system admits; its cut is taken at now plus twice cql.max_clock_skew"
                                );
                            }
                        }
                    }
                }
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
                Ok(true)
            })
        })?;
    }
    sort_by_home(
        items,
        |item| p.routes.as_ref().map(|r| r.route(item)),
        &mut q,
    );
    info!(
        records = q.records,
        items = q.items.len(),
        unattributed = q.unattributed,
        lost = q.lost,
        elsewhere = q.elsewhere.len(),
        closed = q.closed.len(),
        "recount queue read"
    );
    Ok(q)
}

/// This region recounts the items it homes; another's are its own (an item whose range moved
/// away since its record was written); a range closed by a move under way is recounted once
/// it has settled (put back on the queue). Before, every item was recounted here, and one
/// moved item failed every run (issue 43, hole 3).
fn sort_by_home(
    items: impl IntoIterator<Item = String>,
    route: impl Fn(&str) -> Option<Route>,
    q: &mut Queued,
) {
    for item in items {
        match route(&item) {
            None | Some(Route::Here(_)) => q.items.push(item),
            Some(Route::Elsewhere { .. }) => q.elsewhere.push(item),
            Some(Route::Closed(_)) => q.closed.push(item),
        }
    }
}

/// What a dead letter's event time asks of the recount's cut: None for a kind that needs
/// no recount at the event's time (`invalid`: a writer's bad record, whose time may be
/// anything, microseconds for milliseconds say); else the time the cut must follow, and
/// whether it was clamped to `now` plus twice the clock bound (every process is within
/// `cql.max_clock_skew` of the database, so no real flip is stamped later than that; a time
/// past it would set a cut no run reaches, and every run would time out). A record without
/// a kind (written before `likes.kind`) counts as one to recount.
pub fn cut_floor(
    kind: Option<&str>,
    event_time_ms: i64,
    now_ms: i64,
    skew_ms: i64,
) -> Option<(i64, bool)> {
    if kind == Some("invalid") {
        return None;
    }
    let bound = now_ms.saturating_add(2 * skew_ms);
    Some(if event_time_ms > bound {
        (bound, true)
    } else {
        (event_time_ms, false)
    })
}

/// Puts `items` back on the queue, after the end [`read`] found: the next run recounts them.
pub async fn requeue(p: &Pipeline, items: &[String]) -> Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    let topic = p.settings.topic(&p.topology.topics.dlq.name);
    let producer: FutureProducer = crate::kafka::producer_config(&p.settings.kafka).create()?;
    for item in items {
        // Keyed as stage 1's are (`item#…`), so `item_of` reads it back.
        let key = format!("{item}#requeued");
        let headers = OwnedHeaders::new().insert(Header {
            key: "likes.error",
            value: Some(REQUEUED),
        });
        producer
            .send(
                FutureRecord::<[u8], [u8]>::to(&topic)
                    .key(key.as_bytes())
                    .headers(headers),
                p.settings.kafka.request_timeout,
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    info!(
        items = items.len(),
        "recount queue: items put back for the next run"
    );
    Ok(())
}

/// What `likes reconcile --dead-letters` did.
pub struct Recount {
    pub queue: Queued,
    pub reconcile: ReconcileReport,
    /// Items put back on the queue (in flight at every cut, or their range closed).
    pub requeued: Vec<String>,
}

impl std::fmt::Display for Recount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.reconcile)?;
        let q = &self.queue;
        write!(
            f,
            "recount queue: {} records, {} items recounted",
            q.records,
            q.items.len()
        )?;
        if !self.requeued.is_empty() {
            write!(
                f,
                ", {} put back for the next run (in flight at every cut, or moving)",
                self.requeued.len()
            )?;
        }
        if !q.elsewhere.is_empty() {
            write!(
                f,
                ", {} homed in another region (left to it)",
                q.elsewhere.len()
            )?;
        }
        if q.unattributed > 0 {
            write!(
                f,
                ", {} records naming no item left for a person (see the log)",
                q.unattributed
            )?;
        }
        if q.clamped > 0 {
            write!(
                f,
                "\n{} records carried an event time past every clock the system admits: the cut took now plus twice cql.max_clock_skew for them (see the log)",
                q.clamped
            )?;
        }
        if q.lost > 0 {
            write!(
                f,
                "\n{} records were deleted by retention before any run read them: run `likes drift --all` and reconcile what it names",
                q.lost
            )?;
        }
        Ok(())
    }
}

impl Recount {
    /// The run as Prometheus gauges (for `--metrics-file` or `--push`): the alerts watch that
    /// the queue is drained every hour and loses nothing (docs/operations.md).
    pub fn gauges(&self) -> Vec<super::gauges::Gauge> {
        let now_s = crate::runtime::clock::now_ms() / 1000;
        vec![
            (
                "likes_recount_last_drained_timestamp_seconds",
                "when the recount queue was last marked drained (Unix s)",
                now_s,
            ),
            (
                "likes_recount_items",
                "items the last recount run reconciled",
                self.queue.items.len() as i64,
            ),
            (
                "likes_recount_requeued_items",
                "items the last recount run put back on the queue (in flight at every cut, or moving)",
                self.requeued.len() as i64,
            ),
            (
                "likes_recount_lost_records",
                "records retention deleted before the last recount run read them",
                self.queue.lost as i64,
            ),
            (
                "likes_recount_clamped_records",
                "dead letters of the last recount run whose event time lay past every admitted clock (their cut clamped)",
                self.queue.clamped as i64,
            ),
            (
                "likes_recount_unattributed_records",
                "records the last recount run read that name no item",
                self.queue.unattributed as i64,
            ),
        ]
    }
}

/// The recount queue, once: read it, reconcile its items at a cut, put back what did not
/// settle, then mark the queue drained up to where it was read (a dry run commits nothing).
pub async fn recount(p: &Pipeline, dry_run: bool, reason: &str) -> Result<Recount> {
    let queue = read(p)?;
    // An empty queue needs no cut (a cut waits api.relay_min_age and both stages).
    let reconcile = if queue.items.is_empty() {
        ReconcileReport {
            dry_run,
            ..Default::default()
        }
    } else {
        super::reconcile::correct::run_after(
            p,
            queue.items.clone(),
            dry_run,
            reason,
            queue.latest_event_ms,
        )
        .await?
    };
    let mut requeued: Vec<String> = reconcile
        .in_flight
        .iter()
        .map(|(item, _)| item.clone())
        .chain(queue.closed.iter().cloned())
        .collect();
    requeued.sort();
    requeued.dedup();
    if !dry_run {
        // Put back before the commit: a kill between the two recounts them twice (harmless,
        // the correction fence), never zero times.
        requeue(p, &requeued).await?;
        drained(p, &queue)?;
    }
    Ok(Recount {
        queue,
        reconcile,
        requeued,
    })
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
    use crate::schema::v1::LikeEvent;
    use prost::Message as _;

    #[test]
    fn a_dead_letter_far_in_the_future_cannot_set_a_cut_no_run_reaches() {
        // Issue 56: a writer stamping microseconds; before, its time became the cut.
        let now = 1_800_000_000_000;
        let micros = now * 1000;
        assert_eq!(
            cut_floor(Some("invalid"), micros, now, 2000),
            None,
            "needs no recount at its time"
        );
        assert_eq!(
            cut_floor(Some("expired"), micros, now, 2000),
            Some((now + 4000, true))
        );
        assert_eq!(
            cut_floor(None, micros, now, 2000),
            Some((now + 4000, true)),
            "an older record"
        );
        assert_eq!(
            cut_floor(Some("guessed"), now + 3000, now, 2000),
            Some((now + 3000, false))
        );
    }

    #[test]
    fn the_queue_recounts_only_the_items_this_region_homes_now() {
        use crate::records::Home;
        let route = |item: &str| {
            Some(match item {
                "moved-away" => Route::Elsewhere {
                    range: 1,
                    home: "b".into(),
                },
                "moving" => Route::Closed("range 2 is moving".into()),
                _ => Route::Here(Home::default()),
            })
        };
        let mut q = Queued::default();
        let items = ["moved-away", "moving", "mine"].map(String::from);
        sort_by_home(items.clone(), route, &mut q);
        assert_eq!(
            (q.items, q.elsewhere, q.closed),
            (
                vec!["mine".to_string()],
                vec!["moved-away".to_string()],
                vec!["moving".to_string()]
            )
        );
        // Without home regions every item is this region's.
        let mut all = Queued::default();
        sort_by_home(items, |_| None, &mut all);
        assert_eq!(all.items.len(), 3);
    }

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
