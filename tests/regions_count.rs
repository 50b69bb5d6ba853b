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

/// One region's API (and the relay beside it, as `likes api` runs it) on `listener`.
async fn region_api(
    listener: tokio::net::TcpListener,
    settings: &Settings,
    topology: &Topology,
    stop: &CancellationToken,
) -> common::api::Client {
    let app = likes::api::App::connect(settings, topology)
        .await
        .expect("api");
    let relay = likes::relay::Relay::prepare(
        app.session.clone(),
        app.events.clone(),
        app.writer.routes().cloned(),
        settings,
        topology,
    )
    .await
    .expect("relay");
    tokio::spawn(likes::relay::run(
        Arc::new(relay),
        Duration::from_secs(1),
        settings.api.relay_min_age,
        stop.clone(),
    ));
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, likes::api::router(app)).await });
    common::api::Client {
        http: reqwest::Client::new(),
        base: url,
        signer: likes::api::auth::Signer::new(common::api::KEY.as_bytes()),
    }
}

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
    let edges = likes::store::edges::Edges::prepare(session.clone(), ks)
        .await
        .unwrap();
    edges.liked_per_item().await.unwrap()
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
                    let api = &apis[rand::random_range(0..2)];
                    let (user, key) = (format!("u{u}"), format!("w{w}-{n}"));
                    let (st, _) = if like {
                        api.like(&user, &items[i], &key).await
                    } else {
                        api.unlike(&user, &items[i], &key).await
                    };
                    if st == 200 {
                        liked.insert((i, u), like);
                    }
                    load.sent.fetch_add(1, Ordering::Relaxed);
                    *load
                        .by_status
                        .lock()
                        .unwrap()
                        .entry(st.as_u16())
                        .or_default() += 1;
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
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let url = |l: &tokio::net::TcpListener| format!("http://{}", l.local_addr().unwrap());
    a.region.peers = [("region-b".to_string(), url(&lb))].into();
    b.region.peers = [("region-a".to_string(), url(&la))].into();
    let stop_relays = CancellationToken::new();
    let api_a = Arc::new(region_api(la, &a, &topology, &stop_relays).await);
    let api_b = Arc::new(region_api(lb, &b, &topology, &stop_relays).await);
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
    assert_eq!(
        in_a, truth,
        "counts read in region-a against the LIKED edges"
    );
    assert_eq!(
        in_b, truth,
        "counts read in region-b against the LIKED edges"
    );
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
        let _ = likes_support::stack::up_regions(&likes_support::stack::script());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn counts_stay_exact_when_either_regions_stages_and_node_die_during_moves() {
    let _one = ONE_AT_A_TIME.lock().await;
    let r = two_regions("regions_kill").await;
    let _stop_relays = r.stop_relays.clone().drop_guard();
    let dir = std::env::temp_dir().join(format!("likes-test-{}", r.a.cql.keyspace));
    std::fs::create_dir_all(&dir).unwrap();
    let [mut dedupe_a, mut count_a] = region_stages(&r.a, &dir, "a");
    let [mut dedupe_b, mut count_b] = region_stages(&r.b, &dir, "b");
    for s in [&mut dedupe_a, &mut count_a, &mut dedupe_b, &mut count_b] {
        s.start();
    }
    let (r1, r2) = r.ranges;
    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let workers = start_load(r.apis.clone(), r.items.clone(), stop.clone(), load.clone());
    tokio::time::sleep(Duration::from_secs(6)).await;

    // The old home's count dies inside the move's fence; the new home's stage 1 right after.
    let to_b = {
        let mover = r.move_to(vec![r1, r2], "region-b");
        let kills = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            count_a.kill9();
            tokio::time::sleep(Duration::from_secs(1)).await;
            count_a.start();
        };
        let (report, ()) = tokio::join!(mover, kills);
        report
    };
    assert_eq!(to_b.moved.len(), 2);
    dedupe_b.kill9();
    tokio::time::sleep(Duration::from_secs(1)).await;
    dedupe_b.start();
    tokio::time::sleep(Duration::from_secs(4)).await;

    // Region-b's Cassandra node dies: no conditional write anywhere (they need both
    // datacenters), region-b's views of the range table run out; then it comes back.
    let _up = RegionsUpOnDrop;
    likes_support::stack::kill9(&likes_support::stack::dir(), "cassandra-region-b").unwrap();
    println!("cassandra-region-b killed");
    tokio::time::sleep(Duration::from_secs(5)).await;
    likes_support::stack::up_regions(&likes_support::stack::script()).unwrap();
    println!("cassandra-region-b back");
    tokio::time::sleep(Duration::from_secs(5)).await;

    // One range back, with the old home's count and the new home's stage 1 killed inside it.
    let to_a = {
        let mover = r.move_to(vec![r1], "region-a");
        let kills = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            count_b.kill9();
            dedupe_a.kill9();
            tokio::time::sleep(Duration::from_secs(1)).await;
            count_b.start();
            dedupe_a.start();
        };
        let (report, ()) = tokio::join!(mover, kills);
        report
    };
    assert_eq!(to_a.moved, vec![r1]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let truth = r.stop_load(stop, workers, &load).await;

    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let (mut in_a, mut in_b);
    loop {
        for s in [&mut dedupe_a, &mut count_a, &mut dedupe_b, &mut count_b] {
            s.assert_alive();
        }
        in_a = common::topology::nonzero(&common::topology::counts(&r.a).await);
        in_b = common::topology::nonzero(&common::topology::counts(&r.b).await);
        if (in_a == truth && in_b == truth) || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for s in [&mut dedupe_a, &mut count_a, &mut dedupe_b, &mut count_b] {
        s.stop();
    }
    assert_eq!(
        in_a, truth,
        "counts read in region-a against the LIKED edges"
    );
    assert_eq!(
        in_b, truth,
        "counts read in region-b against the LIKED edges"
    );
    r.teardown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
