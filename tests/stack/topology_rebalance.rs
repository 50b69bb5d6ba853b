//! Partitions move between two live `likes dedupe` instances with their state: when one
//! instance stops, the other takes its partitions and restores their edges from the
//! changelog; when it comes back, it takes them back and restores what it missed. Counts stay
//! exact and no (item, window) is applied twice.

use std::time::Duration;

use crate::common::procs::{self, Stage};
use crate::common::topology as fx;

/// How many edges a stage's log says it restored from the changelog, in all.
fn restored(log: &std::path::Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("state restored from the changelog"))
        .filter_map(|l| {
            let v = l.split("restored=").nth(1)?;
            v.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Waits until a stage's log says it restored more edges from the changelog than `before` (an
/// outcome, not a time: how soon depends on the box), for at most two minutes.
async fn wait_restored(log: &std::path::Path, who: &str, before: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while restored(log) <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "{who} restored nothing from the changelog in 2 minutes ({})",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_with_their_state_between_instances() {
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        dedupe: mut a,
        mut count,
        env,
    } = procs::harness("rebalance").await;
    let mut env_b = env.clone();
    for (k, v) in env_b.iter_mut() {
        if k == "LIKES__DEDUPE__INSTANCE_ID" {
            v.push_str("-b");
        }
    }
    let mut b = Stage::named("dedupe", "dedupe-b", env_b, &dir);
    a.start();
    b.start();
    count.start();

    let script = fx::script(23, 30, 50, 5);
    let want = fx::nonzero(&script.truth);
    let chunks: Vec<_> = script
        .records
        .chunks(script.records.len() / 6 + 1)
        .collect();
    let (a_log, b_log) = (dir.join("dedupe.log"), dir.join("dedupe-b.log"));
    let (mut a_before, mut b_before) = (0, 0);
    for (i, chunk) in chunks.iter().enumerate() {
        fx::produce(&settings, &topology, chunk).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        match i {
            1 => {
                a_before = restored(&a_log);
                b.stop(); // its partitions go to a once its session times out
            }
            3 => {
                // Once a has taken b's partitions (its log says it restored them), whenever
                // that is on this box, b comes back: they return to b, which missed what a
                // did meanwhile.
                wait_restored(&a_log, "a", a_before).await;
                b_before = restored(&b_log);
                b.start();
            }
            _ => {}
        }
    }
    wait_restored(&b_log, "b", b_before).await;
    b.assert_alive();
    let have = procs::drain(&mut a, &mut count, &settings, &want).await;
    b.stop();
    assert_eq!(
        have, want,
        "counts must equal the ground truth across rebalances"
    );
    procs::assert_audit(&audit, &want);
    let (ra, rb) = (
        restored(&dir.join("dedupe.log")),
        restored(&dir.join("dedupe-b.log")),
    );
    eprintln!("edges restored from the changelog: a {ra}, b {rb}");
    assert!(
        ra > 0,
        "a must have restored b's partitions from the changelog"
    );
    assert!(
        rb > 0,
        "b must have restored what it missed from the changelog"
    );
    fx::teardown(&settings, &topology).await;
}
