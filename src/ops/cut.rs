//! A cut: one whole second K of the edge clock (`updated_at`, the flips' event time), at which
//! the edges and the counter rows are compared without stopping anything.
//!
//! - **The edges at K.** Every real flip bumps op_id and toggles the state, and the row keeps
//!   the times of its last two flips (`updated_at`, `prev_at`) and, in `recent_keys`, the op_id
//!   and time of its recent requests. So the state at K is the current state, toggled once per
//!   flip at or after K. An edge flipped twice since K whose older history has left the row is
//!   "in flight": its item is retried with a later cut.
//! - **The count at K.** Stage 1 never combines flips of two event-time seconds into one delta
//!   (`dedupe`'s batch is keyed by item and second), so each delta record lies wholly before or
//!   after K. The count at K is the row's count minus the deltas at or after K that the row has
//!   applied: those on the deltas log whose window is at or below the row's `last_window`.
//! - **Nothing before K is still on its way.** The job waits until every flip stamped before K
//!   is on the counter row: `api.relay_min_age` past K (no request stamped before K is still in
//!   flight), no outbox entry older than K (the relay has published what a request could not),
//!   stage 1 committed past the events log's end, stage 2 committed past the deltas log's end.
//!
//! Then drift = count at K − LIKED edges at K, exactly, while live traffic goes on.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use scylla::client::session::Session;
use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka::group;
use crate::kafka::offsets::{self, Extent};
use crate::records::{decode_deltas, DeltaInput};
use crate::region::{Route, Routes};
use crate::runtime::clock::now_ms;
use crate::runtime::supervise::Backoff;
use crate::store::counts::CounterRow;
use crate::store::edge_history::{EdgeHistories, EdgeHistory};
use crate::store::outbox::{outbox_minute, OUTBOX_SCAN_LIMIT, OUTBOX_SHARDS};
use crate::store::request_keys::Remembered;
use crate::store::Stores;
use crate::topology::Topology;

/// A delta never straddles a whole second of event time (stage 1's batch key).
pub const GRID_MS: i64 = 1000;

/// How far before K the deltas log is read: a delta of a flip at or after K may carry a log
/// time this much earlier than its event time (clock skew between API hosts and brokers).
pub const SKEW_MS: i64 = 60_000;

/// The cut for now: the last whole second.
pub fn choose() -> i64 {
    now_ms().div_euclid(GRID_MS) * GRID_MS
}

/// The cut for now, but past `after` (ms): the first whole second above it when that is
/// later (the job then waits for its clock to pass it, as for any cut).
pub fn choose_after(after: i64) -> i64 {
    choose().max((after.div_euclid(GRID_MS) + 1) * GRID_MS)
}

/// An edge's state at K: Some(liked), or None when it flipped twice or more since K and the
/// row no longer tells how often.
pub fn liked_at(
    liked: bool,
    op_id: i64,
    updated_at: i64,
    prev_at: i64,
    keys: &BTreeMap<i32, String>,
    k: i64,
) -> Option<bool> {
    if op_id == 0 || (updated_at < k && (op_id == 1 || prev_at < k)) {
        // Never flipped (an unlike that created the row), or not since K.
        return Some(liked && op_id > 0);
    }
    // The flip time of each op_id the row still knows (op 0: the row did not exist,
    // unliked), and the latest op known to exist before K: a flip before K, or any
    // remembered request before K (a no-op records the op_id it found).
    let mut at: BTreeMap<i64, i64> = BTreeMap::from([(op_id, updated_at), (0, i64::MIN)]);
    if op_id > 1 {
        at.insert(op_id - 1, prev_at);
    }
    let mut before = 0;
    for r in keys.values().filter_map(|v| Remembered::decode(v)) {
        if r.changed {
            at.insert(r.op_id, r.at_ms);
        }
        if r.at_ms < k {
            before = before.max(r.op_id);
        }
    }
    for (&op, &t) in &at {
        if t < k {
            before = before.max(op);
        }
    }
    // Two requests racing across K can stamp their flips out of op order (the later op
    // with the earlier time): the edge clock does not order such an edge at K.
    if at.range(..=before).any(|(_, &t)| t >= k) {
        return None;
    }
    // The state at K is op `before`'s, provided the op after it is known to be at or after K.
    if *at.get(&(before + 1))? < k {
        return None;
    }
    let state_of = |op: i64| {
        if op == 0 {
            false
        } else if (op_id - op) % 2 == 0 {
            liked
        } else {
            !liked
        }
    };
    Some(state_of(before))
}

/// [`liked_at`] of an edge as the scans read it.
pub fn history_liked_at(h: &EdgeHistory, k: i64) -> Option<bool> {
    liked_at(h.liked, h.op_id, h.updated_at_ms, h.prev_at_ms, &h.keys, k)
}

/// Runs `f` until it succeeds, retrying an error worth retrying (a broker or database
/// restarting, a timeout) with backoff until `deadline`; then the last error.
pub async fn retry_transient<T>(
    what: &str,
    deadline: Instant,
    mut f: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && Instant::now() + backoff.peek() < deadline => {
                let wait = backoff.wait();
                tracing::warn!(error = %e, retry_in = ?wait, "{what}: transient error; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What one item looks like at a cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemAtCut {
    pub item: String,
    /// Its counter row (None: none yet).
    pub row: Option<CounterRow>,
    /// Deltas at or after K that the row has applied.
    pub applied_since: i64,
    /// LIKED edges at K; Err(user) when that user's edge makes the item in flight.
    pub recount: std::result::Result<i64, String>,
}

impl ItemAtCut {
    pub fn count_at_cut(&self) -> i64 {
        self.row.map_or(0, |r| r.count) - self.applied_since
    }

    /// Count at K minus LIKED edges at K; None when in flight.
    pub fn drift(&self) -> Option<i64> {
        self.recount.as_ref().ok().map(|r| self.count_at_cut() - r)
    }
}

/// The pipeline and stores a cut is taken against.
pub struct Pipeline {
    pub settings: Settings,
    pub topology: Topology,
    pub session: Arc<Session>,
    pub stores: Stores,
    /// The edges' history scans (only the jobs read them).
    pub histories: EdgeHistories,
    kafka: BaseConsumer,
    /// With home regions: which items this region's pipeline counts.
    pub(crate) routes: Option<Routes>,
}

impl Pipeline {
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<Self> {
        let session = crate::cql::connect(&settings.cql).await?;
        crate::store::recorded::check(&session, &settings.cql.keyspace, topology).await?;
        // The cut waits api.relay_min_age past K by this host's clock.
        crate::cql::clock::check(&session, settings.cql.max_clock_skew).await?;
        let ks = &settings.cql.keyspace;
        let stores = Stores::prepare(&session, ks).await?;
        let histories = EdgeHistories::prepare(session.clone(), ks).await?;
        let routes = Routes::for_process(&session, settings).await?;
        let kafka: BaseConsumer = crate::kafka::client_config(&settings.kafka)
            .set(
                "group.id",
                format!("likes-ops-{:016x}", rand::random::<u64>()),
            )
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()?;
        Ok(Self {
            settings: settings.clone(),
            topology: topology.clone(),
            session,
            stores,
            histories,
            kafka,
            routes,
        })
    }

    /// With home regions, the items this region homes, each once; without, all of them. A
    /// range closed here for now (a move under way, or a view of the range table past its
    /// lease) refuses the job: run it again once the move has settled.
    pub fn homed_here(&self, items: Vec<String>) -> Result<Vec<String>> {
        let Some(routes) = &self.routes else {
            return Ok(items);
        };
        let mut here = Vec::new();
        for item in items {
            match routes.route(&item) {
                Route::Here(_) => here.push(item),
                Route::Elsewhere { .. } => {}
                Route::Closed(why) => {
                    return Err(Error::Refused(format!(
                        "item {item:?}: {why}; run the job again once the move has settled"
                    )))
                }
            }
        }
        Ok(here)
    }

    /// Whether this region's relay publishes `item`'s outbox entries (every item without
    /// home regions): another region's entries are its relay's.
    fn relayed_here(&self, item: &str) -> bool {
        !matches!(
            self.routes.as_ref().map(|r| r.route(item)),
            Some(Route::Elsewhere { .. })
        )
    }

    /// Waits until every flip stamped before `k` is on the counter rows (or, with
    /// `stage2` false, on the deltas log): see the module's comment.
    pub async fn wait_past(&self, k: i64, stage2: bool) -> Result<()> {
        let started = Instant::now();
        let timeout = self.settings.ops.wait_timeout;
        let over = |what: &str| -> Result<()> {
            if started.elapsed() > timeout {
                return Err(Error::Timeout(timeout, what.to_string()));
            }
            Ok(())
        };
        let quiet = k + self.settings.api.relay_min_age.as_millis() as i64;
        while now_ms() < quiet {
            over("the cut's requests to finish")?;
            super::progress::waiting(
                "api.relay_min_age past the cut, so that no request stamped before it is in flight",
                started,
            )
            .await;
        }
        loop {
            let left = self.outbox_before(k).await?;
            if left == 0 {
                break;
            }
            over(&format!(
                "{left} outbox entries older than the cut; is the relay running (`likes relay` or api.relay)?"
            ))?;
            super::progress::waiting(
                &format!("the relay: {left} outbox entries older than the cut"),
                started,
            )
            .await;
        }
        let events = self.settings.topic(&self.topology.topics.events.name);
        let dedupe = self.settings.group(&self.topology.groups.dedupe);
        self.wait_committed(&dedupe, &events, started, "stage 1 (likes dedupe)")
            .await?;
        if stage2 {
            let deltas = self.settings.topic(&self.topology.topics.deltas.name);
            let count = self.settings.group(&self.topology.groups.count);
            self.wait_committed(&count, &deltas, started, "stage 2 (likes count)")
                .await?;
        }
        info!(cut = k, waited = ?started.elapsed(), "the pipeline has passed the cut");
        Ok(())
    }

    /// Waits until stage 2 has applied everything on the deltas log now (a correction just
    /// sent, say).
    pub async fn wait_counted(&self) -> Result<()> {
        let deltas = self.settings.topic(&self.topology.topics.deltas.name);
        let count = self.settings.group(&self.topology.groups.count);
        self.wait_committed(&count, &deltas, Instant::now(), "stage 2 (likes count)")
            .await
    }

    /// Outbox entries created before `k` (a full scan partition counts as unknown: 1). The
    /// floor minute is read from the relay's resume position in it: the tombstones of a
    /// drain cut short are not read again (issue 56).
    async fn outbox_before(&self, k: i64) -> Result<usize> {
        let last = outbox_minute(k);
        let mut n = 0;
        for shard in 0..OUTBOX_SHARDS as i32 {
            let floor = self.stores.outbox.floor_at(shard).await?;
            let first = floor.as_ref().map_or(last, |f| f.minute.min(last));
            for minute in first..=last {
                let after = floor
                    .as_ref()
                    .filter(|f| f.minute == minute)
                    .and_then(|f| f.after.as_ref());
                let entries = self.stores.outbox.scan_page(shard, minute, after).await?;
                if entries.len() >= OUTBOX_SCAN_LIMIT {
                    n += 1;
                }
                n += entries
                    .iter()
                    .filter(|e| e.created_at_ms < k && self.relayed_here(&e.item))
                    .count();
            }
        }
        Ok(n)
    }

    /// The partitions of `topic` with their extents (first retained offset, end).
    pub fn ends(&self, topic: &str) -> Result<Vec<Extent>> {
        let timeout = self.settings.kafka.request_timeout;
        tokio::task::block_in_place(|| offsets::extents(&self.kafka, topic, timeout))
    }

    /// A group's committed offsets on `topic` (None: nothing committed).
    pub fn committed(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<HashMap<i32, Option<i64>>> {
        let timeout = self.settings.kafka.request_timeout;
        // read_uncommitted: a read_committed client asks for *stable* offsets, and the broker
        // answers UNSTABLE_OFFSET_COMMIT for as long as the group has a transaction open,
        // which stage 1 under traffic nearly always has; librdkafka retries that until its
        // timeout and reports "Meta data fetch error" (issue 23: drift and rebuild failed
        // under live likes). The offsets a transaction has not committed yet are not
        // returned either way: what comes back is the last committed position.
        let c: BaseConsumer = crate::kafka::client_config(&self.settings.kafka)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_uncommitted")
            .create()?;
        let got = tokio::task::block_in_place(|| group::committed(&c, topic, partitions, timeout))?;
        Ok(got.into_iter().map(|p| (p.partition, p.offset)).collect())
    }

    async fn wait_committed(
        &self,
        group: &str,
        topic: &str,
        started: Instant,
        who: &str,
    ) -> Result<()> {
        let deadline = started + self.settings.ops.wait_timeout;
        let ends = retry_transient(&format!("reading the end of {topic}"), deadline, || {
            self.ends(topic)
        })
        .await?;
        let partitions: Vec<i32> = ends.iter().map(|e| e.partition).collect();
        loop {
            let committed = retry_transient(
                &format!("reading {who}'s committed offsets"),
                deadline,
                || self.committed(group, topic, &partitions),
            )
            .await?;
            let behind: i64 = ends
                .iter()
                .map(
                    |&Extent {
                         partition,
                         low,
                         high,
                     }| {
                        let at = committed.get(&partition).copied().flatten().unwrap_or(low);
                        (high - at.max(low)).max(0)
                    },
                )
                .sum();
            // Stage 2 commits past a window once a later record closes it: stage 1's ticks
            // (every 200 ms) carry its committed offset past the log's end.
            if behind == 0 {
                return Ok(());
            }
            if started.elapsed() > self.settings.ops.wait_timeout {
                return Err(Error::Timeout(
                    self.settings.ops.wait_timeout,
                    format!("{who} to pass the cut ({behind} records behind on {topic}); is it running?"),
                ));
            }
            super::progress::waiting(
                &format!("{who}: {behind} records of {topic} to pass"),
                started,
            )
            .await;
        }
    }

    /// An item's counter row, read at SERIAL.
    pub async fn count_row(&self, item: &str) -> Result<Option<CounterRow>> {
        let shard = self.topology.counter_shard(item);
        self.stores.counts.row(shard, item).await
    }

    /// LIKED edges of `item` at `k`, bucket by bucket at SERIAL; Err(user) for an edge in
    /// flight.
    pub async fn recount(&self, item: &str, k: i64) -> Result<std::result::Result<i64, String>> {
        let mut liked = 0;
        for bucket in 0..self.topology.buckets as i32 {
            let mut rows = self.histories.of_bucket(item, bucket).await?;
            while let Some((user, history)) = rows.try_next().await? {
                match history_liked_at(&history, k) {
                    Some(true) => liked += 1,
                    Some(false) => {}
                    None => return Ok(Err(user)),
                }
            }
        }
        Ok(Ok(liked))
    }

    /// Per item, the sum of the deltas at or after `k` that its row has applied (window at or
    /// below `last_window`), read from the deltas log from `k - SKEW_MS`.
    pub fn applied_since(
        &self,
        rows: &HashMap<String, Option<CounterRow>>,
        k: i64,
    ) -> Result<HashMap<String, i64>> {
        let topic = self.settings.topic(&self.topology.topics.deltas.name);
        let ends = self.ends(&topic)?;
        let n = ends.len() as u32;
        let mut by_partition: HashMap<i32, HashMap<&str, i64>> = HashMap::new();
        for (item, row) in rows {
            if let Some(w) = row.map(|r| r.last_window) {
                let p = crate::hash::partition_for(item.as_bytes(), n) as i32;
                by_partition.entry(p).or_default().insert(item, w);
            }
        }
        let mut out: HashMap<String, i64> = rows.keys().map(|i| (i.clone(), 0)).collect();
        let window_ms = self.topology.window.as_millis() as i64;
        for (p, items) in by_partition {
            let high = ends.iter().find(|e| e.partition == p).map_or(0, |e| e.high);
            let top = items.values().copied().max().unwrap_or(i64::MIN);
            self.read_deltas(&topic, p, k - SKEW_MS, high, |_, clock, input| {
                let end = (clock.div_euclid(window_ms) + 1) * window_ms;
                if end > top {
                    return false;
                }
                if let Some(DeltaInput::Delta {
                    item,
                    delta,
                    event_time_ms,
                    ..
                }) = input
                {
                    if let Some(&w) = items.get(item.as_str()) {
                        if event_time_ms >= k && end <= w {
                            *out.get_mut(&item).expect("every item has an entry") += delta;
                        }
                    }
                }
                true
            })?;
        }
        Ok(out)
    }

    /// Reads a deltas partition from the first record at or after `from_ms` up to `high`,
    /// feeding each record (offset, the partition's clock: log time made monotonic, the
    /// record if it decodes) until `f` says stop. Returns the offset after the last record
    /// read.
    pub fn read_deltas(
        &self,
        topic: &str,
        p: i32,
        from_ms: i64,
        high: i64,
        mut f: impl FnMut(i64, i64, Option<DeltaInput>) -> bool,
    ) -> Result<i64> {
        let timeout = self.settings.kafka.request_timeout;
        tokio::task::block_in_place(|| {
            let start = offsets::at_time(&self.kafka, topic, &[p], from_ms, timeout)?[0]
                .1
                .unwrap_or(high);
            let mut clock = i64::MIN;
            offsets::read_range(&self.kafka, topic, p, start, high, timeout, |m| {
                clock = clock.max(m.timestamp().to_millis().unwrap_or(0));
                Ok(f(m.offset(), clock, decode_deltas(m.payload()).ok()))
            })
        })
    }

    /// The counter rows of `items` and the deltas at or after `k` each has applied: with
    /// the two, an item's count at K (`ItemAtCut::count_at_cut`).
    #[allow(clippy::type_complexity)]
    pub async fn rows_at(
        &self,
        items: &[String],
        k: i64,
    ) -> Result<(HashMap<String, Option<CounterRow>>, HashMap<String, i64>)> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let n = self.settings.ops.recount_concurrency;
        // Owned items in the futures: a future borrowing the slice is not Send for every
        // lifetime, and a move (which recounts) may be spawned.
        let rows: HashMap<String, Option<CounterRow>> = stream::iter(items.to_vec())
            .map(|item| async move {
                let row = self.count_row(&item).await?;
                Ok::<_, Error>((item, row))
            })
            .buffer_unordered(n)
            .try_collect()
            .await?;
        // One read of the deltas log for every item.
        let applied = self.applied_since(&rows, k)?;
        Ok((rows, applied))
    }

    /// Each item's count at `k`: its row's count less what the row applied at or after K.
    pub async fn counts_at(&self, items: &[String], k: i64) -> Result<HashMap<String, i64>> {
        let (rows, applied) = self.rows_at(items, k).await?;
        Ok(rows
            .into_iter()
            .map(|(item, row)| {
                let since = applied.get(&item).copied().unwrap_or(0);
                (item, row.map_or(0, |r| r.count) - since)
            })
            .collect())
    }

    /// Every item at the cut: rows first, then the log (so every delta the rows applied is
    /// on it), then the edges.
    pub async fn items_at(&self, items: &[String], k: i64) -> Result<Vec<ItemAtCut>> {
        use futures::stream::{self, StreamExt};
        let n = self.settings.ops.recount_concurrency;
        let (rows, applied) = self.rows_at(items, k).await?;
        let mut progress =
            super::progress::Progress::new("items recounted", Some(items.len() as u64));
        let mut recounts = stream::iter(items.to_vec())
            .map(|item| async move {
                let rc = self.recount(&item, k).await?;
                Ok::<_, Error>((item, rc))
            })
            .buffer_unordered(n);
        let mut by_item = HashMap::new();
        while let Some(r) = recounts.next().await {
            let (item, rc) = r?;
            by_item.insert(item, rc);
            progress.add(1);
        }
        progress.finish();
        Ok(items
            .iter()
            .map(|item| ItemAtCut {
                item: item.clone(),
                row: rows[item],
                applied_since: applied.get(item).copied().unwrap_or(0),
                recount: by_item.get(item).cloned().unwrap_or(Ok(0)),
            })
            .collect())
    }

    /// Up to `n` items drawn at random from the edges (an edge partition at each of `n`
    /// random tokens), so a sample reaches items that have likes but no counter row: a flip
    /// dead-lettered or lost before it was ever counted (issue 23, item 6).
    pub async fn random_edge_items(&self, n: usize) -> Result<Vec<String>> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let found: Vec<Option<String>> = stream::iter(0..n)
            .map(|_| self.histories.item_at_token(rand::random()))
            .buffer_unordered(self.settings.ops.recount_concurrency)
            .try_collect()
            .await?;
        let set: std::collections::BTreeSet<String> = found.into_iter().flatten().collect();
        Ok(set.into_iter().collect())
    }

    /// Every item that has an edge or a counter row.
    pub async fn all_items(&self) -> Result<Vec<String>> {
        let mut items = self.histories.items().await?;
        items.extend(self.stores.counts.all().await?.into_keys());
        Ok(items.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(flips: &[(i64, i64)]) -> BTreeMap<i32, String> {
        requests(
            &flips
                .iter()
                .map(|&(op, at)| (op, at, true))
                .collect::<Vec<_>>(),
        )
    }

    /// (op_id after the request, its time, whether it flipped)
    fn requests(reqs: &[(i64, i64, bool)]) -> BTreeMap<i32, String> {
        reqs.iter()
            .enumerate()
            .map(|(i, &(op, at, changed))| {
                let r = Remembered {
                    liked: op % 2 == 1,
                    changed,
                    op_id: op,
                    at_ms: at,
                    key: format!("u:k{op}"),
                };
                (i as i32, r.encode())
            })
            .collect()
    }

    #[test]
    fn an_edge_not_flipped_since_the_cut_is_as_it_is() {
        assert_eq!(
            liked_at(true, 3, 900, 500, &BTreeMap::new(), 1000),
            Some(true)
        );
        assert_eq!(
            liked_at(false, 0, 0, 0, &BTreeMap::new(), 1000),
            Some(false)
        );
    }

    #[test]
    fn one_flip_since_the_cut_is_undone() {
        assert_eq!(
            liked_at(true, 1, 1500, 0, &BTreeMap::new(), 1000),
            Some(false)
        );
        assert_eq!(
            liked_at(false, 2, 1500, 900, &BTreeMap::new(), 1000),
            Some(true)
        );
    }

    #[test]
    fn two_flips_since_the_cut_need_the_recent_keys() {
        // op 3 (like) at 1600, op 2 (unlike) at 1200, op 1 (like) at 800: liked at 1000.
        assert_eq!(liked_at(true, 3, 1600, 1200, &BTreeMap::new(), 1000), None);
        let k = keys(&[(1, 800), (2, 1200), (3, 1600)]);
        assert_eq!(liked_at(true, 3, 1600, 1200, &k, 1000), Some(true));
        // Op 1 at 1100 as well: the row did not exist at 1000.
        let k = keys(&[(1, 1100), (2, 1200), (3, 1600)]);
        assert_eq!(liked_at(true, 3, 1600, 1200, &k, 1000), Some(false));
        // A gap: op 2 known at 1200, op 1 forgotten, an older op 0... unknown.
        let k = keys(&[(2, 1200), (3, 1600)]);
        assert_eq!(liked_at(true, 4, 1700, 1650, &k, 1000), None);
    }

    #[test]
    fn a_no_op_request_before_the_cut_tells_the_op_the_edge_was_at() {
        // The flip to op 5 has left the ring; a no-op like at 900 found op 5 (liked). Since
        // the cut: op 6 at 1100, op 7 at 1300, op 8 (unliked) at 1500.
        let k = requests(&[(5, 900, false), (6, 1100, true), (7, 1300, true)]);
        assert_eq!(liked_at(false, 8, 1500, 1300, &k, 1000), Some(true));
        // Without it, op 6's predecessor is unknown.
        let k = requests(&[(6, 1100, true), (7, 1300, true)]);
        assert_eq!(liked_at(false, 8, 1500, 1300, &k, 1000), None);
    }

    #[test]
    fn flips_stamped_out_of_op_order_across_the_cut_are_in_flight() {
        // Op 2 started before the cut but landed after op 1, which started after it.
        assert_eq!(liked_at(false, 2, 990, 1010, &BTreeMap::new(), 1000), None);
    }

    #[test]
    fn a_no_op_from_a_pod_whose_clock_is_behind_never_dates_an_op_before_its_flip() {
        // Issue 23, item 8: op 5 (liked) flipped at 1200 by one pod; a no-op like from a pod
        // whose clock reads 900 found op 5. Then op 6 (unlike) at 1300, op 7 (like) at 1400,
        // op 8 (unlike) at 1500, and op 5 left the row. At the cut 1000 the edge was at op 4
        // (flipped at 800, unliked).
        let noop_at = crate::write::recorded_at(900, Some(1200));
        let k = requests(&[
            (4, 800, true),
            (5, noop_at, false),
            (6, 1300, true),
            (7, 1400, true),
        ]);
        assert_ne!(
            liked_at(false, 8, 1500, 1400, &k, 1000),
            Some(true),
            "the no-op claims op 5 existed before the cut"
        );
    }
}
