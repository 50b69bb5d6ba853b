//! Crashes at the moments a signal cannot hit reliably, through fail points (build with
//! `--features failpoints`; `make test` does): after stage 1's Kafka commit and before its
//! state write, after its transaction is built and before the commit, and after stage 2's
//! counter writes and before its offset commit. Each time the stage dies, restarts and the
//! counts still equal the ground truth, with no (item, window) applied twice.
#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use common::procs::{self, Stage};
use common::topology as fx;
use likes::topology::Topology;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_the_narrow_moments_never_change_the_counts() {
    let settings = fx::settings("failpoints");
    let topology = Topology::load(None).unwrap();
    fx::setup(&settings, &topology).await;
    let dir = settings.dedupe.state_dir.with_extension("run");
    std::fs::create_dir_all(&dir).unwrap();
    let audit = dir.join("audit.tsv");
    let env = procs::stage_env(&settings, &audit);
    let mut dedupe = Stage::new("dedupe", env.clone(), &dir);
    let mut count = Stage::new("count", env, &dir);

    let script = fx::script(5, 20, 40, 5);
    let want = fx::nonzero(&script.truth);
    let points = [
        ("dedupe", "dedupe-after-commit"),
        ("dedupe", "dedupe-before-commit"),
        ("count", "count-after-sink-before-commit"),
    ];
    let chunks: Vec<_> = script
        .records
        .chunks(script.records.len() / points.len() + 1)
        .collect();
    // dedupe is the first target and starts inside the loop, armed.
    count.start();
    for (chunk, (stage, point)) in chunks.iter().zip(points) {
        let target = if stage == "dedupe" {
            &mut dedupe
        } else {
            &mut count
        };
        if target.starts > 0 {
            target.stop();
        }
        target.start_with(&[("FAILPOINTS", &format!("{point}=panic"))]);
        fx::produce(&settings, &topology, chunk).await;
        assert!(
            target.wait_exit(Duration::from_secs(60)),
            "{point} never fired; log:\n{}",
            target.tail()
        );
        target.start();
    }

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let have = loop {
        dedupe.assert_alive();
        count.assert_alive();
        let have = fx::nonzero(&fx::counts(&settings).await);
        if have == want || tokio::time::Instant::now() > deadline {
            break have;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    dedupe.stop();
    count.stop();
    assert_eq!(
        have, want,
        "counts must equal the ground truth after every fail point"
    );
    let a = procs::read_audit(&audit);
    assert_eq!(
        a.applied_pairs, a.distinct_pairs,
        "an (item, window) was applied twice"
    );
    assert_eq!(fx::nonzero(&a.sums), want);
    assert!(
        std::fs::read_to_string(dir.join("dedupe.log"))
            .unwrap()
            .contains("restored from the changelog"),
        "the crash after the commit must have been recovered from the changelog"
    );
}
