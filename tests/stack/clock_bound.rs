//! Issue 43, hole 2: the clock bound (docs/exactness.md, "The clock bound"). The relay judges
//! an outbox entry old by its own clock, and a cut waits `api.relay_min_age` past K by the ops
//! host's: a host 6–30 s off (what the old start check let through, and only writers were
//! checked) could have a request's entry deleted unpublished while its compare-and-set was
//! still in flight, or cut before a request stamped earlier had landed. Every process that
//! stamps or judges time now refuses to start past `cql.max_clock_skew`; the skew is a test
//! build's `LIKES_TEST_CLOCK_SKEW_MS`, a host whose clock is off.

use std::time::Duration;

use crate::common::procs::{stage_env, Stage};
use crate::common::topology as fx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_process_seconds_off_the_database_clock_refuses_to_start() {
    let settings = fx::settings("clockbound");
    let topology = likes::topology::Topology::load(None).unwrap();
    fx::setup(&settings, &topology).await;
    let dir = std::env::temp_dir().join(format!("likes-test-{}", settings.cql.keyspace));
    std::fs::create_dir_all(&dir).unwrap();
    // The default bound and margins, as a deployment runs them.
    let mut env = stage_env(&settings, &dir.join("audit.log"));
    env.retain(|(k, _)| k != "LIKES__CQL__MAX_CLOCK_SKEW");
    env.push((
        "LIKES__API__LISTEN".into(),
        format!("127.0.0.1:{}", crate::common::free_port()),
    ));
    env.push(("LIKES__API__SESSION_KEY".into(), "k".repeat(32)));
    // Inside the band the old check allowed, either way: a relay or an ops host ahead of the
    // writers, a writer behind the relay.
    for (process, skew) in [
        ("relay", 6_000),
        ("relay", 29_000),
        ("api", -10_000),
        ("reconcile", 10_000),
    ] {
        let label = format!("{process}{skew}");
        let mut p = Stage::named(process, &label, env.clone(), &dir);
        let skew_s = skew.to_string();
        if process == "reconcile" {
            // `likes reconcile --all`: a cut chosen by this host's clock.
            let (ok, out, err) = crate::common::likes(
                &["reconcile", "--all"],
                &env.iter()
                    .map(|(k, v)| (leak(k), v.clone()))
                    .chain([("LIKES_TEST_CLOCK_SKEW_MS", skew_s.clone())])
                    .collect::<Vec<_>>(),
            );
            assert!(
                !ok,
                "reconcile ran with its clock {skew} ms off:\n{out}\n{err}"
            );
            assert!(
                err.contains("off the database's") && err.contains("cql.max_clock_skew"),
                "{err}"
            );
            continue;
        }
        p.start_with(&[("LIKES_TEST_CLOCK_SKEW_MS", &skew_s)]);
        assert!(
            p.wait_exit(Duration::from_secs(60)),
            "`likes {process}` ran with its clock {skew} ms off the database's; log:\n{}",
            p.tail()
        );
        let log = p.tail();
        assert!(
            log.contains("off the database's") && log.contains("cql.max_clock_skew"),
            "`likes {process}` exited without saying why:\n{log}"
        );
    }
    // Within the bound, the same relay starts and runs its passes.
    let mut p = Stage::named("relay", "relay-ok", env.clone(), &dir);
    p.start_with(&[("LIKES_TEST_CLOCK_SKEW_MS", "100")]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !p.tail().contains("relay running") {
        p.assert_alive();
        assert!(std::time::Instant::now() < deadline, "{}", p.tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.stop();
    fx::teardown(&settings, &topology).await;
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}
