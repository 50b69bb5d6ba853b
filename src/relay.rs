//! `likes relay` (or the relay inside `likes api`): publishes the events a write could not (a crash or a broker error between
//! the edge flip and the produce), so no flip is ever lost.
//!
//! Entries sit in (shard, minute) partitions; each shard's floor names the oldest minute that
//! may still hold one, so a pass reads a few minutes, not the tombstones of every drained
//! entry since the start. Every entry older than `min_age` names an edge; `min_age` exceeds a
//! write's deadline plus one CQL timeout (checked at start), so the request that wrote the
//! entry has given up, and every compare-and-set it sent was aimed by a read made before.
//! That does not bound when such a statement lands: a statement stalled on the wire, a
//! paused coordinator or a proposal one replica accepted can apply long after (issue 56).
//!
//! The relay publishes that edge's current (op_id, state) only if the edge changed at or after
//! the entry was written (`updated_at >= created_at`: the entry's request, or a later one,
//! flipped it), then deletes exactly the entries it read. An edge older than its entries, or
//! no edge at all, was changed by no request of theirs so far (a no-op, a flip whose CAS
//! failed, or one still to land): publishing it would re-send a version from the past, which
//! stage 1 may no longer remember. Those entries are deleted only after the row is fenced
//! (`Edges::fence`, docs/exactness.md, "The row fence"): a conditional write that makes the
//! row or moves its fence stamp, which every request's compare-and-set names as it read it,
//! so none aimed before the fence can apply after it, whenever it lands. A fence that finds
//! the row changed since the read leaves the entries for the next pass, which publishes. An
//! entry written meanwhile stays for the next pass. Publishing an edge whose event is
//! already on the log is harmless: stage 1 drops it by op_id.
//!
//! Many relays run at once (one per API pod by default): each drains only the shards whose
//! lease it holds (`store/outbox_lease.rs`), so an outage's backlog is published about once,
//! not once per relay (issue 43, item 7c).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::Settings;
use crate::error::Result;
use crate::records::Home;
use crate::region::{Route, Routes};
use crate::runtime::clock::now_ms;
use crate::runtime::metrics as m;
use crate::runtime::shutdown::CancellationToken;
use crate::schema::v1::Source;
use crate::store::edges::Edges;
use crate::store::events::Events;
use crate::store::outbox::{outbox_minute, Floor, Named, Outbox, OUTBOX_SCAN_LIMIT, OUTBOX_SHARDS};
use crate::store::outbox_lease::{Held, Leases};
use crate::topology::Topology;
use crate::{cql, hash};

/// What the relay reads and writes: the outbox, the edges, the events topic. No HTTP
/// session key, no admission, no request keys.
pub struct Relay {
    pub outbox: Outbox,
    pub edges: Edges,
    pub events: Events,
    /// The topology's bucket count: an edge's row key.
    pub buckets: u32,
    /// With home regions, the relay publishes only the items its region homes; another
    /// region's entries are its relay's (docs/multi-region.md).
    pub routes: Option<Routes>,
    /// This host's clock against the database's: entries are judged old by it.
    pub clock: crate::cql::clock::ClockWatch,
    pub max_clock_skew: Duration,
    /// None with `api.relay_lease = 0s`: this relay drains every shard.
    pub leases: Option<Leases>,
}

impl Relay {
    /// Connects to CQL (checking the keyspace matches the topology) and Kafka.
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<Self> {
        let session = cql::connect(&settings.cql).await?;
        crate::store::recorded::check_buckets(&session, &settings.cql.keyspace, topology).await?;
        cql::clock::check(&session, settings.cql.max_clock_skew).await?;
        let events = Events::connect(settings, topology)?;
        let routes = Routes::for_process(&session, settings).await?;
        Self::prepare(session, events, routes, settings, topology).await
    }

    /// On a session already connected and checked and a producer already made (the API's).
    pub async fn prepare(
        session: Arc<scylla::client::session::Session>,
        events: Events,
        routes: Option<Routes>,
        settings: &Settings,
        topology: &Topology,
    ) -> Result<Self> {
        let ks = &settings.cql.keyspace;
        let leases = match settings.api.relay_lease {
            ttl if ttl.is_zero() => None,
            ttl => Some(
                Leases::prepare(session.clone(), ks, settings.region.name.as_deref(), ttl).await?,
            ),
        };
        Ok(Self {
            leases,
            outbox: Outbox::prepare(session.clone(), ks).await?,
            edges: Edges::prepare(session.clone(), ks).await?,
            clock: cql::clock::ClockWatch::spawn(
                session,
                settings.cql.max_clock_skew,
                settings.cql.clock_check_every,
            ),
            max_clock_skew: settings.cql.max_clock_skew,
            events,
            buckets: topology.buckets,
            routes,
        })
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Events published (one per edge with pending entries and a flip to publish).
    pub published: u64,
    /// Outbox entries deleted.
    pub cleared: u64,
    /// Edges whose entries' requests changed nothing: entries deleted, nothing published.
    pub stale: u64,
    /// (shard, minute) partitions this pass could not drain (their floor stays; the next
    /// pass tries again), and the first one's error.
    pub failed: u64,
    pub first_error: Option<String>,
    /// Shards another relay holds the lease of, left to it.
    pub others: u64,
    /// The write time of the oldest due entry this pass found (ms; None: none).
    pub oldest_ms: Option<i64>,
}

/// A write puts its outbox entry within its own timeouts of the time its minute is taken
/// from; a minute that ended longer ago than this takes no new entry, so once it is empty
/// the floor may move past it for good.
// Every writer and relay is within cql.max_clock_skew of the database's clock (cql/clock.rs),
// a few seconds, well inside this margin.
const SETTLE_MS: i64 = 120_000;

/// One pass over every outbox shard, from its floor minute to the newest minute old enough.
/// A partition that fails (a broker away, a read past the tombstone threshold) is counted in
/// `failed` and keeps its shard's floor; the pass goes on with the others (issue 43, hole 5:
/// one unreadable partition stopped every shard after it).
pub async fn pass(relay: &Relay, min_age: Duration) -> Result<Pass> {
    // Judged by a clock past the bound, an entry of a request still in flight could look
    // old enough to delete unpublished (docs/exactness.md, "The clock bound").
    if let Some(why) = relay.clock.refusal(relay.max_clock_skew) {
        return Err(why);
    }
    let now = now_ms();
    let cutoff = now - min_age.as_millis() as i64;
    let last = outbox_minute(cutoff);
    let settled = outbox_minute(now - SETTLE_MS);
    let mut done = Pass::default();
    let held = match &relay.leases {
        Some(leases) => Some(leases.hold(0..OUTBOX_SHARDS as i32).await?),
        None => None,
    };
    for shard in 0..OUTBOX_SHARDS as i32 {
        if held
            .as_ref()
            .is_some_and(|h| h.get(&shard) != Some(&Held::Mine))
        {
            done.others += 1;
            continue;
        }
        let Some(Floor {
            minute: floor,
            after: resume,
        }) = relay.outbox.floor_at(shard).await?
        else {
            // No floor: no process of this version has written here yet.
            continue;
        };
        let mut left = Vec::new();
        let failed_before = done.failed;
        for minute in floor..=last {
            // The floor minute from where the last drain of it left off, once it has settled:
            // the tombstones before that are not read again (issue 56).
            let from = Start {
                after: if minute == floor {
                    resume.clone()
                } else {
                    None
                },
                keep: (minute == floor && minute < settled).then_some(floor),
            };
            let remaining = match drain(relay, shard, minute, cutoff, from, &mut done).await {
                Ok(remaining) => remaining,
                Err(e) => {
                    done.failed += 1;
                    done.first_error
                        .get_or_insert_with(|| format!("shard {shard} minute {minute}: {e}"));
                    usize::MAX
                }
            };
            left.push((minute, remaining));
        }
        let next = next_floor(floor, &left, settled);
        if next > floor {
            // Conditional: never backwards, whatever another relay did meanwhile.
            relay.outbox.advance_floor(shard, next).await?;
        }
        if done.failed > failed_before {
            // Another relay may reach what this one cannot (a broker it cannot see).
            if let Some(leases) = &relay.leases {
                leases.release(shard).await?;
            }
        }
    }
    Ok(done)
}

/// The new floor: past every minute, from the old floor on without a gap, that has settled
/// and was left empty by this pass.
fn next_floor(floor: i64, left: &[(i64, usize)], settled: i64) -> i64 {
    let mut next = floor;
    for &(minute, remaining) in left {
        if minute != next || minute >= settled || remaining > 0 {
            break;
        }
        next = minute + 1;
    }
    next
}

/// Where a drain of one (shard, minute) starts, and whether it records how far it got.
struct Start {
    /// The clustering position to read after (None: the partition's start).
    after: Option<Named>,
    /// Some(floor minute) when this is the shard's settled floor minute: each page cleared
    /// whole, with nothing left before it, moves the floor's resume position past it, so a
    /// drain cut short (a kill, a broker away) does not leave tombstones every later pass and
    /// cut must read again until Cassandra refuses the read (issue 56).
    keep: Option<i64>,
}

/// Publishes and clears the due entries of one (shard, minute), page by page from clustering
/// positions (a page never reads again the rows, or the tombstones, before it); returns how
/// many entries remain there (not yet due, or another region's).
async fn drain(
    relay: &Relay,
    shard: i32,
    minute: i64,
    cutoff: i64,
    from: Start,
    done: &mut Pass,
) -> Result<usize> {
    let mut remaining = 0;
    let mut after: Option<Named> = from.after;
    loop {
        let entries = relay
            .outbox
            .scan_page(shard, minute, after.as_ref())
            .await?;
        let full = entries.len() >= OUTBOX_SCAN_LIMIT;
        if let Some(e) = entries.last() {
            after = Some(Named {
                item: e.item.clone(),
                user: e.user.clone(),
                entry: e.entry.clone(),
            });
        }
        if !entries.is_empty() {
            // A page read and nothing published yet: where two relays that both read it
            // would publish the same entries (tests/api_relay.rs).
            fail::fail_point!("relay-after-scan");
        }
        remaining += drain_page(relay, shard, minute, cutoff, entries, done).await?;
        if !full {
            return Ok(remaining);
        }
        if let (Some(floor), 0, Some(at)) = (from.keep, remaining, &after) {
            relay.outbox.set_resume(shard, floor, at).await?;
        }
        // Fault-test hook: a drain cut short after a page (tests/relay_tombstones.rs).
        fail::fail_point!("relay-after-page", |_| Err(crate::error::Error::Injected(
            "relay-after-page"
        )));
    }
}

/// One page: each edge with due entries published (if a request of theirs flipped it), then
/// those entries deleted; returns the entries left.
async fn drain_page(
    relay: &Relay,
    shard: i32,
    minute: i64,
    cutoff: i64,
    entries: Vec<crate::store::outbox::Entry>,
    done: &mut Pass,
) -> Result<usize> {
    // Edge → (the earliest write time of its due entries, those entries).
    let mut due: BTreeMap<(String, String), (i64, Vec<String>)> = BTreeMap::new();
    let mut young = 0;
    for e in entries {
        if e.created_at_ms <= cutoff {
            done.oldest_ms = Some(
                done.oldest_ms
                    .map_or(e.created_at_ms, |o| o.min(e.created_at_ms)),
            );
            let d = due
                .entry((e.item, e.user))
                .or_insert((i64::MAX, Vec::new()));
            d.0 = d.0.min(e.created_at_ms);
            d.1.push(e.entry);
        } else {
            young += 1;
        }
    }
    let mut clear: Vec<Named> = Vec::new();
    for ((item, user), (written, entries)) in due {
        // Another region's item, or one whose range is closed here for now: left for the
        // relay of its home (after a move, the new home publishes the old home's leftovers,
        // and its stage 1 leaves them to the old home's count and the move's recount).
        let home = match relay.routes.as_ref().map(|r| r.route(&item)) {
            None => Home::default(),
            Some(Route::Here(home)) => home,
            Some(_) => {
                young += entries.len();
                continue;
            }
        };
        let bucket = hash::bucket_of(&user, relay.buckets) as i32;
        let row = relay.edges.read_row(&item, bucket, &user).await?;
        match row.as_ref().map(|r| r.edge) {
            Some(edge) if edge.op_id > 0 && edge.updated_at_ms >= written => {
                relay
                    .events
                    .publish(&item, &user, &edge, Source::Relay, home)
                    .await?;
                done.published += 1;
                tracing::debug!(%item, %user, op_id = edge.op_id, "relay published a pending event");
            }
            // No row, or a row no request of these entries changed: true now, but a
            // statement of theirs may still land (stalled on the wire, a paused coordinator,
            // a proposal one replica accepted). The row is fenced first, so none of them can
            // apply after; if the row changed since the read, it is read again next pass.
            _ => {
                if !relay
                    .edges
                    .fence(&item, bucket, &user, row.as_ref())
                    .await?
                {
                    metrics::counter!(m::RELAY_FENCES, "outcome" => "raced").increment(1);
                    young += entries.len();
                    continue;
                }
                metrics::counter!(m::RELAY_FENCES, "outcome" => "fenced").increment(1);
                done.stale += 1;
                // User ids at debug only: an operator needs the counts, not who (issue 44).
                tracing::debug!(%item, %user, "relay: the entries' requests changed nothing; row fenced, deleting them unpublished");
            }
        }
        clear.extend(entries.into_iter().map(|entry| Named {
            item: item.clone(),
            user: user.clone(),
            entry,
        }));
    }
    let n = clear.len() as u64;
    if n > 0 {
        relay
            .outbox
            .delete_many(&BTreeMap::from([((shard, minute), clear)]))
            .await?;
        done.cleared += n;
    }
    Ok(young)
}

/// Runs passes every `every` until `stop`; a failed pass is logged and retried.
pub async fn run(relay: Arc<Relay>, every: Duration, min_age: Duration, stop: CancellationToken) {
    info!(?every, ?min_age, "relay running");
    while !stop.is_cancelled() {
        match pass(&relay, min_age).await {
            Ok(p) => {
                metrics::counter!(m::RELAY_PUBLISHED).increment(p.published);
                // How far behind the relay is, for the alert against the dedupe horizon.
                let oldest = p
                    .oldest_ms
                    .map_or(0.0, |t| (now_ms() - t).max(0) as f64 / 1000.0);
                metrics::gauge!(m::RELAY_OLDEST_SECONDS).set(oldest);
                if p.failed > 0 {
                    // One line per pass, not per partition: a broker away fails them all.
                    metrics::counter!(m::RELAY_PASSES, "outcome" => "error").increment(1);
                    warn!(failed_partitions = p.failed, first = p.first_error.as_deref().unwrap_or(""), published = p.published, cleared = p.cleared, "relay pass: some outbox partitions were not drained; retrying them next pass");
                } else {
                    metrics::counter!(m::RELAY_PASSES, "outcome" => "ok").increment(1);
                    if p.cleared > 0 {
                        info!(?p, "relay pass");
                    }
                }
            }
            Err(e) => {
                metrics::counter!(m::RELAY_PASSES, "outcome" => "error").increment(1);
                warn!(error = %e, "relay pass failed; retrying");
            }
        }
        crate::runtime::supervise::sleep_or_stop(every, &stop).await;
    }
    if let Err(e) = release(&relay).await {
        warn!(error = %e, "relay: could not release its outbox leases; they lapse on their own");
    }
}

/// Lets every shard this relay holds go (a relay stopping, a rolling restart): the next relay
/// takes them now, not once the lease lapses.
pub async fn release(relay: &Relay) -> Result<()> {
    if let Some(leases) = &relay.leases {
        for shard in 0..OUTBOX_SHARDS as i32 {
            leases.release(shard).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::next_floor;

    #[test]
    fn the_floor_moves_only_past_settled_empty_minutes_without_a_gap() {
        // Minutes 10..=14, settled below 13.
        let empty = [(10, 0), (11, 0), (12, 0), (13, 0), (14, 0)];
        assert_eq!(next_floor(10, &empty, 13), 13);
        let busy = [(10, 0), (11, 2), (12, 0)];
        assert_eq!(next_floor(10, &busy, 13), 11);
        assert_eq!(next_floor(10, &[], 13), 10);
        assert_eq!(next_floor(10, &[(10, 0)], 10), 10);
    }
}
