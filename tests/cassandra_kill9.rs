//! The local Cassandra keeps every acknowledged write through a kill -9: likes answered 200
//! by the API are all in `edges` after Cassandra is killed and started again. (With the
//! former `commitlog_sync: periodic` of 10 s, the last seconds of acknowledged writes were
//! gone after a kill -9, LWTs included.) Kills the shared local Cassandra, so it runs as a
//! test binary of its own; it starts Cassandra again with `stack/stack.sh up`.

mod common;

use std::time::Duration;

use reqwest::StatusCode;

use common::api;
use common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_likes_survive_a_kill_9_of_cassandra() {
    let (settings, topology, _app, client) = api::serve("cassandrakill").await;
    let mut acked = Vec::new();
    let started = std::time::Instant::now();
    for i in 0..60 {
        let user = format!("user-{i}");
        let (s, a) = client.like(&user, "item-k", &format!("k-{i}")).await;
        assert_eq!(s, StatusCode::OK, "{a}");
        acked.push(user);
    }

    // The cost of a synced commit log, read off a run's output (a figure, not a test).
    eprintln!(
        "60 sequential likes through the API: {:?} ({:?} each)",
        started.elapsed(),
        started.elapsed() / 60
    );
    let _restore = common::stack::UpOnDrop;
    common::stack::kill9("cassandra");
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::stack::up();

    // A new session: every acknowledged like is there.
    let session = likes::cql::connect(&settings.cql).await.unwrap();
    let rows = session
        .query_unpaged(
            format!(
                "SELECT user_id, state, op_id FROM {}.edges WHERE item_id = 'item-k' ALLOW FILTERING",
                settings.cql.keyspace
            ),
            (),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let mut found: Vec<String> = rows
        .rows::<(String, Option<i8>, Option<i64>)>()
        .unwrap()
        .map(Result::unwrap)
        .filter(|(_, state, op)| {
            *state == Some(likes::schema::v1::EdgeState::Liked as i8) && *op == Some(1)
        })
        .map(|(u, _, _)| u)
        .collect();
    found.sort();
    acked.sort();
    assert_eq!(
        found.len(),
        acked.len(),
        "acknowledged likes lost by a kill -9 of Cassandra"
    );
    assert_eq!(found, acked);
    fx::teardown(&settings, &topology).await;
}
