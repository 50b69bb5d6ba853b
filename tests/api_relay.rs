//! A failure between the edge flip and the produce loses nothing: the fail point makes the
//! request fail right after the flip, the outbox keeps the entry, and the relay publishes
//! the edge's event (once; its next pass publishes nothing). A retry with the same key
//! replays the answer stored at the flip: the key never runs twice once it flipped.
//! `likes relay` as a process of its own does the same, and needs no API session key.

mod common;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use common::api::{self, all_events, all_like_events, of};
use common::topology as fx;
use likes::relay::{self, Relay};

/// Fail points are process-wide: the tests that arm them take turns.
static FAILPOINTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_flip_whose_produce_failed_is_published_by_the_relay() {
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, _app, client) = api::serve("relay").await;
    // The relay as `likes relay` runs it: its own connections, no API session key.
    let relay_alone = Relay::connect(&settings, &topology).await.unwrap();

    fail::cfg("api-after-flip-before-produce", "return").unwrap();
    // The request names its client: the edge keeps it, so the relay's event carries it too.
    let (s, e) = client.like_from("android", "erin", "item-7", "k1").await;
    fail::remove("api-after-flip-before-produce");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    assert_eq!(e["error"], json!("unavailable"));

    // The flip happened and its outbox entry waits; entries younger than min_age are left.
    let (_, liked) = client.get("erin", "/v1/items/item-7/likes/erin").await;
    assert_eq!(
        liked["liked"],
        json!(true),
        "the edge flipped before the failure"
    );
    let young = relay::pass(&relay_alone, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        young,
        relay::Pass::default(),
        "a young entry is a request in flight"
    );

    let first = relay::pass(&relay_alone, Duration::ZERO).await.unwrap();
    assert_eq!(first.published, 1, "{first:?}");
    assert_eq!(first.cleared, 1, "{first:?}");
    let again = relay::pass(&relay_alone, Duration::ZERO).await.unwrap();
    assert_eq!(again, relay::Pass::default(), "nothing left to publish");

    // The client's retry with the same key replays the flip's own answer.
    let (s, retried) = client.like("erin", "item-7", "k1").await;
    assert_eq!(s, StatusCode::OK, "{retried}");
    assert_eq!(retried["changed"], json!(true));
    assert_eq!(retried["opId"], json!(1));

    let topic = settings.topic(&topology.topics.events.name);
    let s2 = settings.clone();
    let events = tokio::task::spawn_blocking(move || all_events(&s2, &topic))
        .await
        .unwrap();
    assert_eq!(
        of(&events, "item-7", "erin"),
        vec![(1, true)],
        "exactly one event for the flip: the relay's"
    );
    let topic = settings.topic(&topology.topics.events.name);
    let s2 = settings.clone();
    let whole = tokio::task::spawn_blocking(move || all_like_events(&s2, &topic))
        .await
        .unwrap();
    let platforms: Vec<i32> = whole
        .iter()
        .filter(|e| e.item_id == "item-7" && e.user_id == "erin")
        .map(|e| e.client_platform)
        .collect();
    assert_eq!(
        platforms,
        vec![likes::schema::v1::ClientPlatform::Android as i32],
        "the relay republishes the platform the request named"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn the_relay_process_needs_no_session_key_and_publishes_a_pending_flip() {
    let (settings, topology, _app, client) = api::serve("relayproc").await;
    {
        let _turn = FAILPOINTS.lock().await;
        fail::cfg("api-after-flip-before-produce", "return").unwrap();
        let (s, e) = client.like("finn", "item-8", "k1").await;
        fail::remove("api-after-flip-before-produce");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    }

    // `likes relay` with no session key at all; a short min_age (it must exceed the write
    // deadline plus the CQL timeout) so the entry is due within seconds.
    let dir = std::env::temp_dir().join(format!("likes-test-{}", settings.cql.keyspace));
    std::fs::create_dir_all(&dir).unwrap();
    let mut env = common::procs::stage_env(&settings, &dir.join("audit.log"));
    for (k, v) in [
        ("LIKES__API__SESSION_KEY", ""),
        ("LIKES__API__WRITE_DEADLINE", "1s"),
        ("LIKES__CQL__REQUEST_TIMEOUT", "2s"),
        ("LIKES__API__RELAY_MIN_AGE", "4s"),
    ] {
        env.push((k.into(), v.into()));
    }
    let mut relay = common::procs::Stage::new("relay", env, &dir);
    relay.start();

    let topic = settings.topic(&topology.topics.events.name);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let published = loop {
        relay.assert_alive();
        let (s2, t2) = (settings.clone(), topic.clone());
        let events = tokio::task::spawn_blocking(move || all_events(&s2, &t2))
            .await
            .unwrap();
        let mine = of(&events, "item-8", "finn");
        if !mine.is_empty() || std::time::Instant::now() > deadline {
            break mine;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(
        published,
        vec![(1, true)],
        "the relay process published the flip, once; log:\n{}",
        relay.tail()
    );
    relay.stop(); // SIGTERM: a clean exit
    let _ = std::fs::remove_dir_all(&dir);
    fx::teardown(&settings, &topology).await;
}

/// The API deletes its outbox entries behind its answers, in batches per outbox partition
/// (src/write/clears.rs): once they are sent, the relay finds nothing, for flips, no-ops and
/// replays alike. Clears that were never sent would each cost an extra publish here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answered_writes_leave_no_outbox_entry_once_their_clears_are_sent() {
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve("clears").await;
    let relay_alone = Relay::connect(&settings, &topology).await.unwrap();
    for i in 0..40 {
        let (user, item) = (format!("u{i}"), format!("item-{}", i % 5));
        let (s, e) = client.like(&user, &item, &format!("l{i}")).await;
        assert_eq!(s, StatusCode::OK, "{e}");
        if i % 2 == 0 {
            let (s, e) = client.unlike(&user, &item, &format!("n{i}")).await;
            assert_eq!(s, StatusCode::OK, "{e}");
        }
        if i % 5 == 0 {
            // A replay of the like's key and a no-op like under a new key.
            let (s, e) = client.like(&user, &item, &format!("l{i}")).await;
            assert_eq!(s, StatusCode::OK, "{e}");
            let (s, e) = client.unlike(&user, &item, &format!("again{i}")).await;
            assert_eq!(s, StatusCode::OK, "{e}");
        }
    }
    assert!(
        app.writer.settle(Duration::from_secs(30)).await,
        "acks still owed after 30 s"
    );
    let pass = relay::pass(&relay_alone, Duration::ZERO).await.unwrap();
    assert_eq!(
        pass,
        relay::Pass::default(),
        "every answered write's entry was deleted by the API"
    );
    fx::teardown(&settings, &topology).await;
}

/// Issue 43, hole 7c: a write whose broker ack came after `api.publish_wait` is answered with
/// its event left to the relay; the send goes on, and when it is acknowledged the entry is
/// cleared. Before, the entry stayed, and after an outage every relay published every such
/// flip again (18,222 copies of flips already counted in one chaos run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publish_acknowledged_after_its_wait_clears_its_outbox_entry() {
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve_with("lateack", |s| {
        // Every ack comes after the wait: each write is answered with its event deferred.
        s.api.publish_wait = Duration::from_micros(1);
        s.api.relay = false;
    })
    .await;
    for i in 0..20 {
        let (s, e) = client
            .like(&format!("u{i}"), "item-late", &format!("k{i}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{e}");
    }
    // Each write's event is on the log (the abandoned send went on) ...
    let topic = settings.topic(&topology.topics.events.name);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (s2, t2) = (settings.clone(), topic.clone());
        let events = tokio::task::spawn_blocking(move || all_events(&s2, &t2))
            .await
            .unwrap();
        if events.len() >= 20 || std::time::Instant::now() > deadline {
            assert_eq!(events.len(), 20, "every event once");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ... and its outbox entry is gone: nothing is left for a relay to publish again (the
    // clears go out by themselves, write/clears.rs GATHER after they are queued).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = outbox_rows(&app).await;
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} outbox entries of acknowledged events left for the relay to publish again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fx::teardown(&settings, &topology).await;
}

/// Issue 45, item 3: a write's answer does not wait for the broker's ack: its outbox entry
/// stands for the event until the ack clears it. The ack's handling is held here (fail point
/// `api-before-ack`): the write is answered while it is held, its entry still there; let go,
/// the event is on the log once and the entry is cleared. Before, the answer waited for the
/// ack, up to `api.publish_wait` (set far past the test's wait for the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_write_is_answered_before_its_event_is_acknowledged() {
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve_with("noackwait", |s| {
        s.api.publish_wait = Duration::from_secs(90);
        s.api.request_timeout = Duration::from_secs(120);
        s.api.relay = false;
    })
    .await;
    let hold = common::Hold::first_at("api-before-ack");
    let answered = tokio::time::timeout(
        Duration::from_secs(30),
        client.like("u1", "item-noack", "k1"),
    )
    .await;
    let (s, e) = answered.expect("not answered while its event's ack was held");
    assert_eq!(s, StatusCode::OK, "{e}");
    hold.reached().await;
    // A stopping API settles its owed acks for a while, then leaves them to the relay.
    assert!(
        !app.writer.settle(Duration::from_millis(200)).await,
        "settled with an ack still held"
    );
    assert_eq!(
        outbox_rows(&app).await,
        1,
        "the entry stands for the event until its ack"
    );
    hold.release();
    // Settled, the event is on the log and its entry gone: no polling needed.
    assert!(
        app.writer.settle(Duration::from_secs(60)).await,
        "the ack, let go, still owed after 60 s"
    );
    let topic = settings.topic(&topology.topics.events.name);
    let s2 = settings.clone();
    let events = tokio::task::spawn_blocking(move || all_events(&s2, &topic))
        .await
        .unwrap();
    assert_eq!(of(&events, "item-noack", "u1"), vec![(1, true)], "once");
    assert_eq!(outbox_rows(&app).await, 0, "its entry cleared");
    fx::teardown(&settings, &topology).await;
}

async fn outbox_rows(app: &likes::api::App) -> i64 {
    let ks = &app.settings.cql.keyspace;
    let rows = app
        .session
        .query_unpaged(format!("SELECT COUNT(*) FROM {ks}.outbox"), ())
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    rows.first_row::<(i64,)>().unwrap().0
}

/// Issue 43, item 7c: with a relay in every API pod, each used to publish every deferred
/// entry. Two relays on one outbox: A has read a page and is held before publishing it; B's
/// pass meanwhile leaves A's shards alone (their leases are A's), so every flip reaches the log
/// once. Without leases B publishes the same entries and each flip is on the log twice. Once A
/// lets its shards go (a relay stopping), B drains them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn relays_hold_outbox_shards_by_lease_and_publish_each_entry_once() {
    use tokio::sync::oneshot;
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, _app, client) = api::serve("leases").await;
    let b = Relay::connect(&settings, &topology).await.unwrap();

    fail::cfg("api-after-flip-before-produce", "return").unwrap();
    for i in 0..20 {
        let (s, e) = client
            .like(&format!("u{i}"), "item-lease", &format!("k{i}"))
            .await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    }

    // A stops at its first page read, until the test lets it go; later pages pass.
    let hold = common::Hold::first_at("relay-after-scan");
    // A on a runtime of its own: the hold blocks one of its threads, and a task parked behind
    // it must be A's, never B's or the test's.
    let (a_pass, a_passed) = oneshot::channel();
    let (a_release, a_released) = oneshot::channel::<oneshot::Sender<()>>();
    let a = {
        let (settings, topology) = (settings.clone(), topology.clone());
        common::on_own_runtime(move || async move {
            let a = Relay::connect(&settings, &topology).await.unwrap();
            let _ = a_pass.send(relay::pass(&a, Duration::ZERO).await.unwrap());
            let done = a_released.await.unwrap();
            relay::release(&a).await.unwrap();
            let _ = done.send(());
        })
    };
    hold.reached().await;
    let by_b = relay::pass(&b, Duration::ZERO).await.unwrap();
    hold.release();
    let by_a = a_passed.await.unwrap();
    assert_eq!(
        by_a.published + by_b.published,
        20,
        "A: {by_a:?} B: {by_b:?}"
    );
    assert_eq!(
        (by_a.others, by_b.others),
        (0, 16),
        "A took every free shard first; B left them to it"
    );

    // A stops: B takes its shards on its next pass and publishes what came since.
    let (done, released) = oneshot::channel();
    a_release.send(done).unwrap();
    released.await.unwrap();
    a.join().unwrap();
    let (s, e) = client.like("u-late", "item-lease", "k-late").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    fail::remove("api-after-flip-before-produce");
    let after = relay::pass(&b, Duration::ZERO).await.unwrap();
    assert_eq!((after.published, after.others), (1, 0), "{after:?}");

    let topic = settings.topic(&topology.topics.events.name);
    let s2 = settings.clone();
    let events = tokio::task::spawn_blocking(move || all_events(&s2, &topic))
        .await
        .unwrap();
    for user in (0..20).map(|i| format!("u{i}")).chain(["u-late".into()]) {
        assert_eq!(
            of(&events, "item-lease", &user),
            vec![(1, true)],
            "{user}: one event per flip"
        );
    }
    fx::teardown(&settings, &topology).await;
}
