//! Counts across home regions on the real two-datacenter cluster (`make test-regions`,
//! docs/multi-region.md): each region runs its own API (with its relay), stage 1 and stage 2
//! on its own topics, both writing the shared counter rows. Writes go to both regions (the
//! far one forwards) while ranges move from region-a to region-b and one moves back; every
//! move recounts its items through the new home's pipeline. Then every item's count, read
//! in each region, equals its LIKED edges.
//!
//! The move back is the trap of stage-1 state (trap 3): region-a's stage 1 still remembers
//! the edges from before, while region-b flipped them in between.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::regions::homed_in_a;
use likes::config::Settings;
use likes::ops::region::Which;
use likes::runtime::shutdown::CancellationToken;
use likes::topology::Topology;
use scylla::client::session::Session;

/// Each region's stage 1 keeps its own local state, as its own pods would.
fn own_state(s: &mut Settings, letter: &str) {
    s.dedupe.state_dir =
        std::env::temp_dir().join(format!("likes-test-{}-{letter}", s.cql.keyspace));
    s.dedupe.instance_id = format!("{}-{letter}", s.cql.keyspace);
    s.kafka.session_timeout = Duration::from_secs(6);
    // The cut waits this long past itself; it must exceed the write deadline + CQL timeout.
    s.api.relay_min_age = Duration::from_secs(6);
    s.ops.wait_timeout = Duration::from_secs(120);
}

/// LIKED edges per item, as the store reads them.
async fn liked_edges(session: &Arc<Session>, ks: &str) -> BTreeMap<String, i64> {
    likes_testkit::truth::liked_per_item(session, ks)
        .await
        .unwrap()
}

/// What the load did: requests by HTTP status.
#[derive(Default)]
struct Load {
    by_status: std::sync::Mutex<BTreeMap<u16, u64>>,
    sent: AtomicU64,
}

/// Workers flipping random edges of `items` through either region until `stop`.
fn start_load(
    apis: [Arc<common::api::Client>; 2],
    items: Vec<String>,
    stop: Arc<AtomicBool>,
    load: Arc<Load>,
) -> Vec<tokio::task::JoinHandle<BTreeMap<String, i64>>> {
    (0..4u64)
        .map(|w| {
            let (apis, items, stop, load) =
                (apis.clone(), items.clone(), stop.clone(), load.clone());
            tokio::spawn(async move {
                // Each worker owns its users, so it knows each edge's state it asked for.
                let mut liked: HashMap<(usize, u64), bool> = HashMap::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (i, u) = (
                        rand::random_range(0..items.len()),
                        w * 100 + rand::random_range(0..6u64),
                    );
                    let like = !liked.get(&(i, u)).copied().unwrap_or(false);
                    let (user, key) = (format!("u{u}"), format!("w{w}-{n}"));
                    // A 503 may come after the flip applied (its deadline, a datacenter gone):
                    // the client retries with the same key, at either region, until it gets
                    // the answer, as the API asks.
                    let started = std::time::Instant::now();
                    loop {
                        let api = &apis[rand::random_range(0..2)];
                        let (st, body) = if like {
                            api.like(&user, &items[i], &key).await
                        } else {
                            api.unlike(&user, &items[i], &key).await
                        };
                        load.sent.fetch_add(1, Ordering::Relaxed);
                        *load
                            .by_status
                            .lock()
                            .unwrap()
                            .entry(st.as_u16())
                            .or_default() += 1;
                        if st == 200 {
                            liked.insert((i, u), like);
                            break;
                        }
                        assert!(
                            st.is_server_error() && started.elapsed() < Duration::from_secs(90),
                            "{st} {body} for {key} after {:?}",
                            started.elapsed()
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let mut per_item: BTreeMap<String, i64> = BTreeMap::new();
                for ((i, _), l) in liked {
                    if l {
                        *per_item.entry(items[i].clone()).or_default() += 1;
                    }
                }
                per_item
            })
        })
        .collect()
}

/// Both regions' APIs (with their relays) on one fresh two-datacenter keyspace, each
/// forwarding to the other, and the two ranges that move.
struct Regions {
    a: Settings,
    b: Settings,
    topology: Topology,
    session: Arc<Session>,
    apis: [Arc<common::api::Client>; 2],
    items: Vec<String>,
    /// Two ranges to region-b, the first of them back.
    ranges: (i32, i32),
    stop_relays: CancellationToken,
}

async fn two_regions(name: &str) -> Regions {
    let (mut a, mut b, topology, session) = homed_in_a(name).await;
    own_state(&mut a, "a");
    own_state(&mut b, "b");
    let (la, lb) = common::regions::peered(&mut a, &mut b).await;
    let stop_relays = CancellationToken::new();
    let api_a = Arc::new(common::regions::serve(la, &a, &topology, Some(&stop_relays)).await);
    let api_b = Arc::new(common::regions::serve(lb, &b, &topology, Some(&stop_relays)).await);
    let items: Vec<String> = (0..16).map(|i| format!("item-{i}")).collect();
    let range_of = |i: &str| likes::region::range_of(i, 4);
    let r1 = range_of(&items[0]);
    let r2 = items
        .iter()
        .map(|i| range_of(i))
        .find(|&r| r != r1)
        .unwrap();
    Regions {
        a,
        b,
        topology,
        session,
        apis: [api_a, api_b],
        items,
        ranges: (r1, r2),
        stop_relays,
    }
}

impl Regions {
    /// Moves `ranges` to `to`, with the recount, run with the new home's configuration.
    async fn move_to(&self, ranges: Vec<i32>, to: &str) -> likes::ops::region::MoveReport {
        let s = if to == "region-a" { &self.a } else { &self.b };
        let t = std::time::Instant::now();
        let report = likes::ops::region::r#move(s, &self.topology, Which::Ranges(ranges), to, true)
            .await
            .unwrap_or_else(|e| panic!("move to {to}: {e}"));
        println!("move to {to} under load: {:?}\n{report}", t.elapsed());
        assert!(
            report.recount.as_ref().unwrap().in_flight.is_empty(),
            "{report}"
        );
        report
    }

    /// Stops the load and returns what the clients were answered, LIKED edges per item.
    async fn stop_load(
        &self,
        stop: Arc<AtomicBool>,
        workers: Vec<tokio::task::JoinHandle<BTreeMap<String, i64>>>,
        load: &Load,
    ) -> BTreeMap<String, i64> {
        stop.store(true, Ordering::Relaxed);
        let mut believed: BTreeMap<String, i64> = BTreeMap::new();
        for w in workers {
            for (i, n) in w.await.unwrap() {
                *believed.entry(i).or_default() += n;
            }
        }
        println!(
            "load: {} requests, by status {:?}",
            load.sent.load(Ordering::Relaxed),
            load.by_status.lock().unwrap()
        );
        assert!(
            load.by_status
                .lock()
                .unwrap()
                .get(&200)
                .copied()
                .unwrap_or(0)
                > 100,
            "too few writes went through to mean anything"
        );
        let truth = liked_edges(&self.session, &self.a.cql.keyspace).await;
        assert!(truth.len() >= 8, "the load liked too little: {truth:?}");
        assert_eq!(
            believed, truth,
            "the edges hold what the clients were answered"
        );
        truth
    }

    async fn teardown(self) {
        self.stop_relays.cancel();
        common::topology::teardown(&self.b, &self.topology).await;
        common::topology::teardown(&self.a, &self.topology).await;
    }
}

/// Counts read in each region's datacenter against the LIKED edges.
fn assert_counts(
    in_a: &BTreeMap<String, i64>,
    in_b: &BTreeMap<String, i64>,
    truth: &BTreeMap<String, i64>,
) {
    assert_eq!(
        in_a, truth,
        "counts read in region-a against the LIKED edges"
    );
    assert_eq!(
        in_b, truth,
        "counts read in region-b against the LIKED edges"
    );
}

/// The tests here run both regions' pipelines, and one takes region-b's node down: one at a
/// time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn counts_stay_exact_in_both_regions_while_ranges_move_under_load() {
    let _one = ONE_AT_A_TIME.lock().await;
    let r = two_regions("regions_count").await;
    let _stop_relays = r.stop_relays.clone().drop_guard();
    let mut pipe_a = common::topology::start(&r.a, &r.topology);
    let mut pipe_b = common::topology::start(&r.b, &r.topology);
    let (r1, r2) = r.ranges;

    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let workers = start_load(r.apis.clone(), r.items.clone(), stop.clone(), load.clone());
    tokio::time::sleep(Duration::from_secs(8)).await;
    let to_b = r.move_to(vec![r1, r2], "region-b").await;
    assert_eq!(to_b.moved.len(), 2);
    tokio::time::sleep(Duration::from_secs(8)).await;
    // And one back: region-a's stage 1 remembers these edges from before region-b flipped them.
    let to_a = r.move_to(vec![r1], "region-a").await;
    assert_eq!(to_a.moved, vec![r1]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let truth = r.stop_load(stop, workers, &load).await;

    // Both pipelines settle on the truth, and each region's datacenter reads it.
    let in_a =
        common::topology::wait_for_counts(&mut pipe_a, &r.a, &truth, Duration::from_secs(60)).await;
    pipe_b.check().await;
    let in_b =
        common::topology::wait_for_counts(&mut pipe_b, &r.b, &truth, Duration::from_secs(10)).await;
    let (dedupe_a, count_a) = pipe_a.stop().await;
    let (dedupe_b, count_b) = pipe_b.stop().await;
    println!(
        "region-a: stage 1 {dedupe_a:?}\n  stage 2 {count_a:?}\nregion-b: stage 1 {dedupe_b:?}\n  stage 2 {count_b:?}"
    );
    assert_counts(&in_a, &in_b, &truth);
    r.teardown().await;
}

/// A region's stages as `likes dedupe` and `likes count` child processes, pinned to its
/// datacenter like its pods.
fn region_stages(s: &Settings, dir: &std::path::Path, letter: &str) -> [common::procs::Stage; 2] {
    let node = if letter == "a" {
        "127.0.0.2"
    } else {
        "127.0.0.3"
    };
    let mut env = common::procs::stage_env(s, &dir.join(format!("audit-{letter}.log")));
    for (k, v) in [
        ("LIKES__REGION__NAME", s.region.name.clone().unwrap()),
        ("LIKES__REGION__RANGES", "4".into()),
        ("LIKES__REGION__LEASE", "1s".into()),
        ("LIKES__REGION__REFRESH", "200ms".into()),
        ("LIKES__CQL__NODES", format!("[\"{node}:9042\"]")),
        (
            "LIKES__CQL__LOCAL_DATACENTER",
            s.region.name.clone().unwrap(),
        ),
        ("LIKES__CQL__REQUEST_TIMEOUT", "3s".into()),
        // The fence `likes region init` recorded is the test's 6 s: lease, deadline, timeout.
        ("LIKES__API__WRITE_DEADLINE", "2s".into()),
    ] {
        env.push((k.into(), v));
    }
    [
        common::procs::Stage::named("dedupe", &format!("dedupe-{letter}"), env.clone(), dir),
        common::procs::Stage::named("count", &format!("count-{letter}"), env, dir),
    ]
}

/// Starts the regions' nodes again when dropped, so a failing test leaves them running.
struct RegionsUpOnDrop;

impl Drop for RegionsUpOnDrop {
    fn drop(&mut self) {
        let _ = likes_testkit::stack::up_regions(&likes_testkit::stack::script());
    }
}

/// The seed of the fault schedule (`LIKES_REGIONS_SEED`, else 1): `make chaos-regions RUNS=N`
/// runs seeds 1 to N.
fn seed() -> u64 {
    std::env::var("LIKES_REGIONS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

impl Regions {
    /// A move as an operator runs it while a region misbehaves: run again while it refuses
    /// with a retryable reason (a datacenter that does not answer), up to 3 minutes.
    async fn move_retrying(&self, ranges: Vec<i32>, to: &str) -> likes::ops::region::MoveReport {
        let s = if to == "region-a" { &self.a } else { &self.b };
        let t = std::time::Instant::now();
        loop {
            match likes::ops::region::r#move(
                s,
                &self.topology,
                Which::Ranges(ranges.clone()),
                to,
                true,
            )
            .await
            {
                Ok(report) => {
                    println!("move to {to} under faults: {:?}\n{report}", t.elapsed());
                    assert!(
                        report.recount.as_ref().unwrap().in_flight.is_empty(),
                        "{report}"
                    );
                    return report;
                }
                Err(e) if e.is_retryable() && t.elapsed() < Duration::from_secs(180) => {
                    println!(
                        "move to {to} refused after {:?}, run again: {e}",
                        t.elapsed()
                    );
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                Err(e) => panic!("move to {to}: {e}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn counts_stay_exact_when_either_regions_stages_and_nodes_die_during_moves() {
    use rand::{Rng, SeedableRng};
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let r = two_regions("regions_kill").await;
    let _stop_relays = r.stop_relays.clone().drop_guard();
    let _up = RegionsUpOnDrop;
    let dir = std::env::temp_dir().join(format!("likes-test-{}", r.a.cql.keyspace));
    std::fs::create_dir_all(&dir).unwrap();
    let [dedupe_a, count_a] = region_stages(&r.a, &dir, "a");
    let [dedupe_b, count_b] = region_stages(&r.b, &dir, "b");
    let mut stages = [dedupe_a, count_a, dedupe_b, count_b];
    let labels = ["dedupe-a", "count-a", "dedupe-b", "count-b"];
    for s in &mut stages {
        s.start();
    }
    let (r1, r2) = r.ranges;
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let workers = start_load(r.apis.clone(), r.items.clone(), stop.clone(), load.clone());
    tokio::time::sleep(Duration::from_secs(6)).await;

    // Three moves (two ranges to region-b, one back, the other back), each with one or two
    // stages of either region killed -9 inside it; between moves, now and then, a region's
    // Cassandra node killed -9 and started again.
    let mut faults = Vec::new();
    for (ranges, to) in [
        (vec![r1, r2], "region-b"),
        (vec![r1], "region-a"),
        (vec![r2], "region-a"),
    ] {
        let mut victims: Vec<usize> = (0..4).collect();
        victims.retain(|_| rng.random_bool(0.5));
        if victims.is_empty() {
            victims.push(rng.random_range(0..4));
        }
        let at = Duration::from_millis(rng.random_range(500..5000));
        let down = Duration::from_millis(rng.random_range(500..3000));
        faults.push(format!(
            "move to {to}: kill -9 {:?} at {at:?} for {down:?}",
            victims.iter().map(|&v| labels[v]).collect::<Vec<_>>()
        ));
        let mover = r.move_retrying(ranges, to);
        let stages = &mut stages;
        let kills = async {
            tokio::time::sleep(at).await;
            for &v in &victims {
                stages[v].kill9();
            }
            tokio::time::sleep(down).await;
            for &v in &victims {
                stages[v].start();
            }
        };
        tokio::join!(mover, kills);
        if rng.random_bool(0.5) {
            let node = ["cassandra-region-a", "cassandra-region-b"][rng.random_range(0..2)];
            let down = Duration::from_millis(rng.random_range(3000..8000));
            faults.push(format!("kill -9 {node} for {down:?}"));
            likes_testkit::stack::kill9(&likes_testkit::stack::dir(), node).unwrap();
            tokio::time::sleep(down).await;
            likes_testkit::stack::up_regions(&likes_testkit::stack::script()).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    println!("seed {seed}: {faults:#?}");
    let truth = r.stop_load(stop, workers, &load).await;

    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let (mut in_a, mut in_b);
    loop {
        for s in &mut stages {
            s.assert_alive();
        }
        in_a = common::topology::nonzero(&common::topology::counts(&r.a).await);
        in_b = common::topology::nonzero(&common::topology::counts(&r.b).await);
        if (in_a == truth && in_b == truth) || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for s in &mut stages {
        s.stop();
    }
    assert_counts(&in_a, &in_b, &truth);
    r.teardown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
