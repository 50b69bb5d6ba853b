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
