//! A stage that is alive but stuck is detected: `/healthz` answers 200 while stage 1 is idle
//! or making progress, and 503 once it has had input and committed nothing for
//! `metrics.stall_after` (here, a commit that hangs, by fail point), so that Kubernetes'
//! liveness probe restarts it. (Before, a stage stuck in a loop of failing aborts looked
//! alive for as long as anyone cared to watch, with its counts frozen.)

mod common;

use std::time::Duration;

use common::procs;
use common::topology as fx;

async fn healthz(url: &str) -> Option<(u16, String)> {
    let r = reqwest::get(url).await.ok()?;
    Some((r.status().as_u16(), r.text().await.unwrap_or_default()))
}

/// Polls `url` until it answers `status`, for at most `within`.
async fn wait_for(url: &str, status: u16, within: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Some((s, body)) = healthz(url).await {
            if s == status {
                return Some(body);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_stage_stuck_with_input_waiting_turns_its_healthz_red() {
    let mut h = procs::harness("stall").await;
    let addr = format!("127.0.0.1:{}", common::free_port());
    let url = format!("http://{addr}/healthz");
    h.dedupe.start_with(&[
        ("LIKES__METRICS__LISTEN", &addr),
        // Well past any pause of a loaded box between two idle beats, so the idle half cannot
        // turn red by accident; the hung commit below outlasts it by far whatever the box.
        ("LIKES__METRICS__STALL_AFTER", "15s"),
        ("LIKES__DEDUPE__TRANSACTION_TIMEOUT", "3s"),
        // Every commit of a batch with events hangs, as a commit stuck on a broker would.
        ("FAILPOINTS", "dedupe-before-commit=sleep(120000)"),
    ]);

    // Idle for longer than stall_after: nothing waiting is not a stall.
    let idle = wait_for(&url, 200, Duration::from_secs(30)).await;
    assert!(
        idle.is_some(),
        "healthz never answered 200; log:\n{}",
        h.dedupe.tail()
    );
    tokio::time::sleep(Duration::from_secs(17)).await;
    assert_eq!(
        healthz(&url).await.map(|(s, _)| s),
        Some(200),
        "an idle stage is healthy"
    );

    let script = fx::script(5, 5, 5, 2);
    fx::produce(&h.settings, &h.topology, &script.records).await;
    let red = wait_for(&url, 503, Duration::from_secs(90)).await;
    h.dedupe.assert_alive();
    let body = red.unwrap_or_else(|| panic!("healthz stayed 200; log:\n{}", h.dedupe.tail()));
    assert!(body.contains("stalled: dedupe"), "{body}");
    fx::teardown(&h.settings, &h.topology).await;
}
