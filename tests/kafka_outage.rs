//! Kafka down must not mean writes down (issue 26): once a write's compare-and-set has
//! applied, its flip and answer are durable on the edge row and its outbox entry stands for
//! the event, so a broker that does not acknowledge leaves the event to the relay and the
//! write is answered. Only the count lags, and it converges once the broker is back. Kills the
//! shared local Kafka, so it runs as a test binary of its own.
//!
//! The writes run under a fixed bound of 4 in flight: a write waiting for the broker's ack
//! after its flip must not hold a place (src/write/cas_done.rs), or the first second of an
//! outage sheds every write past the fourth.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::api;
use common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_are_answered_through_a_broker_outage_and_counts_converge_after() {
    let (settings, topology, app, client) = api::serve_with("kafkaout", |s| {
        s.api.relay_min_age = Duration::from_secs(8);
        s.api.write_deadline = Duration::from_secs(3);
        s.cql.request_timeout = Duration::from_secs(3);
        s.api.max_writes_in_flight = 4;
        s.api.write_latency_target = Duration::ZERO;
        s.api.publish_wait = Duration::from_secs(2);
    })
    .await;
    let stop = likes::runtime::shutdown::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let relay = likes::relay::Relay::prepare(
        app.session.clone(),
        app.events.clone(),
        None,
        &settings,
        &topology,
    )
    .await
    .unwrap();
    tokio::spawn(likes::relay::run(
        Arc::new(relay),
        Duration::from_secs(1),
        settings.api.relay_min_age,
        stop.clone(),
    ));
    let mut stages = fx::start(&settings, &topology);
    let mut truth: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..10 {
        let (st, body) = client
            .like(&format!("warm-{i}"), "item-w", &format!("w{i}"))
            .await;
        assert_eq!(st, 200, "{body}");
    }
    truth.insert("item-w".into(), 10);

    let _restore = common::stack::UpOnDrop;
    common::stack::kill9("kafka");
    // 12 likes whose events the broker never acknowledges. Each holds a place in flight only
    // until its flip has applied (its answer does not wait for the broker at all): the next is
    // sent as soon as the last one's flip shows on its edge, so at most two are ever in their
    // compare-and-set together, on any box. Were a place held through a wait for the broker,
    // the fifth would find all 4 taken and be shed.
    let mut burst = Vec::new();
    for i in 0..12u64 {
        let (c, user) = (client.clone(), format!("burst-{i}"));
        let write = tokio::spawn(async move {
            c.like(&user, "item-burst", &format!("b{i}"))
                .await
                .0
                .as_u16()
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if write.is_finished() {
                break;
            }
            let path = format!("/v1/items/item-burst/likes/burst-{i}");
            let (st, body) = client.get(&format!("burst-{i}"), &path).await;
            if st == 200 && body["liked"] == true {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "burst-{i}: its flip never showed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        burst.push(write);
    }
    let mut burst_outcomes: BTreeMap<u16, usize> = BTreeMap::new();
    for b in burst {
        *burst_outcomes.entry(b.await.unwrap()).or_default() += 1;
    }
    println!("12 likes with the broker just gone: by status {burst_outcomes:?}");
    let burst_ok = burst_outcomes.get(&200).copied().unwrap_or(0);
    assert_eq!(
        burst_ok, 12,
        "writes waiting for the broker keep no place in flight: {burst_outcomes:?}"
    );
    truth.insert("item-burst".into(), burst_ok as i64);
    // Likes, and unlikes of half of them, while the broker is gone: each answered, fast.
    let mut took = Vec::new();
    let mut outcomes: BTreeMap<u16, usize> = BTreeMap::new();
    for i in 0..30 {
        let user = format!("out-{i}");
        for (like, key) in [(true, format!("l{i}")), (false, format!("u{i}"))] {
            if !like && i % 2 == 0 {
                continue;
            }
            let t = Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(10), async {
                if like {
                    client.like(&user, "item-out", &key).await
                } else {
                    client.unlike(&user, "item-out", &key).await
                }
            })
            .await;
            let st = match answer {
                Ok((st, _)) => st.as_u16(),
                Err(_) => 0,
            };
            took.push(t.elapsed());
            *outcomes.entry(st).or_default() += 1;
        }
    }
    took.sort();
    let p = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "{} writes with the broker down: by status {outcomes:?} (0: no answer in 10 s); p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        p(0.5),
        p(0.99),
        took.last().unwrap()
    );
    assert_eq!(
        outcomes.get(&200).copied().unwrap_or(0),
        took.len(),
        "every write answered 200 with the broker down: {outcomes:?}"
    );
    truth.insert("item-out".into(), 15);

    // The broker back: the relay publishes what the writes could not, and the counts converge.
    common::stack::up();
    let have = fx::wait_for_counts(&mut stages, &settings, &truth, Duration::from_secs(120)).await;
    assert_eq!(have, truth);
    stop.cancel();
    stages.stop().await;
    fx::teardown(&settings, &topology).await;
}
