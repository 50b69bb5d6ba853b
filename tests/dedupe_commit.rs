//! A stage-1 commit whose outcome is unknown (the call returned a retriable error while the
//! coordinator may already have committed) is resumed, never aborted and re-read: a re-read
//! batch whose first commit did land would emit its deltas twice. The fail point gives the
//! first commit call a 0 ms timeout, so it returns while the commit goes on in the
//! background, as when the broker's answer is lost.

mod common;

use std::time::Duration;

use common::topology as fx;
use likes::topology::Topology;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_commit_whose_outcome_is_unknown_is_resumed_never_aborted() {
    let settings = fx::settings("commitunknown");
    let topology = Topology::load(None).unwrap();
    fx::setup(&settings, &topology).await;
    let script = fx::script(61, 12, 20, 3);
    let want = fx::nonzero(&script.truth);

    fail::cfg("dedupe-commit-outcome-unknown", "5*return").unwrap();
    let mut run = fx::start(&settings, &topology);
    // In small chunks, so several transactions carry events while the fail point is armed.
    for chunk in script.records.chunks(script.records.len() / 6 + 1) {
        fx::produce(&settings, &topology, chunk).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(60)).await;
    fail::remove("dedupe-commit-outcome-unknown");
    let (d, _) = run.stop().await;
    assert_eq!(have, want, "counts must equal the ground truth");
    assert!(
        d.commits_resumed > 0,
        "the fail point must have left a commit's outcome unknown: {d:?}"
    );
    fx::teardown(&settings, &topology).await;
}
