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

use std::sync::Arc;

use likes::config::{ReplicationClass, Settings};
use scylla::client::session::Session;
use scylla::statement::unprepared::Statement;
use scylla::statement::Consistency;
use scylla::value::CqlValue;

const ROWS: i32 = 300;

fn region(base: &Settings, dc: &str, address: &str) -> Settings {
    let mut s = base.clone();
    s.cql.nodes = vec![format!("{address}:9042")];
    s.cql.local_datacenter = Some(dc.to_string());
    s
}

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
