//! A failure between the edge flip and the produce loses nothing: the fail point makes the
//! request fail right after the flip, the outbox keeps the entry, and the relay publishes
//! the edge's event (once; its next pass publishes nothing). A retry with the same key
//! replays the answer stored at the flip: the key never runs twice once it flipped.

#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use common::api::{self, all_events, of};
use common::topology as fx;
use likes::relay::{self, Relay};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flip_whose_produce_failed_is_published_by_the_relay() {
    let (settings, topology, _app, client) = api::serve("relay").await;
    // The relay as `likes relay` runs it: its own connections, no API session key.
    let relay_alone = Relay::connect(&settings, &topology).await.unwrap();

    fail::cfg("api-after-flip-before-produce", "return").unwrap();
    let (s, e) = client.like("erin", "item-7", "k1").await;
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
    fx::teardown(&settings, &topology).await;
}
