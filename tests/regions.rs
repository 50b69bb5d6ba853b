//! The Paxos-scope decision of docs/multi-region.md, held against a real two-datacenter
//! Cassandra (`make up-regions`: region-a on 127.0.0.2, region-b on 127.0.0.3, one replica
//! in each). Ignored by `make test`, which runs one node; `make test-regions` starts the
//! two nodes and runs these.
//!
//! Two writers, one per region, each through a session of the project's own (`cql::connect`
//! with `cql.local_datacenter` set), race conditional writes on the same rows. At the
//! session's serial consistency (SERIAL: one Paxos group per row across both datacenters)
//! exactly one wins each row, and both regions read the winner.

mod common;

use common::regions::{homed_in_a, region};

use std::sync::Arc;
use std::time::Duration;

use likes::config::{ReplicationClass, Settings};
use scylla::client::session::Session;
use scylla::statement::unprepared::Statement;
use scylla::statement::Consistency;
use scylla::value::CqlValue;

const ROWS: i32 = 300;

/// Both regions' sessions, on a fresh keyspace replicated once in each datacenter.
async fn two_regions(base: &str) -> (String, Arc<Session>, Arc<Session>) {
    let mut settings = common::settings(base);
    settings.cql.replication.class = ReplicationClass::NetworkTopologyStrategy;
    settings.cql.replication.datacenters =
        [("region-a".to_string(), 1), ("region-b".to_string(), 1)].into();
    let a = region(&settings, "region-a", "127.0.0.2");
    let b = region(&settings, "region-b", "127.0.0.3");
    let connect = |s: Settings| async move {
        likes::cql::connect(&s.cql)
            .await
            .unwrap_or_else(|e| panic!("{}: {e} (is `make up-regions` up?)", s.cql.nodes[0]))
    };
    let (sa, sb) = (connect(a).await, connect(b).await);
    let ks = settings.cql.keyspace.clone();
    let mut ddl = Statement::new(likes::cql::tables::create_keyspace(
        &ks,
        &settings.cql.replication,
    ));
    ddl.set_consistency(Consistency::All);
    sa.query_unpaged(ddl, ()).await.expect("keyspace");
    let mut table = Statement::new(format!(
        "CREATE TABLE {ks}.rows (k int PRIMARY KEY, writer text)"
    ));
    table.set_consistency(Consistency::All);
    sa.query_unpaged(table, ()).await.expect("table");
    sa.await_schema_agreement().await.expect("schema agreement");
    (ks, sa, sb)
}

/// Each row's outcome for one writer: won, and how many attempts timed out first. A
/// timed-out conditional write has an unknown outcome (Paxos may finish it later), so the
/// writer retries it as the write path does with its request key: a row that already holds
/// this writer's value was won by its own earlier attempt.
async fn race(ks: &str, session: Arc<Session>, writer: &'static str) -> (Vec<bool>, usize) {
    let mut insert = session
        .prepare(format!(
            "INSERT INTO {ks}.rows (k, writer) VALUES (?, ?) IF NOT EXISTS"
        ))
        .await
        .expect("prepare");
    // The commit is local; which rows win is Paxos's business, at the session's scope.
    insert.set_consistency(Consistency::LocalQuorum);
    let (mut won, mut timeouts) = (Vec::with_capacity(ROWS as usize), 0);
    for k in 0..ROWS {
        let outcome = loop {
            match session.execute_unpaged(&insert, (k, writer)).await {
                Ok(result) => match likes::store::not_applied(result).expect("cas answer") {
                    None => break true,
                    Some(cols) => {
                        let holder = cols
                            .iter()
                            .find(|(name, _)| name == "writer")
                            .and_then(|(_, v)| v.clone());
                        break matches!(holder, Some(CqlValue::Text(w)) if w == writer);
                    }
                },
                Err(e) if format!("{e:?}").contains("WriteTimeout") => timeouts += 1,
                Err(e) => panic!("row {k} from region {writer}: {e}"),
            }
        };
        won.push(outcome);
    }
    (won, timeouts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn serial_conditional_writes_from_two_datacenters_have_one_winner_per_row() {
    let (ks, sa, sb) = two_regions("regions_serial").await;
    let (ka, kb) = (ks.clone(), ks.clone());
    let (sa2, sb2) = (sa.clone(), sb.clone());
    let (ra, rb) = tokio::join!(
        tokio::spawn(async move { race(&ka, sa2, "a").await }),
        tokio::spawn(async move { race(&kb, sb2, "b").await })
    );
    let ((ra, ta), (rb, tb)) = (ra.expect("region a"), rb.expect("region b"));
    let both = ra.iter().zip(&rb).filter(|(a, b)| **a && **b).count();
    let neither = ra.iter().zip(&rb).filter(|(a, b)| !**a && !**b).count();
    let (wins_a, wins_b) = (
        ra.iter().filter(|w| **w).count(),
        rb.iter().filter(|w| **w).count(),
    );
    println!(
        "SERIAL from two datacenters, {ROWS} rows: region-a won {wins_a}, region-b won {wins_b}, \
         both {both}, neither {neither}; contended attempts timed out and were retried: a {ta}, b {tb}"
    );
    assert_eq!((both, neither), (0, 0), "every row has exactly one winner");

    // Each region reads the winner it was told of, at SERIAL.
    for (session, mine, name) in [(&sa, &ra, "a"), (&sb, &rb, "b")] {
        let mut read = session
            .prepare(format!("SELECT writer FROM {ks}.rows WHERE k = ?"))
            .await
            .expect("prepare");
        read.set_consistency(Consistency::Serial);
        for k in 0..ROWS {
            let (writer,) = session
                .execute_unpaged(&read, (k,))
                .await
                .expect("read")
                .into_rows_result()
                .expect("rows")
                .first_row::<(String,)>()
                .expect("one row");
            let winner = if mine[k as usize] {
                name
            } else if name == "a" {
                "b"
            } else {
                "a"
            };
            assert_eq!(writer, winner, "row {k} read from region {name}");
        }
    }
    let _ = sa.query_unpaged(format!("DROP KEYSPACE {ks}"), ()).await;
}

/// One region's API, in this process, on the shared two-datacenter keyspace.
async fn region_api(
    settings: &Settings,
    topology: &likes::topology::Topology,
) -> common::api::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, settings, topology).await
}

async fn serve_on(
    listener: tokio::net::TcpListener,
    settings: &Settings,
    topology: &likes::topology::Topology,
) -> common::api::Client {
    common::regions::serve(listener, settings, topology, None).await
}

/// One write's outcome, timed from the move's start.
struct Tried {
    region: &'static str,
    started: Duration,
    status: u16,
    error: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn a_move_fences_the_old_home_before_the_new_one_writes() {
    let (a, b, topology, session) = homed_in_a("regions_move").await;
    let (api_a, api_b) = (
        region_api(&a, &topology).await,
        region_api(&b, &topology).await,
    );

    let item = "moved-item";
    let range = likes::region::range_of(item, 4);
    // Before: region-a writes the item; region-b refuses it and names its home.
    let (st, body) = api_b.like("u-first", item, "k-first-b").await;
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"], "not_home", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("region-a"),
        "{body}"
    );
    let (st, body) = api_a.like("u-first", item, "k-first-a").await;
    assert_eq!(st, 200, "{body}");

    // A writer whose lease, deadline and CQL timeout outlast the fence the init recorded is
    // refused at start: a move would not wait out its writes.
    let mut long = a.clone();
    long.region.lease = Duration::from_secs(10);
    let err = likes::api::App::connect(&long, &topology)
        .await
        .err()
        .expect("a writer with a longer lease than the fence");
    assert!(err.to_string().contains("longer than the fence"), "{err}");

    // A misspelt region is refused before anything moves.
    let err = likes::ops::region::r#move(
        &a,
        &topology,
        likes::ops::region::Which::Ranges(vec![range]),
        "regoin-b",
        false,
    )
    .await
    .err()
    .expect("a move to a region nobody knows");
    assert!(
        err.to_string().contains("no region named \"regoin-b\""),
        "{err}"
    );

    // The move, with both regions writing the item all along.
    let fence = likes::ops::region::fence(&a);
    let t0 = std::time::Instant::now();
    let mover = {
        let a = a.clone();
        tokio::spawn(async move {
            common::regions::move_only(
                &a,
                likes::ops::region::Which::Ranges(vec![range]),
                "region-b",
            )
            .await
        })
    };
    let mut tried = Vec::new();
    let mut n = 0;
    while !mover.is_finished()
        || tried
            .iter()
            .filter(|t: &&Tried| t.region == "b" && t.status == 200)
            .count()
            < 3
    {
        for (name, api) in [("a", &api_a), ("b", &api_b)] {
            n += 1;
            let started = t0.elapsed();
            let (st, body) = api.like(&format!("u{n}"), item, &format!("k{n}")).await;
            tried.push(Tried {
                region: name,
                started,
                status: st.as_u16(),
                error: body["error"].as_str().unwrap_or("").into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            t0.elapsed() < fence + Duration::from_secs(30),
            "the move did not finish"
        );
    }
    let report = mover.await.unwrap().expect("move");
    assert_eq!(report.moved, vec![range]);

    let last_a = tried
        .iter()
        .filter(|t| t.region == "a" && t.status == 200)
        .map(|t| t.started)
        .max();
    let first_b = tried
        .iter()
        .filter(|t| t.region == "b" && t.status == 200)
        .map(|t| t.started)
        .min()
        .unwrap();
    println!(
        "move of range {range}: {} writes tried; region-a's last success started at {last_a:?}, region-b's first at \
         {first_b:?}; fence {fence:?}; move took {:?}",
        tried.len(),
        report.took
    );
    // Never two homes: the old home's last write started before the new home's first, a
    // whole fence (its writes' deadline and one CQL timeout) apart.
    if let Some(last_a) = last_a {
        assert!(
            last_a + fence - a.region.lease <= first_b,
            "a wrote at {last_a:?}, b at {first_b:?}"
        );
    }
    assert!(
        first_b >= fence,
        "region-b wrote before the fence ended: {first_b:?}"
    );
    // Every refusal said why: the old home names the new one, the new one waits for the settle.
    for t in &tried {
        if t.status != 200 {
            assert_eq!(t.status, 503);
            assert!(
                t.error == "not_home" || t.error == "unavailable",
                "{}",
                t.error
            );
        }
    }
    // After: region-b writes it, region-a refuses it and names region-b.
    let (st, body) = api_a.like("u-after", item, "k-after-a").await;
    assert_eq!(
        (st.as_u16(), body["error"].as_str()),
        (503, Some("not_home")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("region-b"),
        "{body}"
    );
    // The first like, made at region-a before the move, is seen by region-b: a retry of its
    // request key replays the answer instead of writing again.
    let (st, body) = api_b.like("u-first", item, "k-first-a").await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        body["changed"], true,
        "the replayed answer is the original one: {body}"
    );
    let status = likes::ops::region::status(&a)
        .await
        .expect("status")
        .to_string();
    assert!(status.contains("no move under way"), "{status}");
    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {}", a.cql.keyspace), ())
        .await;
}

/// A like of a region-a item, sent to region-b: the answer, its status and who answered.
async fn like_at(
    api: &common::api::Client,
    user: &str,
    item: &str,
    key: &str,
    extra: Option<(&str, &str)>,
) -> (u16, serde_json::Value, String) {
    let mut req = api
        .http
        .post(format!("{}/v1/items/{item}/likes", api.base))
        .bearer_auth(api.token(user))
        .header("Idempotency-Key", key);
    if let Some((k, v)) = extra {
        req = req.header(k, v);
    }
    let r = req.send().await.unwrap();
    let by = r
        .headers()
        .get("x-likes-region")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (
        r.status().as_u16(),
        r.json().await.unwrap_or(serde_json::Value::Null),
        by,
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn a_write_at_another_region_is_forwarded_to_the_home_with_its_key() {
    let (mut a, mut b, topology, session) = homed_in_a("regions_forward").await;
    let (la, lb) = common::regions::peered(&mut a, &mut b).await;
    let api_a = serve_on(la, &a, &topology).await;
    let api_b = serve_on(lb, &b, &topology).await;

    // A region-a item liked at region-b: region-a answers, and says so.
    let item = "forwarded-item";
    let (st, body, by) = like_at(&api_b, "u1", item, "k1", None).await;
    assert_eq!(
        (st, by.as_str(), body["changed"].as_bool()),
        (200, "region-a", Some(true)),
        "{body}"
    );
    // Its retry, at the home itself, replays the answer: one flip.
    let (st, again, by) = like_at(&api_a, "u1", item, "k1", None).await;
    assert_eq!((st, by.as_str()), (200, "region-a"));
    assert_eq!(
        again, body,
        "the retry at the home replays the forwarded request's answer"
    );

    // The hop: likes of one item sent to its home, and to the other region.
    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    for i in 0..40 {
        let t = std::time::Instant::now();
        assert_eq!(
            like_at(&api_a, &format!("d{i}"), item, &format!("d{i}"), None)
                .await
                .0,
            200
        );
        direct.push(t.elapsed());
        let t = std::time::Instant::now();
        assert_eq!(
            like_at(&api_b, &format!("f{i}"), item, &format!("f{i}"), None)
                .await
                .0,
            200
        );
        forwarded.push(t.elapsed());
    }
    let (d, f) = (median(direct), median(forwarded));
    println!("write at the home: median {d:?}; forwarded from the other region: median {f:?} (hop {:?}, loopback)", f.saturating_sub(d));

    // A forwarded request is never forwarded again.
    let (st, body, by) = like_at(
        &api_b,
        "u2",
        item,
        "k2",
        Some(("x-likes-forwarded-by", "region-c")),
    )
    .await;
    assert_eq!(
        (st, body["error"].as_str(), by.as_str()),
        (503, Some("not_home"), "region-b"),
        "{body}"
    );

    // A region that cannot reach the home fails the write fast and writes nothing.
    let mut c = b.clone();
    c.region.peers = [("region-a".to_string(), "http://127.0.0.1:9".to_string())].into();
    let api_c = region_api(&c, &topology).await;
    let t = std::time::Instant::now();
    let (st, body, _) = like_at(&api_c, "u3", item, "k3", None).await;
    println!("home unreachable: {st} after {:?}", t.elapsed());
    assert_eq!(
        (st, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("did not answer"),
        "{body}"
    );
    let (st, liked) = api_a.get("u3", &format!("/v1/items/{item}/likes/u3")).await;
    assert_eq!(
        (st.as_u16(), liked["liked"].as_bool()),
        (200, Some(false)),
        "nothing was written: {liked}"
    );

    // After a move the other way round, region-a forwards to region-b.
    let range = likes::region::range_of(item, 4);
    common::regions::move_only(
        &a,
        likes::ops::region::Which::Ranges(vec![range]),
        "region-b",
    )
    .await
    .expect("move");
    tokio::time::sleep(a.region.refresh * 3).await;
    let (st, body, by) = like_at(&api_a, "u4", item, "k4", None).await;
    assert_eq!(
        (st, by.as_str(), body["changed"].as_bool()),
        (200, "region-b", Some(true)),
        "{body}"
    );
    // The first like's key, retried at the old home after the move, still replays.
    let (st, replay, by) = like_at(&api_a, "u1", item, "k1", None).await;
    assert_eq!((st, by.as_str()), (200, "region-b"));
    assert_eq!(
        replay, again,
        "a retry after the move replays, wherever it lands"
    );
    // Reads are local, and say which region answered.
    for (api, name) in [(&api_a, "region-a"), (&api_b, "region-b")] {
        let (st, c) = api.get("u1", &format!("/v1/items/{item}/count")).await;
        assert_eq!(
            (st.as_u16(), c["region"].as_str()),
            (200, Some(name)),
            "{c}"
        );
    }
    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {}", a.cql.keyspace), ())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn an_erasure_is_done_once_each_region_has_taken_back_the_likes_of_its_items() {
    let (a, b, topology, session) = homed_in_a("regions_erase").await;
    // One item homed in each region.
    let item_a = "erase-item-a";
    let r_a = likes::region::range_of(item_a, 4);
    let item_b = (0..)
        .map(|i| format!("erase-item-b{i}"))
        .find(|i| likes::region::range_of(i, 4) != r_a)
        .unwrap();
    let r_b = likes::region::range_of(&item_b, 4);
    common::regions::move_only(&a, likes::ops::region::Which::Ranges(vec![r_b]), "region-b")
        .await
        .expect("move");
    tokio::time::sleep(a.region.refresh * 3).await;
    let (api_a, api_b) = (
        region_api(&a, &topology).await,
        region_api(&b, &topology).await,
    );
    let user = "leaving-user";
    assert_eq!(api_a.like(user, item_a, "k-a").await.0, 200);
    assert_eq!(api_b.like(user, &item_b, "k-b").await.0, 200);
    let edges = likes::store::edges::Edges::prepare(session.clone(), &a.cql.keyspace)
        .await
        .unwrap();
    let liked = |item: String| {
        let edges = &edges;
        async move {
            let bucket = likes::hash::bucket_of(user, topology.buckets) as i32;
            edges
                .read(&item, bucket, user)
                .await
                .unwrap()
                .is_some_and(|e| e.liked)
        }
    };

    // Region-a's job takes back region-a's like and leaves region-b's to region-b.
    let job_a = likes::ops::erase::Eraser::connect(&a, &topology)
        .await
        .unwrap();
    let report = likes::ops::erase::run(&job_a, Some(user)).await.unwrap();
    println!("{report}");
    let id = report.erasures[0].id.clone();
    assert_eq!(report.erasures[0].state, "unliking", "{report}");
    assert_eq!(
        report.left,
        vec![(id.clone(), 1, ["region-b".to_string()].into())],
        "{report}"
    );
    assert!(
        !liked(item_a.to_string()).await,
        "region-a's like taken back"
    );
    assert!(
        liked(item_b.clone()).await,
        "region-b's like is region-b's to take back"
    );
    // The user can write nowhere any more: region-b's API learns the erasure (recorded by
    // region-a's job) at its set's next refresh (`api.erased_refresh`; docs/exactness.md,
    // "Erasure"). A like it lets through before that is a no-op here (the edge is liked).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (s, e) = api_b.like(user, &item_b, "k-b2").await;
        if s == 403 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "region-b still takes the erased user's writes: {s} {e}"
        );
        tokio::time::sleep(b.api.erased_refresh).await;
    }

    // Region-b's job takes back the rest, and its walk finds nothing left: done.
    let job_b = likes::ops::erase::Eraser::connect(&b, &topology)
        .await
        .unwrap();
    let report = likes::ops::erase::run(&job_b, None).await.unwrap();
    println!("{report}");
    let e = report.erasures.iter().find(|e| e.id == id).unwrap();
    assert_eq!(e.state, "unliked", "{report}");
    assert!(report.left.is_empty(), "{report}");
    assert!(!liked(item_b.clone()).await, "region-b's like taken back");
    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {}", a.cql.keyspace), ())
        .await;
}
