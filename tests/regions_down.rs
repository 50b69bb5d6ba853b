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
        let _ = likes_support::stack::up_regions(&likes_support::stack::script());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn a_move_to_a_region_that_is_down_refuses_and_resumes_when_it_is_back() {
    let (a, _b, _topology, session) = homed_in_a("regions_down").await;
    let item = "item-of-a-region-down";
    let range = likes::region::range_of(item, 4);
    let _up = RegionsUpOnDrop;
    likes_support::stack::kill9(&likes_support::stack::dir(), "cassandra-region-b").unwrap();

    // The bump must commit in both datacenters: with region-b's node gone it cannot, and the
    // move says so; the range stays region-a's, at its epoch.
    let t = std::time::Instant::now();
    let err = likes::ops::region::r#move(
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
    let mut local = ranges.all().await.unwrap();
    let row = local.remove(range as usize);
    // The bump may have reached region-a's replica alone (a proposal not yet chosen): either
    // way no region writes the range as its home but region-a, until the move finishes.
    assert!(
        row.home == "region-a" || row.moving_from.as_deref() == Some("region-a"),
        "{row:?}"
    );

    likes_support::stack::up_regions(&likes_support::stack::script()).unwrap();
    let t = std::time::Instant::now();
    let report = likes::ops::region::r#move(
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
