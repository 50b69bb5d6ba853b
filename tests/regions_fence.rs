//! Issue 43, hole 6a: a lease is not a fence unless the writer checks it where it counts. A
//! write of the old home held between its start and its compare-and-set (a GC or VM pause,
//! SIGSTOP) across a whole move must not land on the edge after the new home wrote it: it
//! would flip an edge the new home now owns, after the move's recount, and the new home's
//! next flip would take it as the counted baseline: ±1 for good. Its
//! own test binary: the hold is a fail point on the write path, process-wide, and runs on
//! the dev stack's one datacenter (the range table is the API's, not Cassandra's).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use common::api::{Client, KEY};
use common::topology as fx;
use likes::ops::region::Which;

/// Fail points are process-wide: one test of this binary holds them at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Region-a and region-b on the dev stack's one datacenter, each naming the other's listener
/// as its peer; every range homed in region-a.
async fn two_regions(
    name: &str,
) -> (
    likes::config::Settings,
    likes::config::Settings,
    likes::topology::Topology,
    (tokio::net::TcpListener, tokio::net::TcpListener),
) {
    let mut a = common::regions::one_datacenter(name);
    let topology = likes::topology::Topology::load(None).unwrap();
    fx::setup(&a, &topology).await;
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let url = |l: &tokio::net::TcpListener| format!("http://{}", l.local_addr().unwrap());
    let mut b = a.clone();
    b.region.name = Some("region-b".into());
    a.region.peers = [("region-b".to_string(), url(&lb))].into();
    b.region.peers = [("region-a".to_string(), url(&la))].into();
    likes::ops::region::init(&a, "region-a").await.unwrap();
    (a, b, topology, (la, lb))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_write_held_across_a_whole_move_never_lands_after_the_new_home() {
    let _turn = TURN.lock().await;
    let (a, b, topology, (la, lb)) = two_regions("fence").await;
    let url = |l: &tokio::net::TcpListener| format!("http://{}", l.local_addr().unwrap());
    let a_url = url(&la);
    let serve = |s: likes::config::Settings, l: tokio::net::TcpListener| {
        let topology = topology.clone();
        async move {
            let base = url(&l);
            let app = likes::api::App::connect(&s, &topology).await.unwrap();
            tokio::spawn(async move { axum::serve(l, likes::api::router(app)).await });
            Client {
                http: reqwest::Client::new(),
                base,
                signer: likes::api::auth::Signer::new(KEY.as_bytes()),
            }
        }
    };
    // Region-a on a runtime of its own: the hold blocks one of its threads, and a task
    // parked behind it (a worker's next-task slot cannot be stolen) must be region-a's, not
    // the test's or region-b's.
    let api_a = {
        let (a, topology, la) = (a.clone(), topology.clone(), la.into_std().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(la).unwrap();
                let app = likes::api::App::connect(&a, &topology).await.unwrap();
                let _ = tx.send(());
                axum::serve(l, likes::api::router(app)).await
            })
        });
        rx.await.unwrap();
        std::sync::Arc::new(Client {
            http: reqwest::Client::new(),
            base: a_url,
            signer: likes::api::auth::Signer::new(KEY.as_bytes()),
        })
    };
    let api_b = serve(b.clone(), lb).await;
    let item = (0..)
        .map(|n| format!("fenced-{n}"))
        .find(|i| likes::region::range_of(i, 4) == 0)
        .unwrap();
    let (s, e) = api_a.like("ned", &item, "k0").await;
    assert_eq!(s.as_u16(), 200, "{e}");

    // Region-a's next write is held right before its compare-and-set.
    let (at_cas, held) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let (at_cas, released) = (Mutex::new(at_cas), Mutex::new(released));
    let first = AtomicBool::new(true);
    fail::cfg_callback("api-before-cas", move || {
        if first.swap(false, Ordering::SeqCst) {
            let _ = at_cas.lock().unwrap().send(());
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(300));
        }
    })
    .unwrap();
    let stale = {
        let (api_a, item) = (api_a.clone(), item.clone());
        tokio::spawn(async move { api_a.unlike("ned", &item, "k1").await })
    };
    tokio::task::spawn_blocking(move || held.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("region-a's unlike reaches its compare-and-set");

    // A whole move meanwhile: bump, the fence (lease + deadline + CQL timeout), settle.
    let mut mover = a.clone();
    mover.region.name = Some("region-b".into());
    likes::ops::region::r#move(&mover, &topology, Which::Ranges(vec![0]), "region-b", false)
        .await
        .unwrap();
    // The new home now writes the range (the edge itself it leaves alone).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (s, e) = api_b.like("other", &item, "o1").await;
        if s.as_u16() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "region-b never wrote: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The old home's write wakes, a whole fence late: it must not land.
    let t = std::time::Instant::now();
    release.send(()).unwrap();
    let (s, e) = stale.await.unwrap();
    fail::remove("api-before-cas");
    println!("the held write answered {s} after {:?}: {e}", t.elapsed());
    assert_eq!(s.as_u16(), 503, "the held write must fail: {e}");
    let (_, liked) = api_b
        .get("ned", &format!("/v1/items/{item}/likes/ned"))
        .await;
    assert_eq!(
        liked["liked"],
        serde_json::json!(true),
        "the edge is as it was when the range moved: {liked}"
    );
    // The new home's own flip of it counts from there.
    let (s, e) = api_b.unlike("ned", &item, "k2").await;
    assert_eq!((s.as_u16(), e["opId"].as_i64()), (200, Some(2)), "{e}");
    fx::teardown(&a, &topology).await;
}

/// Issue 56, item 3: the check above bounds when the old home *sends* a compare-and-set, not
/// when it lands. Region-a's unlike is on the wire (fail point `api-cas-in-flight`) when its
/// deadline answers 503; the range moves; the new home's relay takes region-a's leftover
/// entry, finds no flip of it on the row and drops it, fencing the row first
/// (docs/exactness.md, "The row fence"). The statement then lands: it must change nothing,
/// or the edge would be unliked with no event left to count it, after the move's recount.
/// With every compare-and-set at `SERIAL` (docs/multi-region.md, "Paxos scope"), the new
/// home's fence and the old home's round are one Paxos group's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_statement_of_the_old_home_that_lands_after_the_new_homes_relay_dropped_its_entry_changes_nothing(
) {
    let _turn = TURN.lock().await;
    let (a, b, topology, (la, lb)) = two_regions("latemove").await;
    let api_a = std::sync::Arc::new(common::regions::serve(la, &a, &topology, None).await);
    let api_b = common::regions::serve(lb, &b, &topology, None).await;
    let item = (0..)
        .map(|n| format!("late-{n}"))
        .find(|i| likes::region::range_of(i, 4) == 0)
        .unwrap();
    let (s, e) = api_a.like("ned", &item, "k0").await;
    assert_eq!(s.as_u16(), 200, "{e}");

    // Region-a's unlike: its statement stalls on the wire, its deadline answers.
    let hold = common::Hold::first_at("api-cas-in-flight");
    let (landed_tx, landed) = mpsc::channel::<()>();
    let landed_tx = Mutex::new(landed_tx);
    fail::cfg_callback("api-cas-landed", move || {
        let _ = landed_tx.lock().unwrap().send(());
    })
    .unwrap();
    let stale = {
        let (api_a, item) = (api_a.clone(), item.clone());
        tokio::spawn(async move { api_a.unlike("ned", &item, "k1").await })
    };
    hold.reached().await;
    let (s, e) = stale.await.unwrap();
    assert_eq!(
        s.as_u16(),
        503,
        "the stalled write gives up at its deadline: {e}"
    );

    // The range moves; the new home's relay takes the old home's entry and drops it.
    common::regions::move_only(&a, Which::Ranges(vec![0]), "region-b")
        .await
        .unwrap();
    let relay_b = likes::relay::Relay::connect(&b, &topology).await.unwrap();
    let pass = likes::relay::pass(&relay_b, Duration::ZERO).await.unwrap();
    assert!(
        pass.stale >= 1 && pass.failed == 0,
        "the unlike's entry, no flip of it on the row, is dropped by the new home: {pass:?}"
    );

    // The statement lands now, after the move and the drop.
    hold.release();
    tokio::task::spawn_blocking(move || landed.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("the stalled statement lands");
    fail::remove("api-cas-landed");
    let (_, liked) = api_b
        .get("ned", &format!("/v1/items/{item}/likes/ned"))
        .await;
    assert_eq!(
        liked["liked"],
        serde_json::json!(true),
        "a statement aimed before the new home fenced the row must not change it: {liked}"
    );
    // The client's keyed retry reaches the new home and is made there, as a new flip.
    let (s, e) = api_b.unlike("ned", &item, "k1").await;
    assert_eq!(
        (s.as_u16(), e["changed"].clone(), e["opId"].as_i64()),
        (200, serde_json::json!(true), Some(2)),
        "{e}"
    );
    fx::teardown(&a, &topology).await;
}
