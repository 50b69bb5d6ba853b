//! Regression tests for the exactness holes of issues 10 and 13 in the API, against the real
//! stack:
//! - a retry whose answer was lost after the flip never re-likes after a later unlike, even
//!   when the request failed right after its compare-and-set (the answer is in that CAS);
//! - the relay never publishes an edge version that no request produced (a no-op like whose
//!   outbox entry was left behind, on an edge whose stage-1 state has expired).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::topology as fx;

#[cfg(feature = "failpoints")]
use likes::runtime::clock::advance_for_now;

/// The clock seam exists in fail-point builds only; without one the tests that move the clock
/// are ignored, and this stand-in lets them compile.
#[cfg(not(feature = "failpoints"))]
fn advance_for_now(_: Duration) -> Box<dyn std::any::Any> {
    unreachable!("ignored without --features failpoints")
}

/// Fail points are process-wide: the tests that arm them take turns.
static FAILPOINTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_retry_whose_answer_was_lost_after_the_flip_never_relikes() {
    use common::api;
    use reqwest::StatusCode;
    use serde_json::json;

    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, _app, client) = api::serve("lostanswer").await;
    // The like flips the edge, then fails: its answer never reaches the client.
    fail::cfg("api-after-flip-before-produce", "return").unwrap();
    let (s, e) = client.like("gus", "item-5", "like-1").await;
    fail::remove("api-after-flip-before-produce");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    // The user changes their mind; then the lost like's retry arrives.
    let (s, un) = client.unlike("gus", "item-5", "unlike-1").await;
    assert_eq!(s, StatusCode::OK, "{un}");
    assert_eq!(un["opId"], json!(2));
    let (s, retried) = client.like("gus", "item-5", "like-1").await;
    assert_eq!(s, StatusCode::OK, "{retried}");
    assert_eq!(
        retried["opId"],
        json!(1),
        "the retry replays the like's own answer"
    );
    let (_, liked) = client.get("gus", "/v1/items/item-5/likes/gus").await;
    assert_eq!(
        liked["liked"],
        json!(false),
        "the old like's retry must not undo the later unlike"
    );
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn the_relay_never_publishes_a_version_no_request_produced() {
    use common::api;
    use likes::relay::{self, Relay};
    use reqwest::StatusCode;

    let _turn = FAILPOINTS.lock().await;
    let (settings, mut topology, _app, client) = api::serve_with("relaynoop", |s| {
        // The clock is moved to pass the horizon: the watch would take that for a step.
        s.cql.clock_check_every = Duration::ZERO;
    })
    .await;
    // The relay as `likes relay` runs it: its own connections, no API session key.
    let relay_alone = Relay::connect(&settings, &topology).await.unwrap();
    // The horizon passes by moving the process's clock (every part reads it), not by waiting:
    // a 4 s horizon also expired the like itself when a loaded box took longer than that to
    // start stage 1.
    topology.dedupe_ttl = Duration::from_secs(120);
    let mut run = fx::start(&settings, &topology);
    let (s, e) = client.like("ann", "item-1", "k1").await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let want: BTreeMap<String, i64> = [("item-1".to_string(), 1)].into();
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(60)).await;
    assert_eq!(have, want);
    // Past the horizon now; the clock goes back at the end of the test, pass or fail.
    let _later = advance_for_now(topology.dedupe_ttl + Duration::from_secs(2));

    // A no-op like (already liked) whose outbox entry is left behind.
    fail::cfg("api-before-outbox-clear", "return").unwrap();
    let (s, e) = client.like("ann", "item-1", "k2").await;
    fail::remove("api-before-outbox-clear");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");

    let pass = relay::pass(&relay_alone, Duration::ZERO).await.unwrap();
    assert_eq!(
        pass.published, 0,
        "the entry's request changed nothing: there is nothing to publish ({pass:?})"
    );
    assert_eq!(pass.cleared, 1, "the stale entry is deleted: {pass:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    run.check().await;
    run.stop().await;
    assert_eq!(
        fx::nonzero(&fx::counts(&settings).await),
        want,
        "the count must not move"
    );
    fx::teardown(&settings, &topology).await;
}

/// The answer really lost: the request fails right after its compare-and-set, before anything
/// else (the event, any answer write) happens. Its retry after a later unlike must replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_retry_after_a_failure_right_after_the_flip_replays() {
    use common::api;
    use reqwest::StatusCode;
    use serde_json::json;

    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, _app, client) = api::serve("keylost").await;
    fail::cfg("api-after-cas", "return").unwrap();
    let (s, e) = client.like("gina", "item-4", "like-1").await;
    fail::remove("api-after-cas");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    let (s, un) = client.unlike("gina", "item-4", "unlike-1").await;
    assert_eq!((s, un["opId"].clone()), (StatusCode::OK, json!(2)), "{un}");
    let (s, retried) = client.like("gina", "item-4", "like-1").await;
    assert_eq!(s, StatusCode::OK, "the retry replays at once: {retried}");
    assert_eq!(
        (retried["changed"].clone(), retried["opId"].clone()),
        (json!(true), json!(1)),
        "the like's own answer"
    );
    let (_, liked) = client.get("gina", "/v1/items/item-4/likes/gina").await;
    assert_eq!(liked["liked"], json!(false), "the later unlike stands");
    fx::teardown(&settings, &topology).await;
}

/// Issue 23, item 1, as the issue saw it from outside: a like counted and past the horizon,
/// then an unlike whose publish is lost and a like again (the like reaches stage 1 alone,
/// op 2 never); and the symmetric case, an unlike reaching stage 1 after two lost flips.
/// Each edge is counted as it ends, once: 1 for the LIKED edge, 0 for the UNLIKED one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn an_expired_like_flipped_around_a_lost_publish_is_counted_once() {
    use common::api;
    use likes::relay::{self, Relay};
    use reqwest::StatusCode;

    let _turn = FAILPOINTS.lock().await;
    let (settings, mut topology, _app, client) = api::serve_with("pasthorizon", |s| {
        // The clock is moved to pass the horizon: the watch would take that for a step.
        s.cql.clock_check_every = Duration::ZERO;
    })
    .await;
    // The horizon passes by moving the process's clock, not by waiting (see above).
    topology.dedupe_ttl = Duration::from_secs(120);
    let relay_alone = Relay::connect(&settings, &topology).await.unwrap();
    let mut run = fx::start(&settings, &topology);
    for (user, item) in [("ann", "item-1"), ("bob", "item-2")] {
        let (s, e) = client.like(user, item, "like-0").await;
        assert_eq!(s, StatusCode::OK, "{e}");
    }
    let both: BTreeMap<String, i64> = [("item-1".to_string(), 1), ("item-2".to_string(), 1)].into();
    let have = fx::wait_for_counts(&mut run, &settings, &both, Duration::from_secs(60)).await;
    assert_eq!(have, both);
    // Both past the horizon now; the clock goes back at the end of the test, pass or fail.
    let _later = advance_for_now(topology.dedupe_ttl + Duration::from_secs(2));

    // ann: the unlike's publish is lost, the like again is published.
    fail::cfg("api-after-flip-before-produce", "return").unwrap();
    let (s, e) = client.unlike("ann", "item-1", "unlike-1").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    // bob: the unlike and the like again both lost, then an unlike published.
    let (s, e) = client.unlike("bob", "item-2", "unlike-1").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    let (s, e) = client.like("bob", "item-2", "like-1").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    fail::remove("api-after-flip-before-produce");
    let (s, e) = client.like("ann", "item-1", "like-1").await;
    assert_eq!(
        (s, e["opId"].clone()),
        (StatusCode::OK, serde_json::json!(3)),
        "{e}"
    );
    let (s, e) = client.unlike("bob", "item-2", "unlike-2").await;
    assert_eq!(
        (s, e["opId"].clone()),
        (StatusCode::OK, serde_json::json!(4)),
        "{e}"
    );
    // The relay's pass republishes the current versions: duplicates by then.
    relay::pass(&relay_alone, Duration::ZERO).await.unwrap();
    let want: BTreeMap<String, i64> = [("item-1".to_string(), 1)].into();
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // and it stays there
    run.check().await;
    let (d, _) = run.stop().await;
    let after = fx::nonzero(&fx::counts(&settings).await);
    assert_eq!(
        (have, after),
        (want.clone(), want),
        "ann's one LIKED edge counts 1, bob's UNLIKED edge 0"
    );
    assert_eq!(d.guessed, 0, "the events carry their history: {d:?}");
    fx::teardown(&settings, &topology).await;
}

/// Issue 43, hole 4: the past-horizon rule reads "nothing remembered, and the op is inside the
/// horizon" as "never counted", true only if state was kept for the whole current horizon.
/// After `dedupe_ttl` is raised, an edge whose state the old horizon forgot is in neither
/// case: its like was counted, and its unlike must count −1, not 0. Then the horizon is
/// lowered again, which takes effect at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_raised_horizon_takes_what_the_old_one_forgot_as_counted() {
    use common::api;
    use likes::dedupe::state::{edge_key, EdgeStore};
    use reqwest::StatusCode;

    let _turn = FAILPOINTS.lock().await;
    let (settings, mut topology, _app, client) = api::serve_with("horizonraise", |s| {
        // The clock is moved to pass the horizon: the watch would take that for a step.
        s.cql.clock_check_every = Duration::ZERO;
    })
    .await;
    topology.dedupe_ttl = Duration::from_secs(120);
    let run = fx::start(&settings, &topology);
    let (s, e) = client.like("ann", "item-h", "k1").await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let one: BTreeMap<String, i64> = [("item-h".to_string(), 1)].into();
    let mut run = run;
    let have = fx::wait_for_counts(&mut run, &settings, &one, Duration::from_secs(60)).await;
    assert_eq!(have, one);
    run.stop().await;

    // The old horizon passes and forgets the edge, as RocksDB's TTL compaction does: the
    // edge is gone from stage 1's local state, which stays trusted (its mark is intact).
    let dir = settings
        .dedupe
        .state_dir
        .join(settings.group(&topology.groups.dedupe))
        .join(&settings.dedupe.instance_id);
    {
        let store = EdgeStore::open(&dir, 120_000, 8 << 20).unwrap();
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete(edge_key("item-h", "ann"));
        store.write(batch).unwrap();
        store.flush().unwrap();
    }
    let _later = advance_for_now(Duration::from_secs(200));

    // Raised to an hour: the like (200 s old) is inside the new horizon, outside the old.
    topology.dedupe_ttl = Duration::from_secs(3600);
    let mut run = fx::start(&settings, &topology);
    let (s, e) = client.unlike("ann", "item-h", "k2").await;
    assert_eq!(
        (s, e["opId"].clone()),
        (StatusCode::OK, serde_json::json!(2)),
        "{e}"
    );
    let none = BTreeMap::new();
    let have = fx::wait_for_counts(&mut run, &settings, &none, Duration::from_secs(60)).await;
    assert_eq!(
        have, none,
        "the unlike of a like the old horizon forgot counts -1 (the edge is UNLIKED)"
    );
    run.check().await;
    run.stop().await;

    // Lowered to a minute: at once, with nothing to wait out.
    topology.dedupe_ttl = Duration::from_secs(60);
    let mut run = fx::start(&settings, &topology);
    let (s, e) = client.like("ann", "item-h", "k3").await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let have = fx::wait_for_counts(&mut run, &settings, &one, Duration::from_secs(60)).await;
    assert_eq!(have, one);
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}

/// Issue 56, the row fence: a compare-and-set that lands after the relay gave up on its
/// outbox entry. The request's statement is held on its way (fail point `api-cas-in-flight`:
/// a statement stalled on the wire, a paused coordinator), the request answers 503 at its
/// deadline, the relay finds no flip of the entry's request and drops the entry, and only
/// then does the statement land. Before the fence it applied: the edge flipped with no event
/// for it anywhere, the count one off for good, and a keyed retry replayed 200 `changed:
/// true` for a like that was never counted. With the fence, the relay's conditional write
/// makes the late statement fail; the retry then flips the edge itself and is counted. Both
/// kinds of statement: the first write of an edge (`INSERT ... IF NOT EXISTS`) and a flip of
/// an existing row (`UPDATE ... IF op_id = ...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_write_that_lands_after_the_relay_dropped_its_entry_changes_nothing() {
    use common::api;
    use likes::relay::{self, Relay};
    use reqwest::StatusCode;
    use serde_json::json;

    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, _app, client) = api::serve_with("latecas", |s| {
        // The test runs the relay's passes itself, at the moments it holds.
        s.api.relay = false;
    })
    .await;
    let relay_alone = Relay::connect(&settings, &topology).await.unwrap();
    let mut run = fx::start(&settings, &topology);
    let (s, e) = client.like("lee", "late-u", "u0").await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let counted: BTreeMap<String, i64> = [("late-u".to_string(), 1)].into();
    let have = fx::wait_for_counts(&mut run, &settings, &counted, Duration::from_secs(60)).await;
    assert_eq!(have, counted);

    for (item, liked, key) in [("late-l", true, "l1"), ("late-u", false, "u1")] {
        let hold = common::Hold::first_at("api-cas-in-flight");
        let (landed_tx, landed) = std::sync::mpsc::channel::<()>();
        let landed_tx = std::sync::Mutex::new(landed_tx);
        fail::cfg_callback("api-cas-landed", move || {
            let _ = landed_tx.lock().unwrap().send(());
        })
        .unwrap();
        let write = |c: std::sync::Arc<api::Client>| async move {
            if liked {
                c.like("lee", item, key).await
            } else {
                c.unlike("lee", item, key).await
            }
        };
        let request = tokio::spawn(write(client.clone()));
        hold.reached().await;
        let (s, e) = request.await.unwrap();
        assert_eq!(
            s,
            StatusCode::SERVICE_UNAVAILABLE,
            "{item}: the held write gives up at its deadline: {e}"
        );

        let pass = relay::pass(&relay_alone, Duration::ZERO).await.unwrap();
        assert_eq!(
            (pass.published, pass.cleared),
            (0, 1),
            "{item}: no flip of the entry's request yet: dropped unpublished ({pass:?})"
        );

        // The statement lands now, a whole relay pass late.
        hold.release();
        tokio::task::spawn_blocking(move || landed.recv_timeout(Duration::from_secs(60)))
            .await
            .unwrap()
            .unwrap_or_else(|_| panic!("{item}: the held statement never landed"));
        fail::remove("api-cas-landed");
        let (_, read) = client
            .get("lee", &format!("/v1/items/{item}/likes/lee"))
            .await;
        assert_eq!(
            read["liked"],
            json!(!liked),
            "{item}: the late statement must not change the edge once its entry is dropped: {read}"
        );

        // The client retries with the same key: its write is made now, and counted.
        let (s, e) = if liked {
            client.like("lee", item, key).await
        } else {
            client.unlike("lee", item, key).await
        };
        assert_eq!(
            (s, e["changed"].clone()),
            (StatusCode::OK, json!(true)),
            "{item}: {e}"
        );
    }

    // The counts equal the edges: late-l liked, late-u unliked.
    let want: BTreeMap<String, i64> = [("late-l".to_string(), 1)].into();
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(60)).await;
    run.check().await;
    run.stop().await;
    assert_eq!(have, want, "every answered write counted, nothing else");
    fx::teardown(&settings, &topology).await;
}

/// Issue 56, item 2: a flip whose event never left (its request gave up after the flip, and
/// its outbox entry is gone, as a dropped entry is once the relay has fenced the row) is
/// published again by the next request that meets it: the keyed retry that replays its answer,
/// or a request that changes nothing. Before, both answered 200 and published nothing: the
/// like was acknowledged and never counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_replay_or_a_no_op_publishes_a_young_flip_that_was_never_published() {
    use common::api;
    use reqwest::StatusCode;

    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve_with("republish", |s| {
        s.api.relay = false;
        // The clock is moved past api.relay_min_age: the watch would take that for a step.
        s.cql.clock_check_every = Duration::ZERO;
    })
    .await;
    let mut run = fx::start(&settings, &topology);
    let ks = &settings.cql.keyspace;
    for (item, again) in [("rep-replay", "k1"), ("rep-kept", "k2")] {
        fail::cfg("api-after-flip-before-produce", "return").unwrap();
        let (s, e) = client.like("rae", item, "k1").await;
        fail::remove("api-after-flip-before-produce");
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
        // The entry is gone: nothing but the next request can send the flip now.
        app.session
            .query_unpaged(format!("TRUNCATE {ks}.outbox"), ())
            .await
            .unwrap();
        // A flip younger than api.relay_min_age still has its own entry (not here: it is
        // gone, as it would be only after that age): the next request meets it older.
        let _later = advance_for_now(settings.api.relay_min_age + Duration::from_secs(1));
        // "k1" again: the retry replays; "k2": a new like of a liked edge, a no-op.
        let (s, e) = client.like("rae", item, again).await;
        assert_eq!(s, StatusCode::OK, "{item}: {e}");
    }
    let want: BTreeMap<String, i64> =
        [("rep-kept".to_string(), 1), ("rep-replay".to_string(), 1)].into();
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(60)).await;
    run.check().await;
    run.stop().await;
    assert_eq!(have, want, "both acknowledged likes counted");
    fx::teardown(&settings, &topology).await;
}
