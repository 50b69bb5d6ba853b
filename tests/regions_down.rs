//! A move to a region whose Cassandra node is down (kill -9): refused with its reason, the
//! range still the old home's, and the same move finishing once the node is back. A test
//! binary of its own: it takes region-b down, which the tests of tests/regions.rs must not
//! see (cargo runs test binaries one at a time). Ignored by `make test`; `make test-regions`
//! runs it.

mod common;

use common::regions::homed_in_a;

/// Starts the regions' nodes again when dropped, so a failing test leaves them running.
struct RegionsUpOnDrop;

impl Drop for RegionsUpOnDrop {
    fn drop(&mut self) {
        let _ = likes_testkit::stack::up_regions(&likes_testkit::stack::script());
    }
}

/// The tests here take region-b down or set a process-wide fail point: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn a_move_to_a_region_that_is_down_refuses_and_resumes_when_it_is_back() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (a, _b, _topology, session) = homed_in_a("regions_down").await;
    let item = "item-of-a-region-down";
    let range = likes::region::range_of(item, 4);
    let _up = RegionsUpOnDrop;
    likes_testkit::stack::kill9(&likes_testkit::stack::dir(), "cassandra-region-b").unwrap();

    // The bump must commit in both datacenters: with region-b's node gone it cannot, and the
    // move says so; the range stays region-a's, at its epoch.
    let t = std::time::Instant::now();
    let err = common::regions::move_only(
        &a,
        likes::ops::region::Which::Ranges(vec![range]),
        "region-b",
    )
    .await
    .err()
    .expect("a move into a region that is down must not succeed");
    let msg = err.to_string();
    println!(
        "move with region-b down, refused after {:?}: {msg}",
        t.elapsed()
    );
    assert!(
        msg.contains("did not answer") && msg.contains("resumes"),
        "{msg}"
    );
    assert!(
        err.is_retryable(),
        "a region coming back is worth another run: {msg}"
    );
    let ranges = likes::store::ranges::Ranges::prepare(
        session.clone(),
        &a.cql.keyspace,
        a.cql.replication.class,
    )
    .await
    .unwrap();
    // Its serial read needs both datacenters, so it stopped before any bump: unchanged.
    let row = ranges.all().await.unwrap().remove(range as usize);
    assert_eq!(
        (row.home.as_str(), row.moving_from.as_deref(), row.epoch),
        ("region-a", None, 1),
        "{row:?}"
    );

    likes_testkit::stack::up_regions(&likes_testkit::stack::script()).unwrap();
    let t = std::time::Instant::now();
    let report = common::regions::move_only(
        &a,
        likes::ops::region::Which::Ranges(vec![range]),
        "region-b",
    )
    .await
    .expect("the same move, run again once region-b is back");
    println!(
        "the move run again with region-b back: {report} ({:?})",
        t.elapsed()
    );
    assert!(
        report.moved == vec![range] || report.already == vec![range],
        "{report}"
    );
    let row = ranges.one(range).await.unwrap().unwrap();
    assert_eq!(
        (row.home.as_str(), row.moving_from, row.epoch),
        ("region-b", None, 2),
        "one bump, once"
    );
    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {}", a.cql.keyspace), ())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn a_move_killed_between_its_bump_and_its_settle_resumes_at_the_fence() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (a, _b, _topology, session) = homed_in_a("regions_resume").await;
    // Range 0 is bumped; the move dies right after bumping range 1, as a kill there would.
    fail::cfg("region-move-after-bump", "1*off->1*return").unwrap();
    let from_a = || likes::ops::region::Which::From("region-a".into());
    let stopped = common::regions::move_only(&a, from_a(), "region-b").await;
    fail::remove("region-move-after-bump");
    let err = stopped.err().expect("the fail point stops the move");
    println!("stopped: {err}");
    let status = likes::ops::region::status(&a).await.unwrap();
    let moving: Vec<_> = status
        .rows
        .iter()
        .filter(|r| r.moving_from.is_some())
        .map(|r| r.range)
        .collect();
    let at_b: Vec<_> = status
        .rows
        .iter()
        .filter(|r| r.home == "region-b")
        .map(|r| r.range)
        .collect();
    // Range 0 was fenced and settled before the move returned its error; range 1 is left
    // between its bump and its settle, as a kill leaves it.
    assert_eq!((moving, at_b), (vec![1], vec![0, 1]), "{status}");
    assert!(
        status.to_string().contains("range 1: region-a -> region-b"),
        "{status}"
    );

    // The same command run again resumes range 1 (the whole fence again, then the settle)
    // and moves the rest.
    let t = std::time::Instant::now();
    let report = common::regions::move_only(&a, from_a(), "region-b")
        .await
        .expect("the move run again");
    println!("resumed: {report}");
    assert!(
        t.elapsed() >= likes::ops::region::fence(&a),
        "a resumed range waits the whole fence again"
    );
    assert_eq!(report.moved, vec![1, 2, 3], "{report}");
    let after = likes::ops::region::status(&a).await.unwrap();
    assert!(
        after
            .rows
            .iter()
            .all(|r| r.home == "region-b" && r.moving_from.is_none()),
        "{after}"
    );
    assert!(
        after.rows.iter().all(|r| r.epoch == 2),
        "one bump per range, resumed or not: {after}"
    );
    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {}", a.cql.keyspace), ())
        .await;
}
