//! Issue 43, hole 6b: a region move whose recount left items in flight (an edge flipping
//! past every cut) must keep the range owed and say so, as `likes reconcile` does; before,
//! it cleared `recount_due` and exited 0, and the items' old-home tail was never counted.
//! One datacenter is enough: the range table, the recount and both regions' pipelines are on
//! the dev stack, each region with its own topics.

use std::time::Duration;

use likes::ops::region::Which;

use crate::common::api::{Client, KEY};
use crate::common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_move_whose_recount_left_items_in_flight_keeps_them_owed() {
    let mut a = crate::common::regions::one_datacenter("moveowed");
    a.api.relay_min_age = Duration::from_secs(6);
    a.ops.wait_timeout = Duration::from_secs(120);
    let topology = likes::topology::Topology::load(None).unwrap();
    fx::setup(&a, &topology).await;
    let mut b = a.clone();
    b.region.name = Some("region-b".into());
    b.kafka.topic_prefix = format!("{}b.", a.kafka.topic_prefix);
    likes::cmd::topics::run(&b, &topology).await.unwrap();
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let url = |l: &tokio::net::TcpListener| format!("http://{}", l.local_addr().unwrap());
    a.region.peers = [("region-b".to_string(), url(&lb))].into();
    b.region.peers = [("region-a".to_string(), url(&la))].into();
    likes::ops::region::init(&a, "region-a").await.unwrap();
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
    let api_a = serve(a.clone(), la).await;
    let _api_b = serve(b.clone(), lb).await;
    // Region-b's pipeline (the move's recount goes through it).
    let run_b = fx::start(&b, &topology);
    let item = (0..)
        .map(|n| format!("owed-{n}"))
        .find(|i| likes::region::range_of(i, 4) == 0)
        .unwrap();
    let (s, e) = api_a.like("ned", &item, "k0").await;
    assert_eq!(s.as_u16(), 200, "{e}");

    // At each of the recount's cuts, the edge flips more times than its row remembers
    // (through region-a, which forwards to the new home): in flight at every cut.
    let _turn = crate::ops_jobs::FAILPOINTS.lock().await;
    let (at_cut, cut_reached) = std::sync::mpsc::channel::<()>();
    let (flipped, wait_flipped) = std::sync::mpsc::channel::<()>();
    let (at_cut, wait_flipped) = (
        std::sync::Mutex::new(at_cut),
        std::sync::Mutex::new(wait_flipped),
    );
    fail::cfg_callback("reconcile-after-wait", move || {
        if !crate::common::on_held_job() {
            return;
        }
        let _ = at_cut.lock().unwrap().send(());
        let _ = wait_flipped
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(300));
    })
    .unwrap();
    let job = {
        let (s, t) = (b.clone(), topology.clone());
        crate::common::on_own_runtime(move || async move {
            likes::ops::region::r#move(&s, &t, Which::Ranges(vec![0]), "region-b", true).await
        })
    };
    let cut_reached = std::sync::Arc::new(std::sync::Mutex::new(cut_reached));
    for attempt in 0..3 {
        let c = cut_reached.clone();
        tokio::task::spawn_blocking(move || {
            c.lock().unwrap().recv_timeout(Duration::from_secs(180))
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the recount reaches its cut (attempt {attempt}): {e}"));
        for n in 0..20 {
            let key = format!("k{attempt}-{n}");
            let (s, e) = if n % 2 == 0 {
                api_a.unlike("ned", &item, &key).await
            } else {
                api_a.like("ned", &item, &key).await
            };
            assert_eq!(s.as_u16(), 200, "{e}");
        }
        flipped.send(()).unwrap();
    }
    let report = tokio::task::spawn_blocking(move || job.join().unwrap())
        .await
        .unwrap()
        .unwrap();
    fail::remove("reconcile-after-wait");
    let text = report.to_string();
    let recount = report.recount.as_ref().unwrap();
    assert_eq!(
        recount
            .in_flight
            .iter()
            .map(|f| f.0.clone())
            .collect::<Vec<_>>(),
        vec![item.clone()],
        "{text}"
    );
    assert!(!report.settled(), "{text}");
    let status = likes::ops::region::status(&b).await.unwrap();
    let row = status.rows.iter().find(|r| r.range == 0).unwrap();
    assert!(
        row.home == "region-b" && row.recount_due,
        "the range stays owed while an item of it is unsettled: {row:?}\n{text}"
    );
    assert!(status.to_string().contains("not recounted yet"), "{status}");
    run_b.stop().await;
    fx::teardown(&a, &topology).await;
    fx::teardown(&b, &topology).await;
}
