//! The clock seam: a test build moves the process's wall clock forward, and every reader of
//! `runtime::clock` (stage 1's horizon, windows, TTLs, asOf) sees it. Its own test binary:
//! the skew is process-wide and must not leak into other tests; the tests here take turns.

mod common;

use std::time::{Duration, Instant};

use likes::runtime::clock::now_ms;
use reqwest::StatusCode;

#[cfg(feature = "failpoints")]
use likes::runtime::clock::advance_for_now;

/// The clock seam exists in fail-point builds only; without one the tests that move the clock
/// are ignored, and this stand-in lets them compile.
#[cfg(not(feature = "failpoints"))]
fn advance_for_now(_: Duration) -> Box<dyn std::any::Any> {
    unreachable!("ignored without --features failpoints")
}

/// The clock is the process's: one test moves it at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn advance_moves_every_reader_of_the_clock_forward() {
    let _turn = TURN.blocking_lock();
    let before = now_ms();
    let _later = advance_for_now(Duration::from_secs(3600));
    let after = now_ms();
    assert!(after - before >= 3_600_000, "{before} -> {after}");
    // Stage 1's rule reads the same clock: an event stamped before the jump is now past a
    // 30-minute horizon, with no test waiting for it.
    assert!(likes::dedupe::rule::expired(before, now_ms(), 30 * 60_000));
}

/// Issue 43, hole 2: a clock that steps off the database's after the start check (an NTP
/// step, a VM resumed) closes the API's writes and the relay's passes until it is back,
/// rather than stamping entries the relay could judge stale while their requests are in
/// flight (docs/exactness.md, "The clock bound").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_clock_that_steps_off_closes_writes_and_relay_passes_until_it_is_back() {
    let _turn = TURN.lock().await;
    let (settings, topology, _app, client) = common::api::serve_with("clockwatch", |s| {
        s.cql.clock_check_every = Duration::from_millis(200);
    })
    .await;
    let relay = likes::relay::Relay::connect(&settings, &topology)
        .await
        .unwrap();
    let (s, b) = client.like("ann", "item-1", "k0").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let min_age = settings.api.relay_min_age;
    likes::relay::pass(&relay, min_age).await.unwrap();

    // bob flips, each with a new key.
    let mut n = 0;
    let mut next = || {
        n += 1;
        let (client, key) = (client.clone(), format!("k{n}"));
        async move {
            if n % 2 == 1 {
                client.like("bob", "item-1", &key).await
            } else {
                client.unlike("bob", "item-1", &key).await
            }
        }
    };
    {
        // 10 s ahead: inside the band the old start check allowed.
        let _off = advance_for_now(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(60);
        let refused = loop {
            let (s, b) = next().await;
            if s == StatusCode::SERVICE_UNAVAILABLE {
                break b;
            }
            assert_eq!(s, StatusCode::OK, "before the watch sees the step: {b}");
            assert!(Instant::now() < deadline, "writes never closed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let why = refused.to_string();
        assert!(
            why.contains("clock is off") && why.contains("cql.max_clock_skew"),
            "{why}"
        );
        // The relay's watch is its own: it sees the step on its own next check, which on a
        // loaded box may come after the API's.
        let err = loop {
            match likes::relay::pass(&relay, min_age).await {
                Err(e) => break e,
                Ok(_) => {
                    assert!(Instant::now() < deadline, "relay passes never closed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        assert!(err.to_string().contains("off the database's"), "{err}");
    }
    // Back within the bound: the next checks open both again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, b) = next().await;
        if s == StatusCode::OK {
            break;
        }
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
        assert!(Instant::now() < deadline, "writes never reopened: {b}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while let Err(e) = likes::relay::pass(&relay, min_age).await {
        assert!(
            Instant::now() < deadline,
            "relay passes never reopened: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::topology::teardown(&settings, &topology).await;
}
