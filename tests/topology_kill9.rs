//! kill -9 of `likes dedupe` and of `likes count` at random moments while a stream flows;
//! restart; drain. Every item's count equals the ground truth, and no (item, window) was
//! ever applied twice (from the count stage's audit trail).

mod common;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::procs;
use common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_never_change_the_counts() {
    let procs::Harness {
        settings,
        topology,
        dir: _,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("kill9").await;
    dedupe.start();
    count.start();

    let script = fx::script(11, 40, 60, 6);
    let want = fx::nonzero(&script.truth);
    let mut rng = StdRng::seed_from_u64(99);
    let chunks: Vec<_> = script
        .records
        .chunks(script.records.len() / 10 + 1)
        .collect();
    let mut kills = (0, 0);
    for chunk in &chunks {
        fx::produce(&settings, &topology, chunk).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..2500))).await;
        dedupe.assert_alive();
        count.assert_alive();
        let stage = if rng.random_bool(0.5) {
            &mut dedupe
        } else {
            &mut count
        };
        stage.kill9();
        if stage.name == "dedupe" {
            kills.0 += 1
        } else {
            kills.1 += 1
        }
        if rng.random_bool(0.5) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
        }
        stage.start();
    }

    let have = procs::drain(&mut dedupe, &mut count, &settings, &want).await;
    eprintln!(
        "kills: dedupe {}, count {}; {} records",
        kills.0,
        kills.1,
        script.records.len()
    );
    assert!(
        kills.0 > 0 && kills.1 > 0,
        "both stages must have been killed"
    );
    assert_eq!(
        have, want,
        "counts must equal the ground truth after kill -9s"
    );

    let a = procs::assert_audit(&audit, &want);
    eprintln!("applied (item, window) pairs: {}", a.applied_pairs);
    fx::teardown(&settings, &topology).await;
}

/// A stage 1 killed with kill -9 starts again on its own local state: every partition's mark
/// still names the committed transaction (the RocksDB WAL outlives the process), so nothing is
/// rebuilt from the changelog, and the kept state is the right one: the same events again
/// count nothing, new ones count once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_stage_1_starts_again_on_its_local_state() {
    let procs::Harness {
        settings,
        topology,
        dir,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("keepstate").await;
    dedupe.start();
    count.start();
    let base_ms = likes::runtime::clock::now_ms() - 60_000;
    let first = fx::script_of(21, 30, 40, 4, ("item", "a"), base_ms);
    fx::produce(&settings, &topology, &first.records).await;
    let have = procs::settle(
        &mut dedupe,
        &mut count,
        &settings,
        &fx::nonzero(&first.truth),
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(have, fx::nonzero(&first.truth), "the first script's counts");

    dedupe.kill9();
    dedupe.start();
    let second = fx::script_of(22, 30, 40, 4, ("item", "b"), base_ms);
    fx::produce(&settings, &topology, &first.records).await;
    fx::produce(&settings, &topology, &second.records).await;
    let mut want = first.truth.clone();
    for (item, n) in &second.truth {
        *want.entry(item.clone()).or_default() += n;
    }
    let want = fx::nonzero(&want);
    let have = procs::drain(&mut dedupe, &mut count, &settings, &want).await;
    assert_eq!(
        have, want,
        "the first script again counts nothing, the second once"
    );

    let log = std::fs::read_to_string(dir.join("dedupe.log")).unwrap();
    let second_start = log.rfind("dedupe started").expect("a second start");
    let after: Vec<&str> = log[second_start..]
        .lines()
        .filter(|l| l.contains("partition ready"))
        .collect();
    let restored: Vec<&&str> = after.iter().filter(|l| l.contains("Restored")).collect();
    assert!(
        !after.is_empty() && restored.is_empty(),
        "after kill -9, every partition keeps its local state; restored from the changelog:\n{}",
        restored
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    fx::teardown(&settings, &topology).await;
}
