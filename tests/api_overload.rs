//! Overload: writes past the in-flight bound are shed at once with 503 and Retry-After, and
//! a concurrent reader's latency stays near its unloaded latency. Both tests slow the database
//! with a fail point: `make test` builds with `--features likes/failpoints`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use common::api;
use common::topology as fx;

/// The tests of this file one at a time: a fail point is process-wide, and the fixed-bound
/// test must not see the other's slow database.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

async fn read_latencies(client: &api::Client, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let (s, _) = client
            .get("reader", &format!("/v1/items/item-{i}/count"))
            .await;
        assert_eq!(s, StatusCode::OK);
        out.push(started.elapsed());
    }
    out
}

/// Sets a fail point's delay on every write and removes it on the way out, whatever happens:
/// the other test must not inherit the delay.
struct SlowWrites;

impl SlowWrites {
    fn hold_each_write_ms(ms: u64) -> Self {
        fail::cfg("api-write-delay", &format!("return({ms})")).unwrap();
        SlowWrites
    }
}

impl Drop for SlowWrites {
    fn drop(&mut self) {
        fail::remove("api-write-delay");
    }
}

/// How long the fail point holds each admitted write in the shedding test. Long on purpose:
/// what the test tells apart is "answered at once" from "waited behind a held write", and a
/// hold this long keeps the two apart on any box, fast or loaded (a GC pause is not 2 s).
/// Shorter than `api.write_deadline` (5 s), inside which the hold runs, so held writes
/// still succeed.
const HOLD: Duration = Duration::from_secs(2);

/// Each admitted write is held `HOLD` (a fail point), so 4 slots are overloaded whatever the
/// box: without it a fast box wrote the whole flood through 4 slots and shed almost nothing
/// (CI, 2026-12-04: 40 shed). Latency is not compared with an unloaded baseline (that is a
/// measure of the box: `make bench` shows it); what is asserted is structural: no shed write
/// and no read waited for a write slot, since each answered in less than a held write takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn writes_past_the_bound_are_shed_fast_and_reads_keep_serving() {
    let _alone = ALONE.lock().await;
    let (settings, topology, _app, client) = api::serve_with("overload", |s| {
        s.api.max_writes_in_flight = 4;
        // A fixed bound: this test is about shedding past it.
        s.api.write_latency_target = Duration::ZERO;
        s.api.max_writes_per_s = 0.0;
    })
    .await;
    let unloaded = read_latencies(&client, 300).await;
    let slow = SlowWrites::hold_each_write_ms(HOLD.as_millis() as u64);

    // 16 writers against 4 slots held `HOLD` each, while the reader reads. The writers pause
    // between requests so that this process, which is also the load generator, leaves the
    // box's 2 cores to the server.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let (c, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let started = Instant::now();
                    let r = c
                        .http
                        .post(format!("{}/v1/items/item-{}/likes", c.base, i % 50))
                        .bearer_auth(c.token(&format!("w{w}")))
                        .header("Idempotency-Key", format!("k{w}-{i}"))
                        .send()
                        .await
                        .unwrap();
                    let retry_after = r.headers().get("retry-after").is_some();
                    seen.push((r.status(), retry_after, started.elapsed()));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let loaded = read_latencies(&client, 300).await;
    stop.store(true, Ordering::Relaxed);
    let mut shed = Vec::new();
    let mut offered = 0;
    let mut ok = 0;
    for w in writers {
        for (status, retry_after, took) in w.await.unwrap() {
            offered += 1;
            match status {
                StatusCode::OK => ok += 1,
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert!(retry_after, "a shed write says when to retry");
                    shed.push(took);
                }
                other => panic!("unexpected {other}"),
            }
        }
    }
    drop(slow);
    assert!(ok >= 4, "the admitted writes succeed: {ok}");
    assert!(
        shed.len() >= 50 && shed.len() * 2 > offered,
        "most of the flood is shed: {} of {offered}",
        shed.len()
    );
    shed.sort();
    let (shed_median, shed_max) = (shed[shed.len() / 2], shed[shed.len() - 1]);
    let (before, during) = (p99(unloaded), p99(loaded.clone()));
    let slowest_read = loaded.iter().max().copied().unwrap_or_default();
    eprintln!(
        "ok {ok}, shed {}, shed median {shed_median:?} max {shed_max:?}; reader p99 unloaded \
         {before:?}, during the flood {during:?}, slowest {slowest_read:?} (measured, not asserted)",
        shed.len()
    );
    assert!(
        shed_max < HOLD,
        "shedding answers at once, never after waiting for a slot: slowest shed {shed_max:?}"
    );
    assert!(
        slowest_read < HOLD,
        "reads never wait behind held writes: slowest read {slowest_read:?}"
    );
    fx::teardown(&settings, &topology).await;
}

/// `writers` closed-loop writers for `for_`; returns (answered 200, shed with 503).
async fn flood(
    client: &Arc<api::Client>,
    tag: &str,
    writers: usize,
    for_: Duration,
) -> (usize, usize) {
    let until = Instant::now() + for_;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (c, tag) = (client.clone(), tag.to_string());
            tokio::spawn(async move {
                let (mut ok, mut shed, mut i) = (0, 0, 0);
                while Instant::now() < until {
                    i += 1;
                    let r = c
                        .http
                        .post(format!("{}/v1/items/item-{}/likes", c.base, i % 50))
                        .bearer_auth(c.token(&format!("{tag}{w}")))
                        .header("Idempotency-Key", format!("{tag}{w}-{i}"))
                        .send()
                        .await
                        .unwrap();
                    match r.status() {
                        StatusCode::OK => ok += 1,
                        StatusCode::SERVICE_UNAVAILABLE => {
                            shed += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        other => panic!("unexpected {other}"),
                    }
                }
                (ok, shed)
            })
        })
        .collect();
    let mut total = (0, 0);
    for t in tasks {
        let (ok, shed) = t.await.unwrap();
        total = (total.0 + ok, total.1 + shed);
    }
    total
}

/// The adaptive limit on writes in flight: when the database slows (a fail point holds every
/// write 1.5 s, three times `api.write_latency_target`), the limit comes down and the API
/// sheds what would only queue; when it is fast again, the limit goes back up and nothing is
/// shed. With a fixed bound of 64, the 16 writers would all be admitted and wait.
///
/// The target is far above a fast write's latency on purpose: the test's debug build on a
/// busy 2-core CI box has put 16 concurrent writes' p99 past 100 ms with no delay at all
/// (CI, 2026-12-02: the fast phases shed more than they admitted at a 100 ms target).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn the_write_limit_comes_down_when_the_database_slows_and_goes_back_up() {
    let _alone = ALONE.lock().await;
    let (settings, topology, _app, client) = api::serve_with("adaptive", |s| {
        s.api.max_writes_in_flight = 64;
        s.api.write_latency_target = Duration::from_millis(500);
        s.api.max_writes_per_s = 0.0;
    })
    .await;
    let (ok, shed) = flood(&client, "a", 16, Duration::from_secs(2)).await;
    eprintln!("fast: ok {ok}, shed {shed}");
    assert!(ok > 0, "writes are answered");

    let slow = SlowWrites::hold_each_write_ms(1500);
    // The limit moves at most halved per window, and a window closes on the first write to
    // end after 1 s: from ~20 to the floor of 4 takes three 1.5 s rounds.
    let (settle_ok, settle_shed) = flood(&client, "b", 16, Duration::from_secs(8)).await;
    let (ok, shed) = flood(&client, "c", 16, Duration::from_secs(6)).await;
    eprintln!("slow: settling ok {settle_ok}, shed {settle_shed}; then ok {ok}, shed {shed}");
    // 16 writers at 1.5 s each would write 64 in 6 s if all were admitted; the limit at its
    // floor of 4 admits ~16.
    assert!(
        shed > ok && ok < 16 * 6 * 1000 / 1500 / 2,
        "a slow database: the limit came down and the API sheds (ok {ok}, shed {shed})"
    );

    drop(slow);
    // The writes still held by the delay end within 1.5 s and pull the limit down once more;
    // then it grows by its square root per window, 4 to 16 in about five. How long that takes
    // depends on the box (a window closes after 1 s and enough writes), so the test waits for
    // the outcome, a 2 s round with next to nothing shed, for at most a minute, instead of
    // asserting it after a fixed time.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rounds = Vec::new();
    loop {
        let tag = format!("e{}-", rounds.len());
        let (ok, shed) = flood(&client, &tag, 16, Duration::from_secs(2)).await;
        rounds.push((ok, shed));
        // Loose: on a busy box 16 concurrent writes sometimes pass the target for a window
        // and shed a few while the limit is near the writers' count (runs here: 0 to 4 %);
        // the slow phase shed 40 times what it admitted.
        if ok > 0 && shed * 9 <= ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a fast database again: the limit never went back up in a minute (ok, shed per 2 s round: {rounds:?})"
        );
    }
    eprintln!("fast again: (ok, shed) per 2 s round until one shed next to nothing: {rounds:?}");
    fx::teardown(&settings, &topology).await;
}

/// Issue 44, item 4: batchGet reads up to 200 rows a call and passes no admission; past
/// `api.max_batch_gets_in_flight` a call is refused at once with 503 and Retry-After. One call
/// is held inside by a fail point (as a slow database would hold it); the next is refused, and
/// once the first is done calls are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn batch_gets_past_their_bound_are_refused_at_once() {
    let _alone = ALONE.lock().await;
    let (settings, topology, _app, client) = api::serve_with("batchbound", |s| {
        s.api.max_batch_gets_in_flight = 1;
    })
    .await;
    let hold = common::Hold::first_at("api-batch-get");
    let batch = |client: Arc<api::Client>| async move {
        let items: Vec<String> = (0..100).map(|i| format!("b{i}")).collect();
        let r = client
            .http
            .post(format!("{}/v1/likes:batchGet", client.base))
            .bearer_auth(client.token("reader"))
            .json(&serde_json::json!({ "itemIds": items }))
            .send()
            .await
            .unwrap();
        (r.status(), r.headers().contains_key("retry-after"))
    };
    let first = tokio::spawn(batch(client.clone()));
    hold.reached().await;
    let (s, retry) = batch(client.clone()).await;
    assert_eq!((s, retry), (StatusCode::SERVICE_UNAVAILABLE, true));
    hold.release();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(batch(client.clone()).await.0, StatusCode::OK);
    fx::teardown(&settings, &topology).await;
}

/// Issue 45, item 3: the erased-account check must not serialize the pod. One check's read is
/// held inside by a fail point, as a slow replica or a read behind a flush would hold it; a
/// write of another user is answered meanwhile (with one read at a time it waited for the
/// held one: the write path's tail), and the held write is answered once released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_held_erased_account_check_holds_no_other_write() {
    let _alone = ALONE.lock().await;
    // Without the pod's set of erased accounts every write asks the database (as it does
    // while the set is not current): the path this test holds.
    let (settings, topology, _app, client) = api::serve_with("erasedcheck", |s| {
        s.api.erased_refresh = Duration::ZERO;
    })
    .await;
    // Warm: statements prepared, the connection open.
    assert_eq!(
        client.like("warm", "item-e", "warm-1").await.0,
        StatusCode::OK
    );
    let hold = common::Hold::first_at("api-erased-check");
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.like("held", "item-e", "held-1").await })
    };
    hold.reached().await;
    let other = tokio::time::timeout(
        Duration::from_secs(30),
        client.like("other", "item-e", "other-1"),
    )
    .await;
    hold.release();
    let (s, b) = other.expect("another user's write waited for the held check");
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = first.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    fx::teardown(&settings, &topology).await;
}
