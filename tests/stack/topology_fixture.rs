//! Whole-topology fixtures on the real stack: a scripted stream with duplicates, reorders
//! within an edge, superseded flips, likes and unlikes goes in; counts equal to the ground
//! truth of the final edge states come out. Then the state dir is wiped, both groups are
//! reset to earliest and the stages re-run: counts do not move; the same after a reset to a
//! time in the middle of the deltas log, and a reset that would skip unread records is
//! refused. A corrupt record lands on
//! the dead-letter topic and the stage keeps going.

use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::Message as _;

use crate::common::topology as fx;
use likes::config::Settings;
use likes::kafka;
use likes::schema::v1::{delta_record, Correction, DeltaRecord};
use likes::topology::Topology;
use prost::Message as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripted_stream_counts_exactly_and_replay_changes_nothing() {
    let settings = fx::settings("fixture");
    let topology = Topology::load(None).unwrap();
    fx::setup(&settings, &topology).await;

    let script = fx::script(7, 25, 40, 5);
    let want = fx::nonzero(&script.truth);
    assert!(want.len() > 10, "the script must exercise many items");
    // A corrupt record among the real ones.
    let mut records = script.records.clone();
    records.insert(
        records.len() / 2,
        ("item-0#1".into(), vec![0xff, 0xff, 0xff]),
    );
    let before_events = likes::runtime::clock::now_ms() - 1000;
    fx::produce(&settings, &topology, &records).await;

    let mut run = fx::start(&settings, &topology);
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(90)).await;
    let (d, c) = run.stop().await;
    assert_eq!(have, want, "counts must equal the ground truth");
    assert_eq!(d.events as usize, records.len());
    assert_eq!(d.dead_letters, 1);
    assert!(d.duplicates > 0, "the script delivers duplicates");
    assert_eq!(c.clamps, 0, "no count may have gone negative");
    assert_eq!(c.fence_skips, 0, "nothing was replayed yet");
    assert!(c.lwts >= want.len() as u64);
    eprintln!(
        "first run: {d:?} {c:?}; {} flips, {} records",
        script.flips,
        records.len()
    );

    // The dead letter carries the reason and where it came from.
    let dlq: StreamConsumer = kafka::client_config(&settings.kafka)
        .set("group.id", crate::common::unique("dlq"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    dlq.subscribe(&[&settings.topic(&topology.topics.dlq.name)])
        .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(30), dlq.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.payload(), Some(&[0xff, 0xff, 0xff][..]));
    let headers = m.headers().unwrap();
    let error = headers.iter().find(|h| h.key == "likes.error").unwrap();
    assert!(String::from_utf8_lossy(error.value.unwrap()).contains("undecodable"));

    // Corrections (reconciliation's output) go through the fence as deltas of their window.
    // Everything on the deltas log before this moment has been applied: the --to-time
    // replay below starts here.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before_corrections = likes::runtime::clock::now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let producer: rdkafka::producer::FutureProducer =
        kafka::producer_config(&settings.kafka).create().unwrap();
    let deltas = settings.topic(&topology.topics.deltas.name);
    let mut want = want;
    for (item, delta) in [("item-3", 2i64), ("item-4", -1)] {
        let record = DeltaRecord {
            record: Some(delta_record::Record::Correction(Correction {
                item_id: item.into(),
                delta,
                correction_id: format!("test-{item}"),
                reason: "fixture".into(),
                snapshot_time_ms: likes::runtime::clock::now_ms(),
                after_snapshot_time_ms: 0,
            })),
        }
        .encode_to_vec();
        producer
            .send(
                rdkafka::producer::FutureRecord::to(&deltas)
                    .key(item)
                    .payload(&record),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        *want.entry(item.to_string()).or_insert(0) += delta;
    }
    let mut run = fx::start(&settings, &topology);
    let have = fx::wait_for_counts(&mut run, &settings, &want, Duration::from_secs(60)).await;
    let (_, c) = run.stop().await;
    assert_eq!(have, want, "each correction applies exactly once");
    assert_eq!(
        c.windows_applied, 2,
        "two corrections, two (item, window) writes"
    );

    // A replay is refused while a stage runs: its next commit would undo the reset.
    let groups = [
        settings.group(&topology.groups.dedupe),
        settings.group(&topology.groups.count),
    ];
    let mut env = crate::common::env_for(&settings);
    env.push(("LIKES__KAFKA__SESSION_TIMEOUT", "6s".into()));
    let run = fx::start(&settings, &topology);
    fx::wait_for_member(&settings, &groups[1], Duration::from_secs(60)).await;
    let (ok, _, err) =
        crate::common::likes(&["replay", "--group", &groups[1], "--to-earliest"], &env);
    assert!(!ok, "replay must refuse while the count stage runs");
    // A refusal the operator acts on, not a configuration error (issue 24).
    assert!(
        err.contains("refused:") && err.contains("live members"),
        "{err}"
    );
    run.stop().await;

    // Replay: wipe the dedupe state, reset both groups to earliest, run again.
    std::fs::remove_dir_all(&settings.dedupe.state_dir).unwrap();
    for g in &groups {
        let (ok, out, err) = crate::common::likes(&["replay", "--group", g, "--to-earliest"], &env);
        assert!(ok, "replay {g}: {err}");
        assert!(out.contains("offset 0"), "{out}");
    }
    let run = fx::start(&settings, &topology);
    wait_replayed(&settings, &topology).await;
    let (d2, c2) = run.stop().await;
    assert_eq!(
        fx::nonzero(&fx::counts(&settings).await),
        want,
        "a replay must not move counts"
    );
    assert_eq!(
        c2.windows_applied, 0,
        "every replayed window must bounce off the fence"
    );
    assert!(c2.fence_skips > 0, "the replay re-offered windows");
    assert!(
        d2.events as usize >= records.len(),
        "dedupe re-read the whole log"
    );
    eprintln!("replay: {d2:?} {c2:?}");

    // Replay to a time: the count group goes back to the corrections (a mid-log reset that
    // re-offers already applied windows), the dedupe group to just before its first event, with
    // its state present: every event is read again and none emits. A time past what a group
    // has read is refused: it would skip records.
    let (ok, _, err) = crate::common::likes(
        &[
            "replay",
            "--group",
            &groups[1],
            "--to-time",
            &(likes::runtime::clock::now_ms() + 3_600_000).to_string(),
        ],
        &env,
    );
    assert!(
        !ok && err.contains("refusing to move group"),
        "a reset past the open window's records must be refused: {err}"
    );
    for (g, to) in groups.iter().zip([before_events, before_corrections]) {
        let to = to.to_string();
        let (ok, out, err) =
            crate::common::likes(&["replay", "--group", g, "--to-time", &to], &env);
        assert!(ok, "replay {g} --to-time {to}: {err}");
        eprintln!("{out}");
    }
    let run = fx::start(&settings, &topology);
    wait_replayed(&settings, &topology).await;
    let (d3, c3) = run.stop().await;
    assert_eq!(
        fx::nonzero(&fx::counts(&settings).await),
        want,
        "a replay to a time must not move counts"
    );
    assert_eq!(c3.windows_applied, 0, "{c3:?}");
    assert!(
        c3.fence_skips >= 2,
        "the corrections' windows were re-offered and fenced: {c3:?}"
    );
    assert_eq!(
        d3.events as usize,
        records.len(),
        "every event is newer than the reset time: {d3:?}"
    );
    assert_eq!(
        d3.replayed as usize,
        records.len(),
        "each was below the emitted-up-to offset: {d3:?}"
    );
    // Issue 23, item 5: the reset rewound the input, never the history, and the local state
    // was exactly the changelog at the old position: nothing to rebuild.
    assert_eq!(
        d3.restores, 0,
        "a replay over exact local state must not rebuild it: {d3:?}"
    );
    fx::teardown(&settings, &topology).await;
}

/// Waits until both stages have read their input to its end after a replay (stage 1 the
/// events, stage 2 the deltas), however long the box takes, up to two minutes each.
async fn wait_replayed(settings: &Settings, topology: &Topology) {
    fx::wait_stages_done(settings, topology).await;
}
