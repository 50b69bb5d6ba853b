//! Helpers for whole-topology tests: a scripted event stream with its ground truth, and the
//! two stages run in this process (fault tests run them as child processes instead).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{FutureProducer, FutureRecord};

use likes::config::Settings;
use likes::runtime::shutdown::CancellationToken;
use likes::schema::v1::Source;
use likes::topology::Topology;
use likes::{cmd, count, cql, dedupe, kafka};

/// A scripted stream: the records to produce (key, value) and each item's true count.
pub struct Script {
    pub records: Vec<(String, Vec<u8>)>,
    pub truth: BTreeMap<String, i64>,
    pub flips: usize,
}

/// `items` items, `users` users; every edge flips 0..=max_flips times (op n is a like when
/// n is odd). Each event is produced 1-3 times, events of an edge are locally reordered,
/// and some superseded flips are never published (as when the relay publishes only an
/// edge's current state). The last flip of every edge is always published.
pub fn script(seed: u64, items: usize, users: usize, max_flips: u64) -> Script {
    let base_ms = likes::runtime::clock::now_ms() - 60_000;
    script_with(seed, items, users, max_flips, "item", base_ms)
}

/// [`script`] with items named `<prefix>-<n>` and flips timed from `base_ms`.
pub fn script_with(
    seed: u64,
    items: usize,
    users: usize,
    max_flips: u64,
    prefix: &str,
    base_ms: i64,
) -> Script {
    script_of(seed, items, users, max_flips, (prefix, "user"), base_ms)
}

/// [`script_with`] with users named `<users>-<n>`: a second script over the same items and
/// other users adds to the first's counts.
pub fn script_of(
    seed: u64,
    items: usize,
    users: usize,
    max_flips: u64,
    (prefix, user_prefix): (&str, &str),
    base_ms: i64,
) -> Script {
    // The tests' topology is the embedded one; its bucket count places every user.
    let buckets = likes::topology::Topology::load(None).unwrap().buckets;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut truth = BTreeMap::new();
    let mut per_key: BTreeMap<String, Vec<(String, Vec<u8>)>> = BTreeMap::new();
    let mut flips = 0;
    for i in 0..items {
        let item = format!("{prefix}-{i}");
        truth.insert(item.clone(), 0);
        for u in 0..users {
            let n = rng.random_range(0..=max_flips);
            if n == 0 {
                continue;
            }
            let user = format!("{user_prefix}-{u}");
            if n % 2 == 1 {
                *truth.get_mut(&item).unwrap() += 1;
            }
            let mut events = Vec::new();
            for op in 1..=n {
                let superseded = op < n && rng.random_bool(0.2);
                if superseded {
                    continue;
                }
                let t = base_ms + (op as i64) * 100;
                // Ops op-2 .. 1, newest first, as the API's edge row carries them.
                let earlier: Vec<i64> = (1..op.saturating_sub(1) as i64)
                    .rev()
                    .map(|k| base_ms + k * 100)
                    .collect();
                let (key, payload) = likes::records::Flip {
                    item: &item,
                    user: &user,
                    op_id: op,
                    liked: op % 2 == 1,
                    event_time_ms: t,
                    prev_event_time_ms: if op > 1 { t - 100 } else { 0 },
                    earlier_event_times_ms: &earlier,
                    source: Source::Test,
                    platform: likes::schema::v1::ClientPlatform::Unspecified,
                }
                .record(buckets);
                flips += 1;
                for _ in 0..rng.random_range(1..=3) {
                    events.push((key.clone(), payload.clone()));
                }
            }
            // Local reorder: swap a few neighbours.
            for _ in 0..events.len() / 2 {
                let j = rng.random_range(0..events.len());
                let k = (j + 1).min(events.len() - 1);
                events.swap(j, k);
            }
            if let Some((key, _)) = events.first() {
                per_key.entry(key.clone()).or_default().extend(events);
            }
        }
    }
    // Interleave keys, keeping each key's (already reordered) sequence.
    let mut queues: Vec<Vec<(String, Vec<u8>)>> = per_key
        .into_values()
        .map(|mut v| {
            v.reverse();
            v
        })
        .collect();
    let mut records = Vec::new();
    while !queues.is_empty() {
        queues.shuffle(&mut rng);
        queues.retain_mut(|q| match q.pop() {
            Some(r) => {
                records.push(r);
                !q.is_empty()
            }
            None => false,
        });
    }
    Script {
        records,
        truth,
        flips,
    }
}

/// Creates the keyspace and topics of `settings`.
pub async fn setup(settings: &Settings, topology: &Topology) {
    let session = cql::connect(&settings.cql).await.unwrap();
    cmd::migrate::run(&session, &settings.cql).await.unwrap();
    cmd::topics::run(settings, topology).await.unwrap();
}

/// Produces records to the events topic (idempotent producer, murmur2 partitioner).
pub async fn produce(settings: &Settings, topology: &Topology, records: &[(String, Vec<u8>)]) {
    let producer: FutureProducer = kafka::producer_config(&settings.kafka).create().unwrap();
    let topic = settings.topic(&topology.topics.events.name);
    let futures: Vec<_> = records
        .iter()
        .map(|(k, v)| {
            producer.send(
                FutureRecord::to(&topic).key(k).payload(v),
                Duration::from_secs(30),
            )
        })
        .collect();
    for f in futures {
        f.await.map_err(|(e, _)| e).unwrap();
    }
}

/// Every row of like_counts: item → count.
pub async fn counts(settings: &Settings) -> BTreeMap<String, i64> {
    let session = cql::connect(&settings.cql).await.unwrap();
    session
        .query_unpaged(
            format!(
                "SELECT item_id, count FROM {}.like_counts",
                settings.cql.keyspace
            ),
            (),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows::<(String, i64)>()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The truth with zero counts removed (an item that never moved may have no row).
pub fn nonzero(m: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    m.iter()
        .filter(|(_, &c)| c != 0)
        .map(|(k, &c)| (k.clone(), c))
        .collect()
}

/// Both stages running in this process.
pub struct Running {
    stop: CancellationToken,
    dedupe: tokio::task::JoinHandle<likes::Result<dedupe::DedupeStats>>,
    count: tokio::task::JoinHandle<likes::Result<count::sink::SinkStats>>,
    /// Stops the stages when a failing test unwinds: the runtime's shutdown waits for stage
    /// 1's blocking thread, so without it a failed assertion hangs instead of failing.
    _stop_on_drop: tokio_util::sync::DropGuard,
}

pub fn start(settings: &Settings, topology: &Topology) -> Running {
    let stop = CancellationToken::new();
    let (s, t, st) = (settings.clone(), topology.clone(), stop.clone());
    let health = |stage| likes::runtime::health::Health::new(stage, settings.metrics.stall_after);
    let h = health("dedupe");
    let dedupe = tokio::task::spawn_blocking(move || dedupe::run(&s, &t, st, h));
    let (s, t, st) = (settings.clone(), topology.clone(), stop.clone());
    let h = health("count");
    let count = tokio::spawn(async move { count::run(&s, &t, st, h).await });
    Running {
        _stop_on_drop: stop.clone().drop_guard(),
        stop,
        dedupe,
        count,
    }
}

impl Running {
    /// Panics with the stage's error if either stage has stopped on its own.
    pub async fn check(&mut self) {
        if self.dedupe.is_finished() {
            panic!("dedupe stopped: {:?}", (&mut self.dedupe).await.unwrap());
        }
        if self.count.is_finished() {
            panic!("count stopped: {:?}", (&mut self.count).await.unwrap());
        }
    }

    pub async fn stop(self) -> (dedupe::DedupeStats, count::sink::SinkStats) {
        self.stop.cancel();
        let d = self.dedupe.await.unwrap().unwrap();
        let c = self.count.await.unwrap().unwrap();
        (d, c)
    }
}

/// Waits until like_counts equals `want` (nonzero entries), or `timeout`; returns the last.
pub async fn wait_for_counts(
    running: &mut Running,
    settings: &Settings,
    want: &BTreeMap<String, i64>,
    timeout: Duration,
) -> BTreeMap<String, i64> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        running.check().await;
        let have = nonzero(&counts(settings).await);
        if have == *want || tokio::time::Instant::now() > deadline {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Test settings: unique names, a fresh state dir, small batches.
pub fn settings(base: &str) -> Settings {
    let mut s = super::settings(base);
    let dir = std::env::temp_dir().join(format!("likes-test-{}", s.cql.keyspace));
    s.dedupe.state_dir = dir;
    s.dedupe.instance_id = s.cql.keyspace.clone();
    // The broker's minimum: stopped static members leave the group soonest.
    s.kafka.session_timeout = Duration::from_secs(6);
    s
}

/// Drops the test's keyspace and topics (a passing test leaves nothing behind).
pub async fn teardown(settings: &Settings, topology: &Topology) {
    let session = cql::connect(&settings.cql).await.unwrap();
    // Cleanup only: a slow schema change or topic deletion must not fail a test that passed.
    let _ = likes_testkit::namespace::drop(&session, settings, topology).await;
    let _ = std::fs::remove_dir_all(&settings.dedupe.state_dir);
}

/// Waits until `group` has a live member (a stage started in this process has joined), for
/// at most `timeout`: a test that needs a running stage to refuse something waits for the
/// stage, not for a time a slow box may not meet.
pub async fn wait_for_member(settings: &Settings, group: &str, timeout: Duration) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let deadline = std::time::Instant::now() + timeout;
    loop {
        // Blocking client calls, off the runtime the stages under test share.
        let (s, g) = (settings.clone(), group.to_string());
        let members: usize = tokio::task::spawn_blocking(move || {
            let c: BaseConsumer = kafka::client_config(&s.kafka).create().unwrap();
            c.fetch_group_list(Some(&g), Duration::from_secs(5))
                .map(|l| l.groups().iter().map(|g| g.members().len()).sum())
                .unwrap_or(0)
        })
        .await
        .unwrap();
        if members > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group} has no member after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How far `group` is behind on `topic`: per partition, (partition, committed offset, end).
fn positions(settings: &Settings, group: &str, topic: &str) -> Vec<(i32, Option<i64>, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let mut config = kafka::client_config(&settings.kafka);
    config.set("group.id", group);
    let c: BaseConsumer = config.create().unwrap();
    let t = Duration::from_secs(10);
    // Waited for, not read once: a topic just created may not be listed yet (issue 60), and
    // an empty list would read as "nothing to wait for".
    let partitions =
        likes_testkit::topics::partitions(&c, topic, likes_testkit::topics::METADATA_BOUND)
            .unwrap_or_else(|e| panic!("{e}"));
    let committed = kafka::group::committed(&c, topic, &partitions, t).unwrap();
    committed
        .iter()
        .map(|p| {
            let (_, high) = c.fetch_watermarks(topic, p.partition, t).unwrap();
            (p.partition, p.offset, high)
        })
        .collect()
}

/// Each partition's end offset of `topic`, now.
pub async fn ends(settings: &Settings, topic: &str) -> Vec<(i32, i64)> {
    let (s, t) = (settings.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        // Any group: only the ends are read.
        positions(&s, "likes-test-ends", &t)
            .into_iter()
            .map(|(p, _, high)| (p, high))
            .collect()
    })
    .await
    .unwrap()
}

/// Waits until `group`'s committed offset in every partition of `topic` is at least the
/// given end, for at most `timeout`: the stages are run until they have read their input,
/// however long the box takes, instead of for a fixed time a slow box may not meet.
///
/// Stage 1 commits the offset after its last event, so its group reaches the events' end.
/// Stage 2 commits the first offset of its open window, and stage 1's ticks keep opening
/// windows, so its group never reaches the deltas' end while stage 1 runs; it passes an end
/// taken earlier (after stage 1 caught up) once the window holding it closes.
pub async fn wait_committed_past(
    settings: &Settings,
    group: &str,
    topic: &str,
    ends: &[(i32, i64)],
    timeout: Duration,
) {
    let deadline = std::time::Instant::now() + timeout;
    let want: BTreeMap<i32, i64> = ends.iter().copied().collect();
    loop {
        // Blocking client calls, off the runtime the stages under test share.
        let (s, g, t) = (settings.clone(), group.to_string(), topic.to_string());
        let now = tokio::task::spawn_blocking(move || positions(&s, &g, &t))
            .await
            .unwrap();
        let behind: Vec<_> = now
            .iter()
            .filter(|(p, committed, _)| committed.unwrap_or(0) < want.get(p).copied().unwrap_or(0))
            .map(|(p, committed, _)| (*p, *committed, want.get(p).copied().unwrap_or(0)))
            .collect();
        if behind.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group} has not read {topic} past the ends in {timeout:?}: (partition, committed, end) {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until stage 1 has read every event there is and stage 2 every delta stage 1 wrote
/// for them (two minutes each at most): what a test that runs the stages "until done" needs.
pub async fn wait_stages_done(settings: &Settings, topology: &Topology) {
    let events = settings.topic(&topology.topics.events.name);
    let deltas = settings.topic(&topology.topics.deltas.name);
    let limit = Duration::from_secs(120);
    let events_end = ends(settings, &events).await;
    let dedupe = settings.group(&topology.groups.dedupe);
    wait_committed_past(settings, &dedupe, &events, &events_end, limit).await;
    let deltas_end = ends(settings, &deltas).await;
    let count = settings.group(&topology.groups.count);
    wait_committed_past(settings, &count, &deltas, &deltas_end, limit).await;
}
