//! The operations jobs against the real stack (issue 14), each while others keep writing:
//! - erasure takes back exactly the user's likes, resumes after kill -9, changes nothing when
//!   run again, and purges the user's rows; its admin endpoint needs its credential;
//! - drift reports 0 on a healthy run and exactly the corrupted items after corruption;
//! - reconcile converges corrupted rows to ground truth, a second run sends nothing, a run
//!   stopped right after sending and run again applies nothing twice, and a correction sent
//!   twice is refused;
//! - rebuild after dropping `like_counts` during a live stream equals ground truth.
//!
//! Most arm a fail point, in process or in a job's process (FAILPOINTS): without a fail-point
//! build those are ignored.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::api::{self, Client, ADMIN};
use crate::common::topology as fx;
use likes::config::Settings;
use likes::ops::cut::Pipeline;
use likes::ops::drift::{self, Scope};
use likes::topology::Topology;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;

/// Fail points are process-wide: the tests that arm them in this process take turns.
pub(crate) static FAILPOINTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Short in-flight bounds, so a cut is passed within seconds.
pub(crate) fn quick(s: &mut Settings) {
    s.api.write_deadline = Duration::from_secs(2);
    s.cql.request_timeout = Duration::from_secs(5);
    s.api.relay_min_age = Duration::from_secs(8);
    s.ops.wait_timeout = Duration::from_secs(120);
}

/// The same settings for the `likes` binary.
pub(crate) fn env(
    settings: &Settings,
    extra: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let mut e = crate::common::env_for(settings);
    e.extend([
        ("LIKES__API__WRITE_DEADLINE", "2s".to_string()),
        ("LIKES__CQL__REQUEST_TIMEOUT", "5s".to_string()),
        ("LIKES__API__RELAY_MIN_AGE", "8s".to_string()),
    ]);
    e.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    e
}

/// Others liking and unliking items 0..items until stopped; returns how many writes.
fn churn(
    client: Arc<Client>,
    items: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let user = format!("u{}", rng.random_range(0..12));
            let item = format!("item-{}", rng.random_range(0..items));
            let key = format!("churn-{seed}-{n}");
            let (s, body) = if rng.random_bool(0.6) {
                client.like(&user, &item, &key).await
            } else {
                client.unlike(&user, &item, &key).await
            };
            // Shed under load (503 with Retry-After) is an answer too: the edges are the truth.
            assert!(
                s == StatusCode::OK || s == StatusCode::SERVICE_UNAVAILABLE,
                "{s}: {body}"
            );
            n += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        n
    })
}

/// `likes relay`'s loop in this process until the guard drops.
pub(crate) async fn relay(settings: &Settings, topology: &Topology) -> tokio_util::sync::DropGuard {
    let relay = likes::relay::Relay::connect(settings, topology)
        .await
        .unwrap();
    let stop = likes::runtime::shutdown::CancellationToken::new();
    tokio::spawn(likes::relay::run(
        Arc::new(relay),
        settings.api.relay_interval,
        settings.api.relay_min_age,
        stop.clone(),
    ));
    stop.drop_guard()
}

pub(crate) async fn truth(app: &likes::api::App) -> BTreeMap<String, i64> {
    let ks = &app.settings.cql.keyspace;
    fx::nonzero(
        &likes_testkit::truth::liked_per_item(&app.session, ks)
            .await
            .unwrap(),
    )
}

async fn converge(
    run: &mut fx::Running,
    settings: &Settings,
    app: &likes::api::App,
) -> BTreeMap<String, i64> {
    let want = truth(app).await;
    let have = fx::wait_for_counts(run, settings, &want, Duration::from_secs(90)).await;
    assert_eq!(have, want, "the counts converge to the LIKED edges");
    have
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn erasure_takes_back_exactly_the_users_likes_and_resumes_after_kill9() {
    let (settings, topology, app, client) = api::serve_with("erase", quick).await;
    let mut run = fx::start(&settings, &topology);
    // The relay, as production runs it beside the API: it publishes a flip whose producer
    // died (the job's kill -9, the fail point below) from the outbox.
    let _relay = relay(&settings, &topology).await;
    // The victim likes 120 items; others like the first 10 of them too.
    for i in 0..120 {
        let (s, b) = client
            .like("vic", &format!("item-{i}"), &format!("v{i}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers = churn(client.clone(), 10, 1, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The endpoint needs its credential.
    let url = format!("{}/v1/admin/erasures", client.base);
    let body = serde_json::json!({ "userId": "vic" });
    let r = client.http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client
        .http
        .post(&url)
        .header("X-Admin-Token", "wrong-token-wrong-token-wrong-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client
        .http
        .post(&url)
        .header("X-Admin-Token", ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let e: serde_json::Value = r.json().await.unwrap();
    let id = e["id"].as_str().unwrap().to_string();
    assert_eq!(e["state"], "pending");
    // Issue 23, item 3b: a session that outlived the account writes nothing more.
    let (s, b) = client.like("vic", "item-500", "after-erasure").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        b.to_string().contains(&id),
        "the 403 names the erasure: {b}"
    );
    let (s, b) = client.unlike("vic", "item-3", "after-erasure-2").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    // Concurrent writes share one check (write/erased_check.rs): each gets its own user's
    // answer, the erased one refused and the others written.
    let burst = (0..24).map(|i| {
        let client = client.clone();
        async move {
            let user = if i % 3 == 0 {
                "vic".to_string()
            } else {
                format!("burst-{i}")
            };
            let (s, b) = client
                .like(&user, "item-burst", &format!("burst-{i}"))
                .await;
            (user, s, b)
        }
    });
    for (user, s, b) in futures::future::join_all(burst).await {
        let want = if user == "vic" {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::OK
        };
        assert_eq!(s, want, "{user}: {b}");
    }

    // The job, slowly, killed with -9 once it has checkpointed part of the walk.
    let slow = env(
        &settings,
        &[
            ("LIKES__OPS__ERASE_RATE", "20"),
            ("LIKES__OPS__ERASE_PURGE_AFTER", "0s"),
        ],
    );
    let mut job = std::process::Command::new(env!("CARGO_BIN_EXE_likes"))
        .arg("erase")
        .envs(slow.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let e = app.store.erasures.get(&id).await.unwrap().unwrap();
        if e.walked >= 50 {
            assert!(e.walked < 120, "killed halfway: {e:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job never checkpointed: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    job.kill().unwrap(); // SIGKILL
    job.wait().unwrap();
    let halfway = app.store.erasures.get(&id).await.unwrap().unwrap();
    assert_eq!(halfway.state, "unliking");

    // Run again, its first unlike failing after the flip, before the produce (as a broker
    // error there would): the flip is on the row, its event only in the outbox, for the
    // relay. A dependency's failure runs the job again from its checkpoint (issue 23, item
    // 9; chaos seed 2 saw an erase die on a Cassandra kill), and it finishes the walk.
    let failing = env(
        &settings,
        &[
            ("LIKES__OPS__ERASE_PURGE_AFTER", "0s"),
            ("FAILPOINTS", "api-after-flip-before-produce=1*return"),
        ],
    );
    let (ok, out, err) = crate::common::likes(&["erase"], &failing);
    assert!(
        ok && err.contains("injected") && err.contains("running it again"),
        "{out}\n{err}"
    );

    // Run again: nothing left to walk.
    let fast = env(&settings, &[("LIKES__OPS__ERASE_PURGE_AFTER", "0s")]);
    let (ok, out, err) = crate::common::likes(&["erase"], &fast);
    assert!(ok, "{out}\n{err}");
    let done = app.store.erasures.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (done.state.as_str(), done.walked),
        ("unliked", 120),
        "{done:?}"
    );
    let bucket = likes::hash::bucket_of("vic", topology.buckets) as i32;
    for i in 0..120 {
        let edge = app
            .store
            .edges
            .read(&format!("item-{i}"), bucket, "vic")
            .await
            .unwrap()
            .unwrap();
        assert!(!edge.liked, "item-{i} is still liked by the erased user");
    }
    // A second run changes nothing.
    let (ok, out, err) = crate::common::likes(&["erase", "--user", "vic"], &fast);
    assert!(ok, "{out}\n{err}");
    let again = app.store.erasures.get(&id).await.unwrap().unwrap();
    assert_eq!((again.walked, again.unliked), (done.walked, done.unliked));

    stop.store(true, Ordering::Relaxed);
    assert!(writers.await.unwrap() > 0);
    let counts = converge(&mut run, &settings, &app).await;
    for i in 10..120 {
        assert_eq!(
            counts.get(&format!("item-{i}")),
            None,
            "only the erased user liked item-{i}"
        );
    }

    // Issue 23, item 3c: an operator's like and unlike of item-0 during the wait (a
    // retraction's path: the user's own are refused). The purge must not delete item-0's row
    // before its own last flip is as old as the wait: deleted now, a later like would restart
    // at op 1 while stage 1 still remembers op 4, and be dropped.
    tokio::time::sleep(Duration::from_secs(9)).await;
    for (liked, key) in [(true, "op-like"), (false, "op-unlike")] {
        let write = likes::write::Write {
            source: likes::schema::v1::Source::Retraction,
            ..likes::write::Write::by_user("vic", "item-0", liked, key)
        };
        app.writer.write(&write).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Issue 23, item 3a: a like that passed the API's check just before the erasure was
    // requested lands its index row during the purge (the fail point holds the job there).
    let racing = env(
        &settings,
        &[
            ("LIKES__OPS__ERASE_PURGE_AFTER", "0s"),
            ("FAILPOINTS", "erase-before-rewalk=1*sleep(4000)"),
        ],
    );
    let mut job = std::process::Command::new(env!("CARGO_BIN_EXE_likes"))
        .arg("erase")
        .envs(racing.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    app.session
        .query_unpaged(
            format!(
                "INSERT INTO {}.edges_by_user (user_id, item_id, created_at) VALUES (?, ?, ?)",
                settings.cql.keyspace
            ),
            (
                "vic",
                "item-900",
                scylla::value::CqlTimestamp(likes::runtime::clock::now_ms()),
            ),
        )
        .await
        .unwrap();
    assert!(job.wait().unwrap().success());
    let waiting = app.store.erasures.get(&id).await.unwrap().unwrap();
    assert_eq!(waiting.state, "unliked", "not purged yet: {waiting:?}");
    assert!(
        app.store
            .edges
            .read("item-0", bucket, "vic")
            .await
            .unwrap()
            .is_some(),
        "item-0 flipped during the wait: its row stays"
    );
    assert_eq!(
        app.store.edges.read("item-1", bucket, "vic").await.unwrap(),
        None,
        "item-1's row was old enough to purge"
    );
    let (s, b) = client.like("vic", "item-0", "after-wait").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");

    // The purge, once every row is due: the user is gone.
    tokio::time::sleep(Duration::from_secs(17)).await;
    let (ok, out, err) = crate::common::likes(&["erase"], &fast);
    assert!(ok, "{out}\n{err}");
    let r = client
        .http
        .get(format!("{url}/{id}"))
        .header("X-Admin-Token", ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let purged: serde_json::Value = r.json().await.unwrap();
    assert_eq!(purged["state"], "purged", "{purged}");
    assert!(
        purged["userId"].is_null(),
        "the record no longer names the user: {purged}"
    );
    for i in 0..120 {
        assert_eq!(
            app.store
                .edges
                .read(&format!("item-{i}"), bucket, "vic")
                .await
                .unwrap(),
            None
        );
    }
    let (s, b) = client.like("vic", "item-7", "after-purge").await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "still refused after the purge: {b}"
    );
    assert_eq!(
        converge(&mut run, &settings, &app).await,
        counts,
        "the purge moves no count"
    );
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}

/// Test-only: moves a counter row by `by` behind the pipeline's back (through its own
/// compare-and-set, so stage 2 then adds on top of the corrupted value).
async fn corrupt(p: &Pipeline, item: &str, by: i64) {
    let ks = &p.settings.cql.keyspace;
    let shard = p.topology.counter_shard(item);
    loop {
        let row = p.count_row(item).await.unwrap().expect("a counter row");
        let (count, w) = (row.count, row.last_window);
        let r = p
            .session
            .query_unpaged(
                format!("UPDATE {ks}.like_counts SET count = ? WHERE shard = ? AND item_id = ? IF count = ? AND last_window = ?"),
                (count + by, shard, item, count, w),
            )
            .await
            .unwrap();
        if likes::store::not_applied(r).unwrap().is_none() {
            return;
        }
    }
}

fn drifted(r: &drift::DriftReport) -> BTreeMap<String, i64> {
    r.drifted()
        .into_iter()
        .map(|(i, d)| (i.to_string(), d))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn drift_and_reconcile_under_live_writes() {
    use likes::ops::reconcile;

    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve_with("reconcile", quick).await;
    let mut run = fx::start(&settings, &topology);
    let stop = Arc::new(AtomicBool::new(false));
    let writers = churn(client.clone(), 8, 2, stop.clone());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p = Pipeline::connect(&settings, &topology).await.unwrap();

    // Twice in a row under live traffic (issue 23, item 9: the cut's wait failed there), and
    // "no drift" means every item compared, none left in flight.
    for _ in 0..2 {
        let healthy = drift::run(&p, &Scope::All).await.unwrap();
        assert_eq!(
            (drifted(&healthy), healthy.in_flight()),
            (BTreeMap::new(), 0),
            "{healthy}"
        );
        assert!(healthy.items.len() >= 6, "{healthy}");
    }

    corrupt(&p, "item-3", 5).await;
    corrupt(&p, "item-5", -2).await;
    let report = drift::run(&p, &Scope::All).await.unwrap();
    let want: BTreeMap<String, i64> =
        [("item-3".to_string(), 5), ("item-5".to_string(), -2)].into();
    assert_eq!(drifted(&report), want, "{report}");
    let gauges = likes::ops::gauges::render(&report.gauges());
    assert!(gauges.contains("likes_drift_abs 7"), "{gauges}");

    // A run stopped right after sending its first correction, then run again.
    fail::cfg("reconcile-after-send", "1*return").unwrap();
    let items = p.all_items().await.unwrap();
    let stopped = reconcile::run(&p, items.clone(), false, "test").await;
    fail::remove("reconcile-after-send");
    assert!(
        stopped.is_err(),
        "the fail point stops the run after one send"
    );
    let again = reconcile::run(&p, items.clone(), false, "test")
        .await
        .unwrap();
    assert_eq!(
        again.corrections.len(),
        1,
        "only the item not sent before: {again}"
    );
    // Sent, and applied or refused by the correction fence: the stopped run's correction
    // may still be on its way to stage 2 at the rerun's cut, so the rerun can send that
    // item's again, and the fence refuses the second (seen once in three full `make test`
    // runs on this 2-core box). Exactness is what the drift run below checks.
    assert!(
        again.corrections.iter().all(|c| c.applied.is_some()),
        "{again}"
    );
    let after = drift::run(&p, &Scope::All).await.unwrap();
    assert_eq!(
        (drifted(&after), after.in_flight()),
        (BTreeMap::new(), 0),
        "{after}"
    );
    let nothing = reconcile::run(&p, items, false, "test").await.unwrap();
    assert!(
        nothing.corrections.is_empty(),
        "a second reconcile sends nothing: {nothing}"
    );

    // The same correction record sent twice: the correction fence refuses the copy.
    let sent = again.corrections[0].clone();
    let row = p.count_row(&sent.item).await.unwrap();
    resend(
        &settings,
        &topology,
        &sent,
        row.unwrap().last_correction.unwrap(),
    )
    .await;
    p.wait_counted().await.unwrap();
    let later = drift::run(&p, &Scope::Items(vec![sent.item.clone()]))
        .await
        .unwrap();
    assert_eq!(drifted(&later), BTreeMap::new(), "{later}");

    stop.store(true, Ordering::Relaxed);
    writers.await.unwrap();
    converge(&mut run, &settings, &app).await;
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}

/// Issue 23, item 2: the nightly reconcile and an operator's, at once. The CronJob's run (A)
/// takes its cut and is overtaken, between its wait and its recount, by the operator's (B),
/// whose later cut sees a like the pipeline lost after A's cut, and corrects it (+1). A then
/// reads the row holding B's correction: at its own, earlier cut that like did not exist yet,
/// so it sees a false drift of +1. Its −1 must be refused, and A settle at a later cut: the
/// count ends equal to the edges, not one short for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn two_reconcile_runs_at_once_never_correct_twice() {
    use likes::ops::reconcile;
    use scylla::value::CqlTimestamp;

    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve_with("twice", quick).await;
    let mut run = fx::start(&settings, &topology);
    let _relay = relay(&settings, &topology).await;
    for u in 0..4 {
        let (s, b) = client
            .like(&format!("u{u}"), "item-1", &format!("k{u}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    converge(&mut run, &settings, &app).await;

    // Run A (the nightly one) stops at the fail point after its cut and stays there until run B
    // has finished: the test waits for A to be there, not for a time a slow box may not meet,
    // and B passes the same point without stopping.
    let (at_cut, a_is_at_cut) = std::sync::mpsc::channel::<()>();
    let (release_a, a_released) = std::sync::mpsc::channel::<()>();
    let a_released = std::sync::Mutex::new(a_released);
    let first = std::sync::atomic::AtomicBool::new(true);
    let at_cut = std::sync::Mutex::new(at_cut);
    fail::cfg_callback("reconcile-after-wait", move || {
        // A's thread alone: B, and any other test's recount beside this one, pass.
        if crate::common::on_held_job() && first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let _ = at_cut.lock().unwrap().send(());
            let _ = a_released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(300));
        }
    })
    .unwrap();
    // On a runtime of its own: the fail point blocks the thread it runs on.
    let cronjob = {
        let (s, t) = (settings.clone(), topology.clone());
        crate::common::on_own_runtime(move || async move {
            let p = Pipeline::connect(&s, &t).await.unwrap();
            reconcile::run(&p, vec!["item-1".into()], false, "nightly").await
        })
    };
    tokio::task::spawn_blocking(move || a_is_at_cut.recv_timeout(Duration::from_secs(120)))
        .await
        .unwrap()
        .expect("run A reaches its cut's fail point");
    // A like the pipeline never saw (its event lost for good), stamped after A's cut.
    let p = Pipeline::connect(&settings, &topology).await.unwrap();
    let bucket = likes::hash::bucket_of("ghost", topology.buckets) as i32;
    p.session
        .query_unpaged(
            format!(
                "INSERT INTO {}.edges (item_id, bucket, user_id, state, op_id, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS",
                settings.cql.keyspace
            ),
            (
                "item-1",
                bucket,
                "ghost",
                likes::schema::v1::EdgeState::Liked as i8,
                1_i64,
                CqlTimestamp(likes::runtime::clock::now_ms()),
            ),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let operator = reconcile::run(&p, vec!["item-1".into()], false, "by hand")
        .await
        .unwrap();
    assert_eq!(
        operator
            .corrections
            .iter()
            .map(|c| (c.delta, c.applied))
            .collect::<Vec<_>>(),
        [(1, Some(true))],
        "{operator}"
    );
    release_a.send(()).unwrap();
    let nightly = tokio::task::spawn_blocking(move || cronjob.join().unwrap())
        .await
        .unwrap()
        .unwrap();
    fail::remove("reconcile-after-wait");
    assert!(
        nightly.corrections.iter().all(|c| c.applied != Some(true)),
        "the earlier cut's correction must not apply: {nightly}"
    );
    assert!(nightly.in_flight.is_empty(), "{nightly}");
    let want: BTreeMap<String, i64> = [("item-1".to_string(), 5)].into();
    assert_eq!(truth(&app).await, want);
    converge(&mut run, &settings, &app).await;
    let after = drift::run(&p, &Scope::Items(vec!["item-1".into()]))
        .await
        .unwrap();
    assert_eq!(
        (drifted(&after), after.in_flight()),
        (BTreeMap::new(), 0),
        "{after}"
    );
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}

/// Sends a copy of an applied correction (same id, same cut, same predecessor).
async fn resend(
    settings: &Settings,
    topology: &Topology,
    c: &likes::ops::reconcile::Sent,
    cut: i64,
) {
    use likes::schema::v1::{delta_record, Correction, DeltaRecord};
    use prost::Message as _;
    let producer: rdkafka::producer::FutureProducer =
        likes::kafka::producer_config(&settings.kafka)
            .create()
            .unwrap();
    let record = DeltaRecord {
        record: Some(delta_record::Record::Correction(Correction {
            item_id: c.item.clone(),
            delta: c.delta,
            correction_id: c.id.clone(),
            reason: "copy".into(),
            snapshot_time_ms: cut,
            after_snapshot_time_ms: 0,
        })),
    }
    .encode_to_vec();
    producer
        .send(
            rdkafka::producer::FutureRecord::to(&settings.topic(&topology.topics.deltas.name))
                .key(c.item.as_bytes())
                .payload(&record),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rebuild_after_dropping_the_counter_table_equals_ground_truth() {
    use likes::runtime::health::Health;
    use likes::runtime::shutdown::CancellationToken;

    // Its rebuilds pass the fail point another test arms.
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, app, client) = api::serve_with("rebuild", quick).await;
    // As in a deployment: a write answered 503 past its deadline, or one whose publish was
    // deferred (api.publish_wait), leaves its outbox entry to the relay, and the rebuild's
    // cut waits for entries older than it (seen: a 120 s timeout on one entry without it).
    let _relay = relay(&settings, &topology).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writers = churn(client.clone(), 12, 3, stop.clone());
    let stages = CancellationToken::new();
    // A failing assertion must fail the test, not hang its runtime on stage 1's thread.
    let _stop_on_drop = stages.clone().drop_guard();
    let (s, t, st) = (settings.clone(), topology.clone(), stages.clone());
    let dedupe = tokio::task::spawn_blocking(move || {
        likes::dedupe::run(&s, &t, st, Health::new("dedupe", Duration::from_secs(120)))
    });
    let start_count = |stop: CancellationToken| {
        let (s, t) = (settings.clone(), topology.clone());
        tokio::spawn(async move {
            likes::count::run(&s, &t, stop, Health::new("count", Duration::from_secs(120))).await
        })
    };
    let count_stop = CancellationToken::new();
    let count = start_count(count_stop.clone());
    tokio::time::sleep(Duration::from_secs(6)).await;

    // Stage 2 stopped, the table lost; the stream goes on.
    count_stop.cancel();
    count.await.unwrap().unwrap();
    let session = likes::cql::connect(&settings.cql).await.unwrap();
    likes::cql::schema_change(
        &session,
        format!("DROP TABLE {}.like_counts", settings.cql.keyspace),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    likes::cmd::migrate::run(&session, &settings.cql)
        .await
        .unwrap();

    let p = Pipeline::connect(&settings, &topology).await.unwrap();
    let report = likes::ops::rebuild::run(&p).await.unwrap();
    assert!(report.rows > 0, "{report}");
    // Twice in a row while likes flow (issue 23, item 9: the rebuild failed there, after its
    // wait, in 2 runs of 3): the second overwrites the first's rows with a later recount.
    let again = likes::ops::rebuild::run(&p).await.unwrap();
    assert!(again.rows >= report.rows, "{again}");
    let count_stop = CancellationToken::new();
    let count = start_count(count_stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writers.await.unwrap();

    let want = truth(&app).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let have = loop {
        let have = fx::nonzero(&fx::counts(&settings).await);
        if have == want || std::time::Instant::now() > deadline {
            break have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        have, want,
        "rebuilt counts plus the replayed tail equal the LIKED edges"
    );
    count_stop.cancel();
    stages.cancel();
    count.await.unwrap().unwrap();
    dedupe.await.unwrap().unwrap();
    fx::teardown(&settings, &topology).await;
}

/// Issue 23, item 8: `likes rebuild` no longer trusts stage 2 to stay stopped. While a
/// rebuild is recorded (under way, or killed before its end), a stage 2 that starts waits:
/// it writes no counter row until the record is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_2_started_during_a_rebuild_waits_for_it() {
    let (settings, topology, app, client) = api::serve_with("rebuilding", quick).await;
    for u in 0..3 {
        let (s, b) = client
            .like(&format!("u{u}"), "item-1", &format!("k{u}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let ks = &settings.cql.keyspace;
    likes::store::recorded::mark_rebuilding(&app.session, ks, likes::runtime::clock::now_ms())
        .await
        .unwrap();
    let mut run = fx::start(&settings, &topology);
    tokio::time::sleep(Duration::from_secs(8)).await;
    run.check().await;
    assert_eq!(
        fx::counts(&settings).await,
        BTreeMap::new(),
        "stage 2 wrote counter rows during a rebuild"
    );
    likes::store::recorded::rebuild_done(&app.session, ks)
        .await
        .unwrap();
    converge(&mut run, &settings, &app).await;
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}

/// Issue 43, item 8: a stage 2 that read "no rebuild" just before the rebuild marked itself
/// joins its group after the mark. Checked only before the mark, the rebuild ran beside it
/// (the stage's next commit undoes the rebuild's positions); it must look again, refuse, and
/// take its mark back. The joining stage 2 is a member of the count group that joins at the
/// fail point right after the mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_stage_2_that_joins_right_after_the_rebuilds_mark_makes_it_refuse() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let _turn = FAILPOINTS.lock().await;
    let (settings, topology, _app, _client) = api::serve_with("rebuildjoin", quick).await;
    let p = Pipeline::connect(&settings, &topology).await.unwrap();
    let group = settings.group(&topology.groups.count);
    let deltas = settings.topic(&topology.topics.deltas.name);
    let joined: Arc<std::sync::Mutex<Option<BaseConsumer>>> = Arc::default();
    let member = joined.clone();
    let kafka = settings.kafka.clone();
    fail::cfg_callback("rebuild-after-mark", move || {
        let c: BaseConsumer = likes::kafka::client_config(&kafka)
            .set("group.id", &group)
            .create()
            .unwrap();
        c.subscribe(&[&deltas]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while c.assignment().map(|a| a.count()).unwrap_or(0) == 0 {
            assert!(std::time::Instant::now() < deadline, "never joined");
            let _ = c.poll(Duration::from_millis(200));
        }
        *member.lock().unwrap() = Some(c);
    })
    .unwrap();
    let refused = likes::ops::rebuild::run(&p).await;
    fail::remove("rebuild-after-mark");
    let err = refused.expect_err("the rebuild ran beside a live stage 2");
    assert!(err.to_string().contains("live members"), "{err}");
    assert!(joined.lock().unwrap().is_some(), "the member joined");
    // The mark went: a stage 2 may start.
    let session = likes::cql::connect(&settings.cql).await.unwrap();
    let mark = likes::store::recorded::rebuilding(&session, &settings.cql.keyspace)
        .await
        .unwrap();
    assert_eq!(mark, None, "the rebuild's mark is left");
    drop(joined.lock().unwrap().take());
    fx::teardown(&settings, &topology).await;
}

/// Issue 57, item 3: each API pod answers "was this account erased?" from its own set,
/// refreshed every `api.erased_refresh`, so a write by an account erased through another
/// process may pass until that pod's next refresh. What covers it is the erasure's walk,
/// which starts after the erasure: it takes that like back, and the counts follow. A pod that
/// starts after the erasure refuses the account from its first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_like_inside_the_erased_sets_refresh_gap_is_taken_back_by_the_walk() {
    let (settings, topology, app, client) = api::serve_with("erasegap", |s| {
        quick(s);
        // Loaded at this pod's start and not refreshed within the test: an erasure recorded
        // by another process after the start stays in the gap a refresh would close.
        s.api.erased_refresh = Duration::from_secs(3600);
    })
    .await;
    let mut run = fx::start(&settings, &topology);
    let (s, b) = client.like("gap", "gap-1", "g1").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // The erasure, recorded by another process (`likes erase --user`, or another pod).
    let elsewhere = likes::store::Stores::prepare(&app.session, &settings.cql.keyspace)
        .await
        .unwrap();
    let erasure = elsewhere
        .erasures
        .request("gap", likes::runtime::clock::now_ms())
        .await
        .unwrap();
    let (s, b) = client.like("gap", "gap-2", "g2").await;
    assert_eq!(
        s,
        StatusCode::OK,
        "inside the gap, this pod's set does not know the erasure yet: {b}"
    );
    let states = likes_testkit::truth::edge_states(&app.session, &settings.cql.keyspace)
        .await
        .unwrap();
    assert_eq!(
        states.get(&("gap-2".to_string(), "gap".to_string())),
        Some(&true)
    );

    // The erasure's walk takes back both likes, the one from inside the gap included.
    // (The job waits for every pod to refuse the account, as configured: the pods' refresh
    // as deployed, not this test pod's.)
    let mut as_deployed = settings.clone();
    as_deployed.api.erased_refresh = Duration::from_millis(200);
    let job = likes::ops::erase::Eraser::connect(&as_deployed, &topology)
        .await
        .unwrap();
    let report = likes::ops::erase::run(&job, None).await.unwrap();
    assert_eq!(report.erasures.len(), 1, "{report}");
    assert_eq!(report.erasures[0].id, erasure.id);
    assert_eq!(report.erasures[0].unliked, 2, "{report}");
    let states = likes_testkit::truth::edge_states(&app.session, &settings.cql.keyspace)
        .await
        .unwrap();
    for item in ["gap-1", "gap-2"] {
        assert_eq!(
            states.get(&(item.to_string(), "gap".to_string())),
            Some(&false),
            "{item}: taken back by the walk"
        );
    }
    let counts = converge(&mut run, &settings, &app).await;
    assert!(counts.is_empty(), "nothing liked is left: {counts:?}");

    // A pod that starts now loads every erased account: refused from its first write.
    let (pod, _) = likes::write::Writer::connect(&settings, &topology)
        .await
        .unwrap();
    let refused = pod
        .write(&likes::write::Write::by_user("gap", "gap-3", true, "g3"))
        .await;
    assert!(
        matches!(refused, Err(likes::write::WriteError::Erased { erasure: ref id, .. }) if *id == erasure.id),
        "{refused:?}"
    );
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}
