//! Request keys on the edge row (DESIGN.md, "One Paxos round per write"), against the real
//! stack: the answer is stored by the same compare-and-set as the flip, so no failure after
//! the flip can let a retry run again; concurrent requests with one key get one answer; the
//! keys an edge remembers are bounded; an operator's keys live where no user key can reach.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::api::{self, Client};
use crate::common::topology as fx;

/// The (stored) request keys the edge row remembers.
async fn recent_keys(settings: &likes::config::Settings, item: &str, user: &str) -> Vec<String> {
    let topology = likes::topology::Topology::load(None).unwrap();
    let bucket = likes::hash::bucket_of(user, topology.buckets) as i32;
    let session = likes::cql::connect(&settings.cql).await.unwrap();
    let rows = session
        .query_unpaged(
            format!(
                "SELECT recent_keys FROM {}.edges WHERE item_id = ? AND bucket = ? AND user_id = ?",
                settings.cql.keyspace
            ),
            (item, bucket, user),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (slots,) = rows
        .single_row::<(Option<std::collections::BTreeMap<i32, String>>,)>()
        .unwrap();
    slots
        .unwrap_or_default()
        .values()
        .map(|v| {
            likes::store::request_keys::Remembered::decode(v)
                .unwrap_or_else(|| panic!("unreadable slot {v:?}"))
                .key
        })
        .collect()
}

fn retract(client: &Client, key: &str, item: &str, user: &str) -> reqwest::RequestBuilder {
    client
        .http
        .post(format!("{}/v1/admin/retractions", client.base))
        .header("X-Admin-Token", api::ADMIN)
        .header("Idempotency-Key", key)
        .json(&json!({"itemId": item, "userId": user, "reason": "spam ring"}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_requests_with_one_key_flip_once_and_share_one_answer() {
    let (settings, topology, _app, client) = api::serve("keyrace").await;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.like("dora", "item-7", "same-key").await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        let (s, a) = t.await.unwrap();
        assert_eq!(
            s,
            StatusCode::OK,
            "a duplicate in flight replays, never 409: {a}"
        );
        answers.push(a);
    }
    let first = answers[0].clone();
    assert!(
        answers.iter().all(|a| *a == first),
        "all 16 get the same answer: {answers:?}"
    );
    assert_eq!(
        (first["changed"].clone(), first["opId"].clone()),
        (json!(true), json!(1)),
        "one of them flipped, and that is the answer all share"
    );
    let (_, liked) = client.get("dora", "/v1/items/item-7/likes/dora").await;
    assert_eq!(liked["liked"], json!(true));
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edge_remembers_its_last_sixteen_keys_and_no_more() {
    let (settings, topology, _app, client) = api::serve("keybound").await;
    let (_, first) = client.like("erin", "item-8", "k0").await;
    assert_eq!(first["changed"], json!(true), "{first}");
    // Sixteen more requests on the same edge (no-ops: they still store their keys).
    for i in 1..=16 {
        let (s, a) = client.like("erin", "item-8", &format!("k{i}")).await;
        assert_eq!((s, a["changed"].clone()), (StatusCode::OK, json!(false)));
    }
    let keys = recent_keys(&settings, "item-8", "erin").await;
    assert_eq!(keys.len(), 16, "the row keeps 16 keys: {keys:?}");
    assert!(
        keys.contains(&"u:k0".to_string()) && !keys.contains(&"u:k1".to_string()),
        "the key of the last flip is spared and the oldest other key goes: {keys:?}"
    );
    // k16, remembered, answers a different request under it with a 422.
    let (s, e) = client.unlike("erin", "item-8", "k16").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    // k0, the flip, still replays after 16 later requests.
    let (s, again) = client.like("erin", "item-8", "k0").await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again, first, "k0 replays its flip");
    // k1 is forgotten: an unlike under it is a new request (under a remembered like key it
    // would be a 422), and it flips the edge.
    let (s, un) = client.unlike("erin", "item-8", "k1").await;
    assert_eq!(s, StatusCode::OK, "{un}");
    assert_eq!(
        (un["changed"].clone(), un["opId"].clone()),
        (json!(true), json!(2))
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_cannot_squat_on_an_operators_key() {
    let (settings, topology, _app, client) = api::serve("keysquat").await;
    // The user stores no-op unlikes under every key the operator's retraction could be stored
    // as (`admin:<key>` before, `r:<key>` now), then likes.
    for squat in ["admin:r1", "r:r1", "e:r1"] {
        let (s, a) = client.unlike("fred", "item-9", squat).await;
        assert_eq!(s, StatusCode::OK, "{a}");
    }
    let (s, a) = client.like("fred", "item-9", "k1").await;
    assert_eq!((s, a["changed"].clone()), (StatusCode::OK, json!(true)));
    let r = retract(&client, "r1", "item-9", "fred")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(
        (answer["changed"].clone(), answer["opId"].clone()),
        (json!(true), json!(2)),
        "the retraction runs; it does not replay the user's answer: {answer}"
    );
    let (_, liked) = client.get("fred", "/v1/items/item-9/likes/fred").await;
    assert_eq!(liked["liked"], json!(false), "the like is retracted");
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_like_and_an_unlike_racing_under_one_key_get_one_answer_and_one_422() {
    let (settings, topology, _app, client) = api::serve("keyclash").await;
    for round in 0..5 {
        let item = format!("item-{round}");
        let (s, _) = client.like("hana", &item, "first").await;
        assert_eq!(s, StatusCode::OK);
        // On a liked edge a like under `k` is a no-op and an unlike under `k` a flip: only the
        // condition on the key's slot keeps both from applying.
        let (a, b) = tokio::join!(
            client.like("hana", &item, "k"),
            client.unlike("hana", &item, "k")
        );
        let mut statuses = [a.0, b.0];
        statuses.sort();
        assert_eq!(
            statuses,
            [StatusCode::OK, StatusCode::UNPROCESSABLE_ENTITY],
            "round {round}: {a:?} {b:?}"
        );
        let (_, state) = client
            .get("hana", &format!("/v1/items/{item}/likes/hana"))
            .await;
        let unlike_won = b.0 == StatusCode::OK;
        assert_eq!(
            state["liked"],
            json!(!unlike_won),
            "round {round}: the state is the winner's"
        );
    }
    fx::teardown(&settings, &topology).await;
}
