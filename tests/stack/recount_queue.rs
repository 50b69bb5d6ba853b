//! The recount queue (`likes reconcile --dead-letters`, src/ops/dead_letters.rs), record by
//! record on the real broker (issue 43, hole 3): it reads from the recount group's position,
//! names items by key or by value and counts the records that name none, commits what it
//! read; records retention deleted before a run are counted, not skipped in silence; an item
//! in flight at every cut is put back on the queue while the queue moves on (before, it held
//! every later run until retention took the records).

use std::time::Duration;

use likes::ops::cut::Pipeline;
use likes::ops::dead_letters;
use prost::Message as _;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::StatusCode;

use crate::common::api;
use crate::common::topology as fx;
use crate::ops_jobs::quick;

/// Sends one record to partition 0 of `likes.dlq` and returns its offset.
async fn send(
    settings: &likes::config::Settings,
    topic: &str,
    key: Option<&str>,
    payload: Option<&[u8]>,
    deltas_topic: Option<&str>,
) -> i64 {
    let producer: FutureProducer = likes::kafka::producer_config(&settings.kafka)
        .create()
        .unwrap();
    let mut headers = OwnedHeaders::new().insert(Header {
        key: "likes.error",
        value: Some("test"),
    });
    if let Some(t) = deltas_topic {
        headers = headers.insert(Header {
            key: "likes.source.topic",
            value: Some(t),
        });
    }
    let mut r = FutureRecord::<str, [u8]>::to(topic)
        .partition(0)
        .headers(headers);
    if let Some(k) = key {
        r = r.key(k);
    }
    if let Some(p) = payload {
        r = r.payload(p);
    }
    producer
        .send(r, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .unwrap()
        .offset
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn the_queue_reads_from_its_position_counts_what_it_lost_and_never_stalls() {
    let (settings, topology, _app, client) = api::serve_with("recountq", quick).await;
    let run = fx::start(&settings, &topology);
    let dlq = settings.topic(&topology.topics.dlq.name);
    let deltas = settings.topic(&topology.topics.deltas.name);
    let p = Pipeline::connect(&settings, &topology).await.unwrap();

    // Stage 1's key, a LikeEvent with no key, stage 2's (the item as key, from the deltas
    // topic), and one that names nothing.
    let event = likes::schema::v1::LikeEvent {
        item_id: "q-b".into(),
        ..Default::default()
    }
    .encode_to_vec();
    send(&settings, &dlq, Some("q-a#3"), None, None).await;
    send(&settings, &dlq, None, Some(&event), None).await;
    send(&settings, &dlq, Some("q-c"), Some(&[0xff]), Some(&deltas)).await;
    send(&settings, &dlq, Some("nohash"), Some(&[0xff, 0xfe]), None).await;
    let first = dead_letters::recount(&p, false, "test").await.unwrap();
    assert_eq!(
        (
            first.queue.records,
            first.queue.items.clone(),
            first.queue.unattributed
        ),
        (4, vec!["q-a".into(), "q-b".into(), "q-c".into()], 1),
        "{first}"
    );
    assert_eq!((first.queue.lost, first.requeued.len()), (0, 0), "{first}");

    // From the group's position: nothing new, then only the one record sent since.
    let again = dead_letters::read(&p).unwrap();
    assert_eq!((again.records, again.items.len()), (0, 0));
    send(&settings, &dlq, Some("q-d#1"), None, None).await;
    let second = dead_letters::recount(&p, false, "test").await.unwrap();
    assert_eq!(
        (second.queue.records, second.queue.items.clone()),
        (1, vec!["q-d".to_string()]),
        "{second}"
    );

    // Retention takes three records before a run reads them: counted, and the two left read.
    let mut lost_from = 0;
    for (n, item) in ["q-e", "q-f", "q-g", "q-h", "q-i"].iter().enumerate() {
        let at = send(&settings, &dlq, Some(&format!("{item}#0")), None, None).await;
        if n == 0 {
            lost_from = at;
        }
    }
    let admin = likes::kafka::admin(&settings.kafka).unwrap();
    let mut upto = rdkafka::TopicPartitionList::new();
    upto.add_partition_offset(&dlq, 0, rdkafka::Offset::Offset(lost_from + 3))
        .unwrap();
    admin
        .delete_records(&upto, &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap();
    let third = dead_letters::recount(&p, false, "test").await.unwrap();
    assert_eq!(
        (
            third.queue.lost,
            third.queue.records,
            third.queue.items.clone()
        ),
        (3, 2, vec!["q-h".to_string(), "q-i".to_string()]),
        "{third}"
    );
    assert!(likes::ops::gauges::render(&third.gauges()).contains("likes_recount_lost_records 3"));

    // An item whose edge flips many times after every cut of the run: in flight at each, so it is
    // put back on the queue, and the queue moves on past what was read.
    let (s, b) = client.like("fl", "q-j", "j0").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    send(&settings, &dlq, Some("q-j#0"), None, None).await;
    send(&settings, &dlq, Some("q-k#0"), None, None).await;
    let _turn = crate::ops_jobs::FAILPOINTS.lock().await;
    let (at_cut, cut_reached) = std::sync::mpsc::channel::<()>();
    let (flipped, wait_flipped) = std::sync::mpsc::channel::<()>();
    let (at_cut, wait_flipped) = (
        std::sync::Mutex::new(at_cut),
        std::sync::Mutex::new(wait_flipped),
    );
    fail::cfg_callback("reconcile-after-wait", move || {
        if !crate::common::on_held_job() {
            return;
        }
        let _ = at_cut.lock().unwrap().send(());
        let _ = wait_flipped
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(300));
    })
    .unwrap();
    // On a runtime of its own: the fail point blocks the thread it runs on.
    let job = {
        let (s, t) = (settings.clone(), topology.clone());
        crate::common::on_own_runtime(move || async move {
            let p = Pipeline::connect(&s, &t).await.unwrap();
            dead_letters::recount(&p, false, "test").await
        })
    };
    let cut_reached = std::sync::Arc::new(std::sync::Mutex::new(cut_reached));
    for attempt in 0..3 {
        let c = cut_reached.clone();
        tokio::task::spawn_blocking(move || {
            c.lock().unwrap().recv_timeout(Duration::from_secs(120))
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the recount reaches its cut (attempt {attempt}): {e}"));
        // Past the 16 request keys an edge keeps: its state at the cut is no longer known.
        for (n, like) in (0..20).map(|n| (n, n % 2 == 1)) {
            let key = format!("j{attempt}-{n}");
            let (s, b) = if like {
                client.like("fl", "q-j", &key).await
            } else {
                client.unlike("fl", "q-j", &key).await
            };
            assert_eq!(s, StatusCode::OK, "{b}");
        }
        flipped.send(()).unwrap();
    }
    let fourth = tokio::task::spawn_blocking(move || job.join().unwrap())
        .await
        .unwrap()
        .unwrap();
    fail::remove("reconcile-after-wait");
    assert_eq!(fourth.requeued, vec!["q-j".to_string()], "{fourth}");
    assert_eq!(
        fourth.queue.items,
        vec!["q-j".to_string(), "q-k".to_string()]
    );
    // The next run reads only the record that put q-j back, and settles it.
    let fifth = dead_letters::recount(&p, false, "test").await.unwrap();
    assert_eq!(
        (
            fifth.queue.records,
            fifth.queue.items.clone(),
            fifth.requeued.len()
        ),
        (1, vec!["q-j".to_string()], 0),
        "{fifth}"
    );
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}

/// Issue 43, item 8: a dead letter stamped by a writer whose clock is ahead names a flip past
/// "now"; a cut taken at the job's now would count that edge as it stood before the flip while
/// the flip's own delta is still to come, and the item would end one off. The queue's cut is
/// past the latest event time it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_queues_cut_is_past_the_latest_event_it_read() {
    let (settings, topology, _app, _client) = api::serve_with("recountk", quick).await;
    let run = fx::start(&settings, &topology);
    let dlq = settings.topic(&topology.topics.dlq.name);
    let p = Pipeline::connect(&settings, &topology).await.unwrap();
    // Inside the clock bound a writer may be this far ahead of the job (further, the cut is
    // clamped to now + 2 × the bound: `dead_letters::cut_floor`).
    let ahead = likes::runtime::clock::now_ms() + settings.cql.max_clock_skew.as_millis() as i64;
    let event = likes::schema::v1::LikeEvent {
        item_id: "k-a".into(),
        event_time_ms: ahead,
        ..Default::default()
    }
    .encode_to_vec();
    send(&settings, &dlq, None, Some(&event), None).await;
    let r = dead_letters::recount(&p, false, "test").await.unwrap();
    assert_eq!(r.queue.latest_event_ms, ahead, "{r}");
    assert!(
        !r.reconcile.cuts.is_empty() && r.reconcile.cuts.iter().all(|&k| k > ahead),
        "cuts {:?} must be past the event at {ahead}",
        r.reconcile.cuts
    );
    run.stop().await;
    fx::teardown(&settings, &topology).await;
}
