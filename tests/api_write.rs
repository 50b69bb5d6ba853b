//! The like API against the real stack: each layer of write idempotency, the stale-retry
//! hole, the reads, and every class of bad input getting a clear 4xx that changes nothing.
//! Events are counted on the real `likes.events` topic.

mod common;

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use common::topology as fx;
use likes::api::{self, auth::Signer};
use likes::schema::v1::LikeEvent;
use likes::topology::Topology;

const KEY: &str = "test-session-key-0123456789abcdef";

struct Client {
    http: reqwest::Client,
    base: String,
    signer: Signer,
}

impl Client {
    fn token(&self, user: &str) -> String {
        self.signer
            .sign(user, likes::dedupe::state::now_ms() / 1000 + 600)
    }

    async fn like(&self, user: &str, item: &str, key: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}/v1/items/{item}/likes", self.base))
            .bearer_auth(self.token(user))
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn unlike(&self, user: &str, item: &str, key: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .delete(format!("{}/v1/items/{item}/likes/{user}", self.base))
            .bearer_auth(self.token(user))
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, user: &str, path: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(self.token(user))
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }
}

/// Every LikeEvent on the events topic, as (item, user, op_id, liked).
fn all_events(settings: &likes::config::Settings, topic: &str) -> Vec<(String, String, u64, bool)> {
    let c: BaseConsumer = likes::kafka::client_config(&settings.kafka)
        .set("group.id", common::unique("api-events"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let mut idle = std::time::Instant::now();
    while idle.elapsed() < Duration::from_secs(5) {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            let e = LikeEvent::decode(m.payload().unwrap()).unwrap();
            let liked = e.state == likes::schema::v1::EdgeState::Liked as i32;
            out.push((e.item_id, e.user_id, e.op_id, liked));
            idle = std::time::Instant::now();
        }
    }
    out.sort();
    out
}

fn of(events: &[(String, String, u64, bool)], item: &str, user: &str) -> Vec<(u64, bool)> {
    events
        .iter()
        .filter(|e| e.0 == item && e.1 == user)
        .map(|e| (e.2, e.3))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_path_idempotency_reads_and_bad_input() {
    let mut settings = fx::settings("api");
    settings.api.session_key = KEY.into();
    let topology = Topology::load(None).unwrap();
    fx::setup(&settings, &topology).await;
    let app = api::App::connect(&settings, &topology).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = api::router(app.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = Arc::new(Client {
        http: reqwest::Client::new(),
        base: base.clone(),
        signer: Signer::new(KEY.as_bytes()),
    });
    let topic = settings.topic(&topology.topics.events.name);

    // Layer 3, the row, and 2, the conditional write: a double like is one flip.
    let (s1, a1) = client.like("alice", "item-1", "k1").await;
    let (s2, a2) = client.like("alice", "item-1", "k2").await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(a1["changed"], json!(true), "{a1}");
    assert_eq!(a1["opId"], json!(1));
    assert_eq!(
        a2["changed"],
        json!(false),
        "the second like is a no-op: {a2}"
    );
    assert_eq!(a2["liked"], json!(true));
    let (_, liked) = client.get("alice", "/v1/items/item-1/likes/alice").await;
    assert_eq!(liked["liked"], json!(true), "read-your-writes: {liked}");

    // Layer 1: the same key replays the stored answer; with another request it is a 422.
    let (s, replay) = client.like("alice", "item-1", "k1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        replay, a1,
        "a replayed key returns the stored answer verbatim"
    );
    let (s, e) = client.unlike("alice", "item-1", "k1").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"], json!("idempotency_key_reused"));

    // Concurrent likes of one edge from many tasks: exactly one flip.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.like("bob", "item-2", &format!("c{i}")).await })
        })
        .collect();
    let mut flips = 0;
    for t in tasks {
        let (s, a) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{a}");
        assert_eq!(a["liked"], json!(true));
        flips += usize::from(a["changed"] == json!(true));
    }
    assert_eq!(flips, 1, "16 concurrent likes, exactly one flip");

    // The stale-retry hole: like (answer lost) -> unlike -> the old like retried with its
    // key: the stored answer comes back and the edge stays UNLIKED.
    let (_, first) = client.like("carol", "item-3", "like-1").await;
    let (s, un) = client.unlike("carol", "item-3", "unlike-1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (un["changed"].clone(), un["opId"].clone()),
        (json!(true), json!(2))
    );
    let (s, retried) = client.like("carol", "item-3", "like-1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(retried, first, "the retry replays, it does not re-like");
    let (_, liked) = client.get("carol", "/v1/items/item-3/likes/carol").await;
    assert_eq!(liked["liked"], json!(false), "the row stays UNLIKED");

    // Bad input: a clear 4xx with a reason, and nothing changes.
    let t = client.token("dave");
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            client
                .http
                .post(format!("{base}/v1/items/bad%23id/likes"))
                .bearer_auth(&t)
                .header("Idempotency-Key", "x"),
            StatusCode::BAD_REQUEST,
            "itemId",
        ),
        (
            client
                .http
                .post(format!("{base}/v1/items/item-4/likes"))
                .bearer_auth(&t),
            StatusCode::BAD_REQUEST,
            "Idempotency-Key",
        ),
        (
            client
                .http
                .post(format!("{base}/v1/items/item-4/likes"))
                .bearer_auth(&t)
                .header("Idempotency-Key", "x")
                .body(r#"{"userId":"eve"}"#),
            StatusCode::BAD_REQUEST,
            "unknown fields",
        ),
        (
            client
                .http
                .post(format!("{base}/v1/items/item-4/likes"))
                .bearer_auth(&t)
                .header("Idempotency-Key", "x")
                .body("x".repeat(10_000)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            client
                .http
                .post(format!("{base}/v1/items/item-4/likes"))
                .bearer_auth("v1.dave.9999999999.00")
                .header("Idempotency-Key", "x"),
            StatusCode::UNAUTHORIZED,
            "signature",
        ),
        (
            client
                .http
                .post(format!("{base}/v1/items/item-4/likes"))
                .header("Idempotency-Key", "x"),
            StatusCode::UNAUTHORIZED,
            "Authorization",
        ),
        (
            client
                .http
                .delete(format!("{base}/v1/items/item-1/likes/alice"))
                .bearer_auth(&t)
                .header("Idempotency-Key", "x"),
            StatusCode::FORBIDDEN,
            "session",
        ),
        (
            client
                .http
                .get(format!("{base}/v1/items/item-1/likes/alice"))
                .bearer_auth(&t),
            StatusCode::FORBIDDEN,
            "session",
        ),
    ];
    for (req, want, reason) in cases {
        let r = req.send().await.unwrap();
        let status = r.status();
        let body = r.text().await.unwrap();
        assert_eq!(status, want, "{body}");
        assert!(body.contains(reason), "{want}: {body}");
    }
    let (_, liked) = client.get("alice", "/v1/items/item-1/likes/alice").await;
    assert_eq!(
        liked["liked"],
        json!(true),
        "dave's forbidden unlike changed nothing"
    );
    let (_, d) = client.get("dave", "/v1/items/item-4/likes/dave").await;
    assert_eq!(d["liked"], json!(false), "no refused request liked item-4");

    // The public count before any window: 0 and a null asOf.
    let (s, c) = client.get("dave", "/v1/items/item-9/count").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (c["count"].clone(), c["asOf"].clone()),
        (json!(0), Value::Null)
    );
    let (s, _) = client.get("dave", "/readyz").await;
    assert_eq!(s, StatusCode::OK);

    // The events on the log: one per real flip, no more.
    let settings2 = settings.clone();
    let topic2 = topic.clone();
    let events = tokio::task::spawn_blocking(move || all_events(&settings2, &topic2))
        .await
        .unwrap();
    let got = [
        of(&events, "item-1", "alice"),
        of(&events, "item-2", "bob"),
        of(&events, "item-3", "carol"),
        of(&events, "item-4", "dave"),
    ];
    assert_eq!(got[0], vec![(1, true)], "double like: one event");
    assert_eq!(got[1], vec![(1, true)], "16 concurrent likes: one event");
    assert_eq!(
        got[2],
        vec![(1, true), (2, false)],
        "stale retry: exactly two flips"
    );
    assert!(got[3].is_empty(), "refused requests publish nothing");

    fx::teardown(&settings, &topology).await;
}
