//! The stages ride through a kill -9 of the Kafka broker (down 30 s, longer than the
//! transaction timeout, so the coordinator aborts the open transaction and fences its
//! producer) and then of Cassandra, while a stream flows: neither process exits, both make
//! progress once their dependency is back, and every count equals the ground truth with no
//! (item, window) applied twice. Before, stage 1 exited fenced and stage 2 on
//! `AllBrokersDown`. Kills the shared stack, so it runs as a test binary of its own.

mod common;

use std::time::Duration;

use common::procs;
use common::topology as fx;

/// Lines at ERROR in a stage's log from the stage or its Kafka client: a dependency's restart
/// is routine and pages nobody. (The Cassandra driver says "Could not establish control
/// connection" at ERROR while no node answers, which the single local node's kill means.)
fn error_lines(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            [" ERROR likes", " ERROR librdkafka", " ERROR rdkafka"]
                .iter()
                .any(|p| l.contains(p))
        })
        .map(str::to_string)
        .collect()
}

/// kill -9 of `name`, down `secs` seconds while the stages must stay alive, then up again.
async fn outage(name: &str, secs: u64, stages: &mut [&mut procs::Stage]) {
    common::stack::kill9(name);
    eprintln!("{name} killed");
    for _ in 0..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stages.iter_mut().for_each(|s| s.assert_alive());
    }
    common::stack::up();
    eprintln!("{name} back");
    stages.iter_mut().for_each(|s| s.assert_alive());
}

/// The tests of this binary kill the shared stack: one at a time.
static OUTAGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_ride_through_kill_9_of_the_broker_and_of_cassandra() {
    let _turn = OUTAGES.lock().await;
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("stackkill").await;
    dedupe.start();
    count.start();

    let script = fx::script(23, 40, 60, 6);
    let want = fx::nonzero(&script.truth);
    let chunks: Vec<Vec<(String, Vec<u8>)>> = script
        .records
        .chunks(script.records.len() / 12 + 1)
        .map(<[_]>::to_vec)
        .collect();
    // The stream flows on its own task, through both outages (the producer buffers and
    // retries), so the broker dies while stage 1 is committing.
    let producer = {
        let (settings, topology) = (settings.clone(), topology.clone());
        tokio::spawn(async move {
            for chunk in chunks {
                fx::produce(&settings, &topology, &chunk).await;
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        })
    };

    tokio::time::sleep(Duration::from_secs(3)).await;
    let _restore = common::stack::UpOnDrop;
    outage("kafka", 30, &mut [&mut dedupe, &mut count]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    outage("cassandra", 10, &mut [&mut dedupe, &mut count]).await;
    producer.await.unwrap();

    let (dedupe_log, count_log) = (dir.join("dedupe.log"), dir.join("count.log"));
    let have = procs::drain(&mut dedupe, &mut count, &settings, &want).await;
    assert_eq!(dedupe.starts + count.starts, 2, "no stage was restarted");
    assert_eq!(
        have, want,
        "counts must equal the ground truth after the outages"
    );
    procs::assert_audit(&audit, &want);
    for log in [&dedupe_log, &count_log] {
        let errors = error_lines(log);
        assert!(
            errors.is_empty(),
            "{}: a dependency's restart logged at ERROR:\n{}",
            log.display(),
            errors.join("\n")
        );
    }
    fx::teardown(&settings, &topology).await;
}

/// Issue 23, item 9: an operations job rides through a broker restart during its wait for
/// the pipeline to pass its cut (transient errors retried with backoff up to
/// `ops.wait_timeout`), and still finds no drift, every item compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drift_rides_through_a_broker_restart_during_its_wait() {
    use likes::ops::cut::Pipeline;
    use likes::ops::drift::{self, Scope};

    let _turn = OUTAGES.lock().await;
    let (settings, topology, app, client) = common::api::serve_with("driftkill", |s| {
        s.api.relay_min_age = Duration::from_secs(8);
        s.api.write_deadline = Duration::from_secs(2);
        s.cql.request_timeout = Duration::from_secs(5);
        s.ops.wait_timeout = Duration::from_secs(150);
    })
    .await;
    let mut run = fx::start(&settings, &topology);
    for u in 0..6 {
        let (s, b) = client
            .like(
                &format!("u{u}"),
                &format!("item-{}", u % 3),
                &format!("k{u}"),
            )
            .await;
        assert_eq!(s, reqwest::StatusCode::OK, "{b}");
    }
    let ks = &app.settings.cql.keyspace;
    let want = fx::nonzero(
        &likes_testkit::truth::liked_per_item(&app.session, ks)
            .await
            .unwrap(),
    );
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(60)).await;
    assert_eq!(have, want);

    let job = {
        let (s, t) = (settings.clone(), topology.clone());
        common::on_own_runtime(move || async move {
            let p = Pipeline::connect(&s, &t).await?;
            drift::run(&p, &Scope::All).await
        })
    };
    // The job waits relay_min_age past its cut first: the broker dies meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _restore = common::stack::UpOnDrop;
    common::stack::kill9("kafka");
    tokio::time::sleep(Duration::from_secs(15)).await;
    common::stack::up();
    let report = tokio::task::spawn_blocking(move || job.join().unwrap())
        .await
        .unwrap()
        .expect("drift rides through the broker's restart");
    let drifted = report.drifted();
    assert!(drifted.is_empty(), "{report}");
    assert_eq!(report.in_flight(), 0, "{report}");
    assert_eq!(report.items.len(), want.len(), "{report}");
    run.check().await;
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}
