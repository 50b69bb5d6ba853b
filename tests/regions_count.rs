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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn counts_stay_exact_in_both_regions_while_ranges_move_under_load() {
    let (mut a, mut b, topology, session) = homed_in_a("regions_count").await;
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
    let _stop_relays = stop_relays.clone().drop_guard();
    let api_a = Arc::new(region_api(la, &a, &topology, &stop_relays).await);
    let api_b = Arc::new(region_api(lb, &b, &topology, &stop_relays).await);
    let mut pipe_a = common::topology::start(&a, &topology);
    let mut pipe_b = common::topology::start(&b, &topology);

    // Items in every range; two ranges move to region-b, and one of them back.
    let items: Vec<String> = (0..16).map(|i| format!("item-{i}")).collect();
    let range_of = |i: &str| likes::region::range_of(i, 4);
    let (r1, r2) = (range_of(&items[0]), range_of(&items[1]));
    let r2 = if r2 == r1 {
        items
            .iter()
            .map(|i| range_of(i))
            .find(|&r| r != r1)
            .unwrap()
    } else {
        r2
    };

    let stop = Arc::new(AtomicBool::new(false));
    let load = Arc::new(Load::default());
    let workers = start_load(
        [api_a.clone(), api_b.clone()],
        items.clone(),
        stop.clone(),
        load.clone(),
    );
    tokio::time::sleep(Duration::from_secs(8)).await;

    // To region-b, run with region-b's configuration: its pipeline takes the old home's tail.
    let t = std::time::Instant::now();
    let to_b =
        likes::ops::region::r#move(&b, &topology, Which::Ranges(vec![r1, r2]), "region-b", true)
            .await
            .expect("move to region-b");
    println!(
        "move of ranges {r1}, {r2} to region-b under load: {:?}\n{to_b}",
        t.elapsed()
    );
    assert_eq!(to_b.moved.len(), 2);
    assert!(
        to_b.recount.as_ref().unwrap().in_flight.is_empty(),
        "{to_b}"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;

    // And one back: region-a's stage 1 remembers these edges from before region-b flipped them.
    let t = std::time::Instant::now();
    let to_a = likes::ops::region::r#move(&a, &topology, Which::Ranges(vec![r1]), "region-a", true)
        .await
        .expect("move back to region-a");
    println!(
        "move of range {r1} back to region-a under load: {:?}\n{to_a}",
        t.elapsed()
    );
    assert_eq!(to_a.moved, vec![r1]);
    tokio::time::sleep(Duration::from_secs(8)).await;

    stop.store(true, Ordering::Relaxed);
    let mut believed: BTreeMap<String, i64> = BTreeMap::new();
    for w in workers {
        for (i, n) in w.await.unwrap() {
            *believed.entry(i).or_default() += n;
        }
    }
    println!("the clients believe {believed:?}");
    println!(
        "load: {} requests, by status {:?}",
        load.sent.load(Ordering::Relaxed),
        load.by_status.lock().unwrap()
    );

    // Both pipelines settle on the truth, and each region's datacenter reads it.
    let truth = liked_edges(&session, &a.cql.keyspace).await;
    assert!(truth.len() >= 8, "the load liked too little: {truth:?}");
    let in_a =
        common::topology::wait_for_counts(&mut pipe_a, &a, &truth, Duration::from_secs(60)).await;
    pipe_b.check().await;
    let in_b =
        common::topology::wait_for_counts(&mut pipe_b, &b, &truth, Duration::from_secs(10)).await;
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
    stop_relays.cancel();
    common::topology::teardown(&b, &topology).await;
    common::topology::teardown(&a, &topology).await;
}
