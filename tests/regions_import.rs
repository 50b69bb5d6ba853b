//! `likes import` with home regions (docs/adoption.md, "Home regions"), on the real
//! two-datacenter Cassandra of `make up-regions`: each region loads the rows of the items it
//! is home to and rejects the others naming their home, so one file imported in both regions
//! loads every edge once; the write path of each home then sees the imported edges; and an
//! import that meets a range moving in stops with its reason and, run again once the move
//! has settled, resumes and loads it. Ignored by `make test`; `make test-regions` runs it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::regions::{homed_in_a, move_only};
use likes::import::{Args, ImportReport};
use likes::ops::region::Which;
use likes::region::range_of;

const RANGES: usize = 4;
/// Liked edges 100 days old: past any dedupe horizon.
const AGE_MS: i64 = 100 * 86_400_000;

/// A CSV of one liked row per (item, user), and each row's item.
fn write_file(path: &Path, items: &[String], users: &[String], now: i64) -> Vec<String> {
    let mut csv = String::from("item_id,user_id,liked,liked_at\n");
    let mut rows = Vec::new();
    for item in items {
        for user in users {
            csv.push_str(&format!("{item},{user},1,{}\n", now - AGE_MS));
            rows.push(item.clone());
        }
    }
    std::fs::write(path, csv).expect("write the file");
    rows
}

fn args(file: &Path, state: &Path) -> Args {
    Args {
        paths: vec![file.to_path_buf()],
        format: None,
        mapping: Default::default(),
        state_dir: Some(state.to_path_buf()),
        window: 1024,
        concurrency: 8,
        dry_run: false,
    }
}

/// The reject file's reasons, by row number.
fn rejects(report: &ImportReport) -> BTreeMap<u64, String> {
    let text = std::fs::read_to_string(report.state_dir.join("rejects.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a reject line is JSON");
            (
                v["row"].as_u64().expect("row"),
                v["reason"].as_str().expect("reason").to_string(),
            )
        })
        .collect()
}

fn items_written(report: &ImportReport) -> BTreeSet<String> {
    std::fs::read_to_string(report.state_dir.join("items.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the two-datacenter cluster: make test-regions"]
async fn each_region_imports_the_items_it_is_home_to_and_a_moving_range_stops_the_import() {
    let (a, b, topology, session) = homed_in_a("regions_import").await;
    // Ranges 2 and 3 go to region-b before anything is imported.
    let moved = move_only(&a, Which::Ranges(vec![2, 3]), "region-b")
        .await
        .expect("move ranges 2 and 3");
    assert_eq!(moved.moved, vec![2, 3]);
    let home = |item: &str| {
        if range_of(item, RANGES) >= 2 {
            "region-b"
        } else {
            "region-a"
        }
    };

    let scratch = std::env::temp_dir().join(likes_testkit::names::unique("regions-import"));
    std::fs::create_dir_all(&scratch).unwrap();
    let now = likes::runtime::clock::now_ms();
    let items: Vec<String> = (0..24).map(|i| format!("ri-{i}")).collect();
    let users: Vec<String> = (0..5).map(|u| format!("ru-{u}")).collect();
    let file = scratch.as_path().join("likes.csv");
    let rows = write_file(&file, &items, &users, now);
    for (letter, s) in [("a", &a), ("b", &b)] {
        assert!(
            items
                .iter()
                .any(|i| home(i) == s.region.name.as_deref().unwrap()),
            "the file has items of region-{letter}"
        );
    }

    // The same file in each region: each loads its own items' rows and rejects the others'.
    for (s, other) in [(&a, "region-b"), (&b, "region-a")] {
        let me = s.region.name.clone().unwrap();
        let report = likes::import::run(s, &topology, &args(&file, &scratch.as_path().join(&me)))
            .await
            .unwrap_or_else(|e| panic!("import at {me}: {e}"));
        println!("import at {me}:\n{report}");
        let mine: Vec<u64> = (1..=rows.len() as u64)
            .filter(|r| home(&rows[*r as usize - 1]) == me)
            .collect();
        assert_eq!(
            report.tally.loaded,
            mine.len() as u64,
            "{me} loads its rows"
        );
        assert_eq!(
            report.tally.rejected,
            (rows.len() - mine.len()) as u64,
            "{me} rejects the others"
        );
        let rejected = rejects(&report);
        for (row, reason) in &rejected {
            let item = &rows[*row as usize - 1];
            assert_eq!(home(item), other, "row {row} ({item}) rejected at {me}");
            assert!(
                reason.contains(&format!("homed in region {other}")),
                "row {row}: {reason}"
            );
        }
        assert_eq!(rejected.len() as u64, report.tally.rejected);
        let want: BTreeSet<String> = items.iter().filter(|i| home(i) == me).cloned().collect();
        assert_eq!(items_written(&report), want, "{me}'s items list");
    }

    // Each home's write path finds the imported edges: a like of one is no change, an unlike
    // is one; the other region refuses both and names the home.
    let listen = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let api_a = common::regions::serve(listen().await, &a, &topology, None).await;
    let api_b = common::regions::serve(listen().await, &b, &topology, None).await;
    for (n, item) in items.iter().enumerate() {
        let (api, elsewhere) = if home(item) == "region-a" {
            (&api_a, &api_b)
        } else {
            (&api_b, &api_a)
        };
        let (st, body) = api.like("ru-0", item, &format!("k-like-{n}")).await;
        assert_eq!(st, 200, "{item}: {body}");
        assert_eq!(body["changed"], false, "{item} was imported liked: {body}");
        let (st, body) = api.unlike("ru-1", item, &format!("k-unlike-{n}")).await;
        assert_eq!(st, 200, "{item}: {body}");
        assert_eq!(body["changed"], true, "{item}: {body}");
        let (st, body) = elsewhere.like("ru-2", item, &format!("k-else-{n}")).await;
        assert_eq!(
            (st.as_u16(), body["error"].as_str()),
            (503, Some("not_home")),
            "{item}: {body}"
        );
    }

    // Range 1 moves to region-b. An import at region-b while the range is moving in stops
    // with its reason; run again once the move has settled, it resumes and loads the rows.
    let moving: Vec<String> = items
        .iter()
        .filter(|i| range_of(i, RANGES) == 1)
        .cloned()
        .collect();
    assert!(!moving.is_empty(), "the file has items of range 1");
    let late = scratch.as_path().join("late.csv");
    let late_users: Vec<String> = (0..3).map(|u| format!("rv-{u}")).collect();
    let late_rows = write_file(&late, &moving, &late_users, now);
    // A mover with a longer fence than the writers' (only waits longer): time to try.
    let mut mover_settings = a.clone();
    mover_settings.api.write_deadline = Duration::from_secs(12);
    let mover = tokio::spawn(async move {
        move_only(&mover_settings, Which::Ranges(vec![1]), "region-b").await
    });
    let view = likes::region::Routes::for_process(&session, &b)
        .await
        .expect("routes")
        .expect("region-b has routes");
    let t = std::time::Instant::now();
    while !matches!(view.route(&moving[0]), likes::region::Route::Closed(_)) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "range 1 never showed moving at region-b"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let state = scratch.as_path().join("late-b");
    let err = likes::import::run(&b, &topology, &args(&late, &state))
        .await
        .expect_err("an import into a range that is moving in stops");
    let msg = err.to_string();
    println!("import at region-b during the move: {msg}");
    assert!(
        msg.contains("moving here from region-a") && msg.contains("once the move has settled"),
        "{msg}"
    );
    assert!(!mover.is_finished(), "the move was still under way");
    mover.await.unwrap().expect("the move of range 1");
    let report = likes::import::run(&b, &topology, &args(&late, &state))
        .await
        .expect("the import again after the move");
    println!("import at region-b after the move:\n{report}");
    assert_eq!(report.tally.loaded, late_rows.len() as u64, "{report}");
    assert_eq!(report.tally.rejected, 0, "{report}");
    for (n, item) in moving.iter().enumerate() {
        let (st, body) = api_b.like("rv-0", item, &format!("k-late-{n}")).await;
        assert_eq!(
            (st.as_u16(), &body["changed"]),
            (200, &serde_json::json!(false)),
            "{item} was imported liked at its new home: {body}"
        );
    }

    let _ = session
        .query_unpaged(format!("DROP KEYSPACE {}", a.cql.keyspace), ())
        .await;
    let _ = std::fs::remove_dir_all(&scratch);
}
