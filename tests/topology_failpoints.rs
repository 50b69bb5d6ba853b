//! Crashes at the moments a signal cannot hit reliably, through fail points (build with
//! `--features failpoints`; `make test` does): after stage 1's Kafka commit and before its
//! state write, after its transaction is built and before the commit, and after stage 2's
//! counter writes and before its offset commit. Each time the stage dies, restarts and the
//! counts still equal the ground truth, with no (item, window) applied twice.
#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use common::procs;
use common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_the_narrow_moments_never_change_the_counts() {
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("failpoints").await;

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

    let have = procs::drain(&mut dedupe, &mut count, &settings, &want).await;
    assert_eq!(
        have, want,
        "counts must equal the ground truth after every fail point"
    );
    procs::assert_audit(&audit, &want);
    // Every first start restores (0 records); the crash after the commit must have restored
    // real records, from the changelog the crashed transaction wrote.
    let log = std::fs::read_to_string(dir.join("dedupe.log")).unwrap();
    let restored: u64 = log
        .lines()
        .filter(|l| l.contains("restored from the changelog"))
        .filter_map(|l| {
            let n = l.split("restored=").nth(1)?;
            n.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    assert!(
        restored > 0,
        "the crash after the commit must have been recovered from the changelog (records > 0)"
    );
    fx::teardown(&settings, &topology).await;
}
