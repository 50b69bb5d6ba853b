//! The like API against the real stack, one behaviour per test (each in a namespace of its
//! own, so the first failure hides nothing): each layer of write idempotency, the stale-retry
//! hole, the reads, and every class of bad input getting a clear 4xx that changes nothing.
//! Events are counted on the real `likes.events` topic.

use std::sync::Arc;

use likes::config::Settings;
use likes::topology::Topology;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::api::{self, all_events, of, Client};
use crate::common::topology as fx;

/// The (op_id, liked) events on the namespace's events topic for one edge, once every write
/// answered so far has its ack (the answer no longer waits for it).
async fn events_of(
    settings: &Settings,
    topology: &Topology,
    app: &likes::api::App,
    item: &str,
    user: &str,
) -> Vec<(u64, bool)> {
    assert!(
        app.writer.settle(std::time::Duration::from_secs(30)).await,
        "acks still owed after 30 s"
    );
    let settings = settings.clone();
    let topic = settings.topic(&topology.topics.events.name);
    let events = tokio::task::spawn_blocking(move || all_events(&settings, &topic))
        .await
        .unwrap();
    of(&events, item, user)
}

async fn serve(name: &str) -> (Settings, Topology, Arc<likes::api::App>, Arc<Client>) {
    api::serve(name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_like_is_one_flip_and_the_actor_reads_it_at_once() {
    let (settings, topology, app, client) = serve("apidouble").await;
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
    assert_eq!(
        events_of(&settings, &topology, &app, "item-1", "alice").await,
        vec![(1, true)],
        "double like: one event"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_key_returns_its_answer_and_another_request_under_it_is_a_422() {
    let (settings, topology, app, client) = serve("apikey").await;
    let (_, a1) = client.like("alice", "item-1", "k1").await;
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
    assert_eq!(
        events_of(&settings, &topology, &app, "item-1", "alice").await,
        vec![(1, true)],
        "the replay and the refused request publish nothing"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_likes_of_one_edge_flip_it_once() {
    let (settings, topology, app, client) = serve("apiconcurrent").await;
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move {
                c.until_answered(true, "bob", "item-2", &format!("c{i}"))
                    .await
            })
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
    assert_eq!(
        events_of(&settings, &topology, &app, "item-2", "bob").await,
        vec![(1, true)],
        "16 concurrent likes: one event"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_retry_replays_its_answer_and_never_relikes() {
    let (settings, topology, app, client) = serve("apistale").await;
    // like (answer lost) -> unlike -> the old like retried with its key: the stored answer
    // comes back and the edge stays UNLIKED.
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
    assert_eq!(
        events_of(&settings, &topology, &app, "item-3", "carol").await,
        vec![(1, true), (2, false)],
        "stale retry: exactly two flips"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guess_that_aims_the_flip_never_decides_it() {
    let (settings, topology, app, client) = serve("apiguess").await;
    // An unlike of an unliked edge and of an edge never liked are no-ops; a like of an
    // unliked edge (its `IF NOT EXISTS` fails) flips from the row it is answered with.
    client.like("carol", "item-3", "like-1").await;
    client.unlike("carol", "item-3", "unlike-1").await;
    let (_, again) = client.unlike("carol", "item-3", "unlike-2").await;
    assert_eq!(
        (again["changed"].clone(), again["opId"].clone()),
        (json!(false), json!(2))
    );
    let (_, never) = client.unlike("carol", "item-9", "unlike-3").await;
    assert_eq!(
        (never["changed"].clone(), never["opId"].clone()),
        (json!(false), json!(0))
    );
    let (s, relike) = client.like("carol", "item-3", "like-2").await;
    assert_eq!(s, StatusCode::OK, "{relike}");
    assert_eq!(
        (relike["changed"].clone(), relike["opId"].clone()),
        (json!(true), json!(3))
    );
    assert_eq!(
        events_of(&settings, &topology, &app, "item-3", "carol").await,
        vec![(1, true), (2, false), (3, true)],
        "three flips, three events; the no-ops none"
    );
    assert!(
        events_of(&settings, &topology, &app, "item-9", "carol")
            .await
            .is_empty(),
        "a no-op unlike publishes nothing"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let (settings, topology, app, client) = serve("apibad").await;
    let base = client.base.clone();
    client.like("alice", "item-1", "k1").await;
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
                .header("Idempotency-Key", "xp")
                .header("X-Client-Platform", "toaster"),
            StatusCode::BAD_REQUEST,
            "X-Client-Platform",
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
                .body("x".repeat(20_000)),
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
    assert!(
        events_of(&settings, &topology, &app, "item-4", "dave")
            .await
            .is_empty(),
        "refused requests publish nothing"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn who_liked_pages_every_liker_once_under_concurrent_likes() {
    let (settings, topology, _app, client) = serve("apilikers").await;
    // Who liked: 30 likers paged 7 at a time, while another user likes mid-walk: every
    // original liker exactly once, in a stable walk.
    let likers: Vec<String> = (0..30).map(|i| format!("fan{i:02}")).collect();
    for u in &likers {
        let (s, _) = client.like(u, "item-5", "fan").await;
        assert_eq!(s, StatusCode::OK);
    }
    let (_, _) = client.unlike("fan03", "item-5", "fan-unlike").await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/items/item-5/likes?limit=7&cursor={c}"),
            None => "/v1/items/item-5/likes?limit=7".to_string(),
        };
        let (s, page) = client.get("dave", &q).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        pages += 1;
        if pages == 2 {
            client.like("latecomer", "item-5", "late").await;
        }
        for u in page["users"].as_array().unwrap() {
            seen.push(u.as_str().unwrap().to_string());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no liker twice: {seen:?}");
    for u in likers.iter().filter(|u| *u != "fan03") {
        assert!(seen.contains(u), "{u} missing from {seen:?}");
    }
    assert!(
        !seen.contains(&"fan03".to_string()),
        "an unliked user is not listed"
    );
    for bad in [
        "limit=0",
        "limit=101",
        "cursor=zz",
        "cursor=3a78",
        "limit=x",
    ] {
        let (s, e) = client
            .get("dave", &format!("/v1/items/item-5/likes?{bad}"))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {e}");
    }
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_get_gives_the_callers_states_and_is_bounded() {
    let (settings, topology, _app, client) = serve("apibatch").await;
    let base = client.base.clone();
    client.like("fan07", "item-5", "fan").await;
    client.like("alice", "item-1", "k1").await;
    // batchGet: counts and the caller's own button states in one call; bounded.
    let r = client
        .http
        .post(format!("{base}/v1/likes:batchGet"))
        .bearer_auth(client.token("fan07"))
        .json(&json!({"itemIds": ["item-5", "item-1", "item-9"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let b: Value = r.json().await.unwrap();
    let liked: Vec<bool> = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["liked"].as_bool().unwrap())
        .collect();
    assert_eq!(liked, vec![true, false, false], "{b}");
    let too_many: Vec<String> = (0..101).map(|i| format!("i{i}")).collect();
    for body in [
        json!({ "itemIds": too_many }),
        json!({ "itemIds": [] }),
        json!({ "itemIds": ["ok"], "extra": 1 }),
        json!({ "itemIds": ["bad#id"] }),
    ] {
        let r = client
            .http
            .post(format!("{base}/v1/likes:batchGet"))
            .bearer_auth(client.token("fan07"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_count_before_any_window_is_zero_and_every_route_is_documented() {
    let (settings, topology, _app, client) = serve("apimisc").await;
    let base = client.base.clone();
    // The public count before any window: 0 and a null asOf.
    let (s, c) = client.get("dave", "/v1/items/item-9/count").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (c["count"].clone(), c["asOf"].clone()),
        (json!(0), Value::Null)
    );
    let (s, _) = client.get("dave", "/readyz").await;
    assert_eq!(s, StatusCode::OK);
    let (s, e) = client.get("dave", "/v1/nope").await;
    assert_eq!(
        (s, e["error"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    // The served document names every route the router serves.
    let doc = client
        .http
        .get(format!("{base}/openapi.yaml"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for path in [
        "/v1/items/{itemId}/likes:",
        "/v1/items/{itemId}/likes/{userId}:",
        "/v1/items/{itemId}/count:",
        "/v1/likes:batchGet:",
        "/v1/admin/retractions:",
        "/v1/admin/erasures:",
        "/v1/admin/erasures/{id}:",
        "/healthz:",
        "/readyz:",
    ] {
        assert!(doc.contains(path), "openapi.yaml lacks {path}");
    }
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retraction_needs_the_admin_credential_and_replays_on_retry() {
    let (settings, topology, app, client) = serve("apiretract").await;
    let base = client.base.clone();
    client.like("alice", "item-1", "k1").await;
    // An operator's retraction: a separate credential, the normal write path, a reason.
    let retract = |token: &str, key: &str| {
        client
            .http
            .post(format!("{base}/v1/admin/retractions"))
            .header("X-Admin-Token", token)
            .header("Idempotency-Key", key)
            .json(&json!({"itemId": "item-1", "userId": "alice", "reason": "spam ring"}))
    };
    let r = retract(&client.token("alice"), "r1").send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "a session token is not the admin credential"
    );
    let r = retract(api::ADMIN, "r1").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let first: Value = r.json().await.unwrap();
    assert_eq!(
        (first["changed"].clone(), first["opId"].clone()),
        (json!(true), json!(2))
    );
    let again: Value = retract(api::ADMIN, "r1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again, first, "a retried retraction replays its answer");
    let (_, liked) = client.get("alice", "/v1/items/item-1/likes/alice").await;
    assert_eq!(liked["liked"], json!(false), "retracted");
    let session = likes::cql::connect(&settings.cql).await.unwrap();
    let reasons: Vec<(String,)> = session
        .query_unpaged(
            format!(
                "SELECT reason FROM {}.retractions WHERE item_id = 'item-1'",
                settings.cql.keyspace
            ),
            (),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows::<(String,)>()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        reasons,
        vec![("spam ring".to_string(),)],
        "one record, retry included"
    );
    assert_eq!(
        events_of(&settings, &topology, &app, "item-1", "alice").await,
        vec![(1, true), (2, false)],
        "the like, and one event for the retraction"
    );
    fx::teardown(&settings, &topology).await;
}
