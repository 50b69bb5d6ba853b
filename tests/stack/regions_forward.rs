//! Issue 43, hole 6c: a forward to a slow or hung home region must not shed this region's own
//! writes. A forwarded write held its admission permit for the whole forward (up to the
//! home's deadline and one CQL timeout) and fed its latency to the adaptive limit, so a peer
//! that accepts TCP and never answers took every slot: from outside, region-a answered 503 to
//! 57 % of its own items' writes with region-b SIGSTOPped. Here the hung peer is a listener
//! that accepts and never answers, which holds the moment on any box. One datacenter is
//! enough: the range table and the forward are the API's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::api::{Client, ADMIN, KEY};
use crate::common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_home_region_sheds_only_its_own_forwards() {
    // A peer that accepts every connection and never answers.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = hung.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                held.push(sock);
            }
        });
    }

    let mut s = fx::settings("fwdhung");
    s.api.session_key = KEY.into();
    s.api.admin_token = ADMIN.into();
    s.region.name = Some("region-a".into());
    s.region.ranges = 4;
    s.region.lease = Duration::from_secs(1);
    s.region.refresh = Duration::from_millis(200);
    s.region.peers = [("region-b".to_string(), hung_url)].into();
    // A forward waits up to the home's deadline and one CQL timeout: 10 s, the hold.
    s.api.write_deadline = Duration::from_secs(5);
    s.cql.request_timeout = Duration::from_secs(5);
    s.api.relay_min_age = Duration::from_secs(12);
    s.api.relay = false;
    // A fixed bound of 8 writes in flight, and forwards bounded on their own at 4.
    s.api.max_writes_in_flight = 8;
    s.api.write_latency_target = Duration::ZERO;
    s.region.max_forwards_in_flight = 4;
    let topology = likes::topology::Topology::load(None).unwrap();
    fx::setup(&s, &topology).await;
    likes::ops::region::init(&s, "region-a").await.unwrap();
    let theirs = |i: &str| likes::region::range_of(i, 4) == 0;
    crate::common::regions::move_only(&s, likes::ops::region::Which::Ranges(vec![0]), "region-b")
        .await
        .unwrap();

    let app = likes::api::App::connect(&s, &topology).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, likes::api::router(app)).await });
    let client = Arc::new(Client {
        http: reqwest::Client::new(),
        base,
        signer: likes::api::auth::Signer::new(KEY.as_bytes()),
    });
    let items = |mine: bool| -> Vec<String> {
        (0..)
            .map(|n| format!("fwd-{n}"))
            .filter(|i| theirs(i) != mine)
            .take(12)
            .collect()
    };
    let (forwarded, own) = (items(false), items(true));

    // Twelve writes of region-b's items at once: each is forwarded to the hung peer.
    let answered = Arc::new(AtomicUsize::new(0));
    let mut pending = Vec::new();
    for (n, item) in forwarded.iter().enumerate() {
        let (client, item, answered) = (client.clone(), item.clone(), answered.clone());
        pending.push(tokio::spawn(async move {
            let r = client
                .like(&format!("f{n}"), &item, &format!("kf{n}"))
                .await;
            answered.fetch_add(1, Ordering::SeqCst);
            r
        }));
    }
    // Every one of them is either held by the peer or already answered.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while accepted.load(Ordering::SeqCst) + answered.load(Ordering::SeqCst) < forwarded.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "the forwards never settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = accepted.load(Ordering::SeqCst);

    // Meanwhile, this region's own writes are all answered.
    let mut shed = Vec::new();
    for (n, item) in own.iter().take(8).enumerate() {
        let (s, b) = client.like(&format!("o{n}"), item, &format!("ko{n}")).await;
        if s != reqwest::StatusCode::OK {
            shed.push((item.clone(), s.as_u16(), b.to_string()));
        }
    }
    assert!(
        shed.is_empty(),
        "{} of 8 own writes refused while {held} forwards hung: {shed:?}",
        shed.len()
    );
    assert!(held <= 4, "forwards in flight past their own bound: {held}");
    // The forwards past that bound are refused at once, with the reason.
    let mut refused = 0;
    for p in pending {
        let (s, b) = p.await.unwrap();
        assert_eq!(s.as_u16(), 503, "{b}");
        if b["message"]
            .as_str()
            .unwrap_or("")
            .contains("max_forwards_in_flight")
        {
            refused += 1;
        }
    }
    assert_eq!(refused, forwarded.len() - held, "the rest said why");
    fx::teardown(&s, &topology).await;
}

/// Issue 43, hole 6d: an operator's retraction of another region's item is forwarded to its
/// home like a user's write (before: 503 `not_home` for ever, to a tool that retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_retraction_of_another_regions_item_is_forwarded_to_its_home() {
    let mut a = crate::common::regions::one_datacenter("fwdretract");
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
    crate::common::regions::move_only(&a, likes::ops::region::Which::Ranges(vec![0]), "region-b")
        .await
        .unwrap();
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
    let (api_a, api_b) = (serve(a.clone(), la).await, serve(b.clone(), lb).await);
    let item = (0..)
        .map(|n| format!("retract-{n}"))
        .find(|i| likes::region::range_of(i, 4) == 0)
        .unwrap();
    let (s, e) = api_b.like("uma", &item, "k1").await;
    assert_eq!(s.as_u16(), 200, "{e}");

    // The operator asks region-a, which is not the item's home.
    let r = api_a
        .http
        .post(format!("{}/v1/admin/retractions", api_a.base))
        .header("X-Admin-Token", ADMIN)
        .header("Idempotency-Key", "retract-1")
        .json(&serde_json::json!({ "itemId": item, "userId": "uma", "reason": "abuse report 7" }))
        .send()
        .await
        .unwrap();
    let (status, by) = (
        r.status().as_u16(),
        r.headers()
            .get("x-likes-region")
            .map(|v| v.to_str().unwrap().to_string()),
    );
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (status, by.as_deref(), body["changed"].as_bool()),
        (200, Some("region-b"), Some(true)),
        "{body}"
    );
    let (_, liked) = api_b
        .get("uma", &format!("/v1/items/{item}/likes/uma"))
        .await;
    assert_eq!(liked["liked"], serde_json::json!(false), "{liked}");
    fx::teardown(&a, &topology).await;
}
