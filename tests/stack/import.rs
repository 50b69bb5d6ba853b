//! `likes import`, `likes reconcile --items-from` and `likes compare` against the real stack
//! (issue 27): a generated file with duplicates, bad rows, an erased user's rows, edges older
//! than the dedupe horizon and inside it, liked and unliked rows, imported while the API takes
//! live likes on some of the same edges; the import killed with -9 halfway and resumed; then
//! the counts equal the LIKED edges, the edges equal what the file and the live requests say,
//! `likes compare` against the generator's counts finds nothing, every imported edge's first
//! live flip counts exactly, and a re-run imports nothing.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::Duration;

use crate::common::api::{self, ADMIN};
use crate::common::topology as fx;
use crate::ops_jobs::{env, quick, relay, truth};
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;

const DAY: i64 = 86_400_000;
const ITEMS: usize = 12;
const USERS: usize = 300;
/// Items the live requests work on while the import runs.
const LIVE_ITEMS: usize = 4;

/// The generated file and what it should come to.
struct File {
    csv: String,
    /// (item, user) → liked, by each edge's latest row.
    edges: BTreeMap<(String, String), bool>,
    /// Each edge's latest row's time.
    latest_ms: HashMap<(String, String), i64>,
    bad_rows: usize,
    erased_rows: usize,
    rows: usize,
}

fn generate(seed: u64, now: i64) -> File {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut csv = String::from("item_id,user_id,liked,liked_at\n");
    let mut edges = BTreeMap::new();
    let mut latest_ms: HashMap<(String, String), i64> = HashMap::new();
    let (mut bad_rows, mut erased_rows, mut rows) = (0, 0, 0);
    for u in 0..USERS {
        let user = format!("fu-{u}");
        for i in 0..ITEMS {
            if !rng.random_bool(0.7) {
                continue;
            }
            let item = format!("imp-{i}");
            // Past the 7-day horizon, or inside it (the trap: an imported like stamped inside
            // it would make the edge's first live unlike count 0).
            let base = if rng.random_bool(0.5) {
                now - rng.random_range(30..400) * DAY
            } else {
                now - rng.random_range(1..(5 * DAY))
            };
            // One row, or a few of the same edge (duplicates, and history: the latest wins),
            // distinct times, in no particular order.
            let n = if rng.random_bool(0.2) {
                rng.random_range(2..4)
            } else {
                1
            };
            let mut times: Vec<i64> = (0..n).map(|k| base + k * 1000).collect();
            times.sort_by_key(|_| rng.random::<u32>());
            for t in times {
                let liked = rng.random_bool(0.75);
                csv.push_str(&format!(
                    "{item},{user},{},{t}\n",
                    if liked { "true" } else { "0" }
                ));
                rows += 1;
                let key = (item.clone(), user.clone());
                if latest_ms.get(&key).is_none_or(|&l| t > l) {
                    latest_ms.insert(key.clone(), t);
                    edges.insert(key, liked);
                }
            }
            if rng.random_bool(0.03) {
                // An exact duplicate line.
                let t = latest_ms[&(item.clone(), user.clone())];
                let liked = edges[&(item.clone(), user.clone())];
                csv.push_str(&format!("{item},{user},{liked},{t}\n"));
                rows += 1;
            }
        }
        if u % 25 == 0 {
            for bad in [
                format!("imp-1,,true,{now}"),
                format!("imp-1,{user},maybe,{now}"),
                format!("imp 1,{user},true,{now}"),
                format!("imp-1,{user},true,yesterday"),
                format!("imp-1,{user},true,{}", now * 1000),
                format!("imp-1,{user}"),
            ] {
                csv.push_str(&bad);
                csv.push('\n');
                bad_rows += 1;
                rows += 1;
            }
        }
    }
    for i in 0..ITEMS {
        csv.push_str(&format!("imp-{i},gone,true,{}\n", now - 40 * DAY));
        erased_rows += 1;
        rows += 1;
    }
    File {
        csv,
        edges,
        latest_ms,
        bad_rows,
        erased_rows,
        rows,
    }
}

fn counts_of(edges: &BTreeMap<(String, String), bool>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for ((item, _), &liked) in edges {
        if liked {
            *out.entry(item.clone()).or_default() += 1;
        }
    }
    out
}

/// `likes import FILE --state-dir STATE`, to its end: (success, stdout, stderr).
fn import(
    file: &std::path::Path,
    state: &std::path::Path,
    e: &[(&'static str, String)],
) -> (bool, String, String) {
    crate::common::likes(
        &[
            "import",
            file.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        e,
    )
}

/// `likes reconcile --items-from STATE/items.txt`: the imported items' counts at a cut.
fn reconcile_imported(state: &std::path::Path, e: &[(&'static str, String)]) {
    let items = state.join("items.txt");
    let (ok, out, err) = crate::common::likes(
        &[
            "reconcile",
            "--items-from",
            items.to_str().unwrap(),
            "--reason",
            "import",
        ],
        e,
    );
    assert!(ok, "{out}\n{err}");
}

fn checkpoint(dir: &std::path::Path) -> Option<serde_json::Value> {
    let b = std::fs::read(dir.join("checkpoint.json")).ok()?;
    serde_json::from_slice(&b).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn import_killed_and_resumed_under_live_likes_counts_exactly_and_compares_clean() {
    let (settings, topology, app, client) = api::serve_with("import", quick).await;
    let mut run = fx::start(&settings, &topology);
    let _relay = relay(&settings, &topology).await;
    let now = likes::runtime::clock::now_ms();

    // An account deleted before the import: its rows are refused, never resurrected.
    let r = client
        .http
        .post(format!("{}/v1/admin/erasures", client.base))
        .header("X-Admin-Token", ADMIN)
        .json(&serde_json::json!({ "userId": "gone" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);

    let gen = generate(27, now);
    let dir = std::env::temp_dir().join(likes_testkit::names::unique("import"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("likes.csv");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(gen.csv.as_bytes())
        .unwrap();
    let state = dir.join("state");
    let e = env(&settings, &[]);

    // Live requests on the first items while the import runs: file users' edges (which the
    // import must then leave alone) and new users'. The last request per edge is its intent.
    let live = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let mut intent: BTreeMap<(String, String), bool> = BTreeMap::new();
            for n in 0..150 {
                let item = format!("imp-{}", rng.random_range(0..LIVE_ITEMS));
                let user = if rng.random_bool(0.5) {
                    format!("fu-{}", rng.random_range(0..40))
                } else {
                    format!("live-{}", rng.random_range(0..20))
                };
                let like = rng.random_bool(0.6);
                let key = format!("live-{n}");
                let (s, b) = client.until_answered(like, &user, &item, &key).await;
                assert_eq!(s, StatusCode::OK, "{b}");
                intent.insert((item, user), like);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            intent
        })
    };

    // The import, slowed to a few statements at a time, killed with -9 once it has
    // checkpointed part of the file: a fail point holds it right after that checkpoint, so
    // the kill lands halfway on a fast box too.
    let mut job = std::process::Command::new(env!("CARGO_BIN_EXE_likes"))
        .args(["import", path.to_str().unwrap(), "--state-dir"])
        .arg(&state)
        .args(["--window", "512", "--concurrency", "2"])
        .envs(e.iter().map(|(k, v)| (*k, v.as_str())))
        .env("FAILPOINTS", "import-after-checkpoint=sleep(600000)")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let halfway = loop {
        if let Some(c) = checkpoint(&state) {
            if c["rows_done"].as_u64().unwrap() > 0 {
                break c;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the import never checkpointed"
        );
        assert!(
            job.try_wait().unwrap().is_none(),
            "the import ended before the kill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    job.kill().unwrap(); // SIGKILL
    job.wait().unwrap();
    let done_at_kill = checkpoint(&state).unwrap();
    assert_eq!(done_at_kill["finished"], false, "killed halfway: {halfway}");
    assert!(done_at_kill["rows_done"].as_u64().unwrap() < gen.rows as u64);

    // Resumed: it starts after the checkpoint and finishes the file.
    let (ok, out, err) = import(&path, &state, &e);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("resumed after row"), "{out}");
    let intent = live.await.unwrap();
    let ck = checkpoint(&state).unwrap();
    assert_eq!(ck["finished"], true);
    assert_eq!(ck["rows_done"].as_u64().unwrap(), gen.rows as u64, "{ck}");
    // Each rejected row once, with its reason, across the kill.
    let rejects = std::fs::read_to_string(state.join("rejects.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = rejects
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), gen.bad_rows + gen.erased_rows, "{rejects}");
    assert_eq!(
        ck["tally"]["rejected"].as_u64().unwrap(),
        lines.len() as u64
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["reason"].as_str().unwrap().contains("erased"))
            .count(),
        gen.erased_rows
    );
    assert!(lines
        .iter()
        .all(|l| !l["reason"].as_str().unwrap().is_empty() && l["row"].as_u64().unwrap() > 0));
    // An erased account's rows leave no trace of the account (issue 44): no user id, no row.
    assert!(
        !rejects.contains("gone"),
        "the erased user's id is in rejects.jsonl: {rejects}"
    );

    // The edges are what the file says, but where a live request came since.
    let mut want_edges = gen.edges.clone();
    want_edges.extend(intent.clone());
    let want = fx::nonzero(&counts_of(&want_edges));
    assert_eq!(
        truth(&app).await,
        want,
        "the edges are the file's and the live requests'"
    );
    // In the write path's shape: a like is op 1, stamped past the horizon however recent;
    // an unlike is op 0 with no time.
    let mut seen = (false, false);
    for ((item, user), &liked) in &gen.edges {
        let recent = gen.latest_ms[&(item.clone(), user.clone())] > now - DAY * 5;
        if intent.contains_key(&(item.clone(), user.clone())) || (liked && !recent) {
            continue;
        }
        let bucket = likes::hash::bucket_of(user, topology.buckets) as i32;
        let edge = app
            .store
            .edges
            .read(item, bucket, user)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (edge.liked, edge.op_id),
            (liked, i64::from(liked)),
            "{item} {user}"
        );
        if liked {
            assert!(
                edge.updated_at_ms < now - 14 * DAY,
                "{item} {user}: {edge:?}"
            );
            seen.0 = true;
        } else {
            assert_eq!(edge.updated_at_ms, 0, "{item} {user}: {edge:?}");
            seen.1 = true;
        }
    }
    assert_eq!(seen, (true, true));

    // Counts through the pipeline: a correction per item at a cut.
    reconcile_imported(&state, &e);
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(90)).await;
    assert_eq!(have, want, "the counts equal the LIKED edges");

    // The old counter's counts (the generator's, with the live requests) compare clean.
    let old = dir.join("old-counts.csv");
    let mut text = String::from("item,count\n");
    for i in 0..ITEMS {
        let item = format!("imp-{i}");
        text.push_str(&format!(
            "{item},{}\n",
            want.get(&item).copied().unwrap_or(0)
        ));
    }
    std::fs::write(&old, &text).unwrap();
    let metrics = dir.join("compare.prom");
    let (ok, out, err) = crate::common::likes(
        &[
            "compare",
            "--old",
            old.to_str().unwrap(),
            "--fail-on-diff",
            "--metrics-file",
            metrics.to_str().unwrap(),
        ],
        &e,
    );
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains(&format!("{ITEMS} items compared")) && out.contains(": 0 differ"),
        "{out}"
    );
    assert!(std::fs::read_to_string(&metrics)
        .unwrap()
        .contains("likes_compare_differing_items 0"));
    // And a wrong old count is found, by item and by how much.
    let bad = format!(
        "item,count\nimp-5,{}\n",
        want.get("imp-5").copied().unwrap_or(0) + 3
    );
    std::fs::write(&old, bad).unwrap();
    let (ok, out, _) = crate::common::likes(
        &["compare", "--old", old.to_str().unwrap(), "--fail-on-diff"],
        &e,
    );
    assert!(
        !ok && out.contains("imp-5") && out.contains("1 differ") && out.contains("largest 3"),
        "{out}"
    );

    // Each imported edge's first live flip counts exactly: unlikes of imported likes stamped
    // past the horizon and inside it, likes of imported unlikes.
    let (mut past, mut inside, mut unliked) = (0, 0, 0);
    let mut n = 0;
    for ((item, user), &liked) in &gen.edges {
        if intent.contains_key(&(item.clone(), user.clone())) {
            continue;
        }
        let recent = gen.latest_ms[&(item.clone(), user.clone())] > now - 7 * DAY;
        let (go, like) = match (liked, recent) {
            (true, false) if past < 8 => (true, false),
            (true, true) if inside < 8 => (true, false),
            (false, _) if unliked < 8 => (true, true),
            _ => (false, false),
        };
        if !go {
            continue;
        }
        match (liked, recent) {
            (true, false) => past += 1,
            (true, true) => inside += 1,
            _ => unliked += 1,
        }
        n += 1;
        let key = format!("after-{n}");
        let (s, b) = if like {
            client.like(user, item, &key).await
        } else {
            client.unlike(user, item, &key).await
        };
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["changed"], true, "{item} {user}: {b}");
    }
    assert_eq!((past, inside, unliked), (8, 8, 8));
    let want_after = truth(&app).await;
    assert_ne!(want_after, want);
    let have = fx::wait_for_counts(&mut run, &settings, &want_after, Duration::from_secs(90)).await;
    assert_eq!(
        have, want_after,
        "first live flips of imported edges count exactly"
    );

    // A re-run imports nothing: from scratch (another state directory), every row is found
    // in, or refused again; with the same directory, the import says it is done.
    let again = dir.join("again");
    let (ok, out, err) = import(&path, &again, &e);
    assert!(ok, "{out}\n{err}");
    let ck = checkpoint(&again).unwrap();
    assert_eq!(
        (
            ck["tally"]["loaded"].as_u64(),
            ck["tally"]["updated"].as_u64()
        ),
        (Some(0), Some(0)),
        "{out}"
    );
    let (ok, out, err) = import(&path, &state, &e);
    assert!(ok && out.contains("finished before"), "{out}\n{err}");
    let have = fx::counts(&settings).await;
    assert_eq!(
        fx::nonzero(&have),
        want_after,
        "the re-runs changed no count"
    );
    run.check().await;
}

/// An export in parts, as warehouses and Spark write them: three CSV parts, the last gzipped
/// (one edge's rows spread over several), with the bookkeeping files export tools leave
/// beside them.
const PARTS: [&str; 3] = ["part-00000.csv", "part-00001.csv", "part-00002.csv.gz"];

fn write_parts(dir: &std::path::Path, gen: &File, seed: u64) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (header, body) = gen.csv.split_once('\n').unwrap();
    // The erased user's rows are the other test's; here every good row counts.
    let mut lines: Vec<&str> = body.lines().filter(|l| !l.contains(",gone,")).collect();
    rand::seq::SliceRandom::shuffle(lines.as_mut_slice(), &mut rng);
    std::fs::create_dir_all(dir.join("_temporary")).unwrap();
    let third = lines.len().div_ceil(3);
    for (i, part) in lines.chunks(third).enumerate() {
        let text = format!("{header}\n{}\n", part.join("\n"));
        let name = dir.join(PARTS[i]);
        if i == 2 {
            let mut gz = flate2::write::GzEncoder::new(
                std::fs::File::create(name).unwrap(),
                Default::default(),
            );
            gz.write_all(text.as_bytes()).unwrap();
            gz.finish().unwrap();
        } else {
            std::fs::write(name, text).unwrap();
        }
        std::fs::write(dir.join(format!(".part-{i:05}.csv.crc")), "not,a,row").unwrap();
    }
    std::fs::write(dir.join("_SUCCESS"), "").unwrap();
    // A half-written part a crashed export left: importing it would count a ghost's like.
    std::fs::write(
        dir.join("_temporary").join("part-00009.csv"),
        format!("{header}\nimp-0,ghost,true,1700000000000\n"),
    )
    .unwrap();
    lines.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn an_export_in_parts_imports_part_by_part_and_resumes_after_the_parts_done() {
    let (settings, topology, app, _client) = api::serve_with("import_parts", quick).await;
    let mut run = fx::start(&settings, &topology);
    let now = likes::runtime::clock::now_ms();
    let gen = generate(31, now);
    let dir = std::env::temp_dir().join(likes_testkit::names::unique("import-parts"));
    let export = dir.join("export");
    std::fs::create_dir_all(&export).unwrap();
    let rows = write_parts(&export, &gen, 5);
    let state = dir.join("state");
    let e = env(&settings, &[]);
    let parts = |i: usize| state.join("parts").join(format!("{i:05}-{}", PARTS[i]));

    // Stopped after the first part, at the fail point between parts.
    let mut failing = e.clone();
    failing.push(("FAILPOINTS", "import-after-part=1*return".to_string()));
    let (ok, out, err) = import(&export, &state, &failing);
    assert!(!ok && err.contains("import-after-part"), "{out}\n{err}");
    assert_eq!(checkpoint(&parts(0)).unwrap()["finished"], true);
    assert!(
        checkpoint(&parts(1)).is_none(),
        "the second part had not begun"
    );

    // The same command goes on with the second part and leaves the first as it is.
    let (ok, out, err) = import(&export, &state, &e);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("parts: 3 files (1 finished before this run"),
        "{out}"
    );
    let settled: u64 = (0..3)
        .map(|i| {
            checkpoint(&parts(i)).unwrap()["rows_done"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(settled, rows as u64, "every row of the three parts, once");
    assert_eq!(
        std::fs::read_dir(state.join("parts")).unwrap().count(),
        3,
        "three parts: not the _temporary one, not the .crc files"
    );

    // One reject file for the export, each line naming its part.
    let rejects = std::fs::read_to_string(state.join("rejects.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = rejects
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), gen.bad_rows, "{rejects}");
    assert!(
        lines
            .iter()
            .all(|l| l["file"].as_str().unwrap().contains("/export/part-0000")),
        "{rejects}"
    );

    // The edges are the file's, whichever part each row of an edge was in; the counts follow
    // through the pipeline from the joined items list.
    let want = fx::nonzero(&counts_of(&gen.edges));
    assert_eq!(
        truth(&app).await,
        want,
        "the edges are the parts' latest rows"
    );
    reconcile_imported(&state, &e);
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(90)).await;
    assert_eq!(have, want, "the counts equal the LIKED edges");

    // Done: the same command says so. A part added since is refused, not left out; a dry
    // run will not overwrite a real import's rejects.
    let (ok, out, err) = import(&export, &state, &e);
    assert!(
        ok && out.contains("parts: 3 files (3 finished before"),
        "{out}\n{err}"
    );
    std::fs::copy(export.join("part-00000.csv"), export.join("part-00003.csv")).unwrap();
    let (ok, out, err) = import(&export, &state, &e);
    assert!(
        !ok && err.contains("part-00003.csv") && err.contains("differ"),
        "{out}\n{err}"
    );
    std::fs::remove_file(export.join("part-00003.csv")).unwrap();
    let (ok, out, err) = crate::common::likes(
        &[
            "import",
            export.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--dry-run",
        ],
        &e,
    );
    assert!(
        !ok && err.contains("real import's checkpoint"),
        "{out}\n{err}"
    );
    assert_eq!(
        fx::nonzero(&fx::counts(&settings).await),
        want,
        "the refused runs changed no count"
    );
    run.check().await;
}

/// Issue 43, hole 1: an item-sorted file (each item's rows together, as a `GROUP BY item`
/// export writes them), killed after rows were settled but before the checkpoint that
/// counts them. Resumed, those rows come back as already imported; every item they held
/// must still reach items.txt, or `likes reconcile --items-from` never counts its likes.
/// Fail points make the moment exact on any box: a checkpoint after every chunk, and the
/// third held after its chunk was written and before it was saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn an_item_sorted_import_killed_between_checkpoints_lists_every_item() {
    const ITEMS: usize = 800;
    const PER_ITEM: usize = 5;
    let (settings, _topology, app, _client) = api::serve_with("import_sorted", quick).await;
    let mut run = fx::start(&settings, &_topology);
    let now = likes::runtime::clock::now_ms();
    let mut csv = String::from("item_id,user_id,liked,liked_at\n");
    let mut want = BTreeMap::new();
    for i in 0..ITEMS {
        let item = format!("sorted-{i:04}");
        for u in 0..PER_ITEM {
            csv.push_str(&format!("{item},su-{u},true,{}\n", now - 40 * DAY));
        }
        want.insert(item, PER_ITEM as i64);
    }
    let dir = std::env::temp_dir().join(likes_testkit::names::unique("import-sorted"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("likes.csv");
    std::fs::write(&path, &csv).unwrap();
    let state = dir.join("state");
    let e = env(&settings, &[]);

    let mut job = std::process::Command::new(env!("CARGO_BIN_EXE_likes"))
        .args(["import", path.to_str().unwrap(), "--state-dir"])
        .arg(&state)
        .args(["--window", "512", "--concurrency", "4"])
        .envs(e.iter().map(|(k, v)| (*k, v.as_str())))
        .env(
            "FAILPOINTS",
            "import-checkpoint-each-chunk=return;import-before-checkpoint=2*off->sleep(600000)",
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Held at the third save: two chunks checkpointed, the third written and not yet counted.
    let items_file = state.join("items.txt");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let saved = checkpoint(&state).map_or(0, |c| c["rows_done"].as_u64().unwrap());
        let listed = std::fs::read_to_string(&items_file).map_or(0, |s| s.len() as u64);
        let counted = checkpoint(&state).map_or(0, |c| c["items_len"].as_u64().unwrap());
        if saved == 2 * likes::import::CHUNK as u64 && listed > counted {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never held at the third save"
        );
        assert!(
            job.try_wait().unwrap().is_none(),
            "the import ended before the kill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    job.kill().unwrap(); // SIGKILL
    job.wait().unwrap();

    let (ok, out, err) = import(&path, &state, &e);
    assert!(ok && out.contains("resumed after row"), "{out}\n{err}");
    let listed: std::collections::BTreeSet<String> = std::fs::read_to_string(&items_file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let missing: Vec<&String> = want.keys().filter(|i| !listed.contains(*i)).collect();
    assert!(
        missing.is_empty(),
        "items.txt lacks {} of {ITEMS} items, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );

    // The documented next step then counts every imported like.
    reconcile_imported(&state, &e);
    assert_eq!(fx::nonzero(&truth(&app).await), want);
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(90)).await;
    assert_eq!(have, want, "the counts equal the imported likes");
    run.check().await;
}
