//! The worked example's rollout, on the real stack: while the stages run, writers move from
//! the released schema (no `client_platform`) to today's, one edge at a time, so the events
//! topic holds both at once, as it does during a rolling upgrade of the API (readers, the
//! stages, were rolled first). Every count converges to the truth, duplicates of either
//! form die in stage 1, and nothing goes to the dead-letter topic.

use std::collections::BTreeMap;
use std::time::Duration;

use likes::records::Flip;
use likes::schema::v1::{ClientPlatform, Source};
use prost::Message;

use crate::common::topology as fx;

/// The released schema's types, as `build.rs` compiles `schemas/released/v1.0.0`.
#[allow(dead_code)] // only its LikeEvent is written here
mod released {
    include!(concat!(env!("OUT_DIR"), "/released/likes.v1.rs"));
}

/// The event as a writer still on the released schema encodes it.
fn released_bytes(flip: &Flip, buckets: u32) -> Vec<u8> {
    let e = flip.event(buckets);
    released::LikeEvent {
        item_id: e.item_id,
        user_id: e.user_id,
        op_id: e.op_id,
        state: e.state,
        event_time_ms: e.event_time_ms,
        epoch: e.epoch,
        bucket: e.bucket,
        source: e.source,
        prev_event_time_ms: e.prev_event_time_ms,
    }
    .encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn old_and_new_events_mixed_on_the_log_count_exactly() {
    let settings = fx::settings("rollout");
    let topology = likes::topology::Topology::load(None).unwrap();
    fx::setup(&settings, &topology).await;
    let mut running = fx::start(&settings, &topology);

    let buckets = topology.buckets;
    let now = likes::runtime::clock::now_ms();
    let mut records = Vec::new();
    let mut truth: BTreeMap<String, i64> = BTreeMap::new();
    // 6 items x 40 users; each edge flips 1-3 times. Edges switch writers part way: the
    // first flips of an edge may be old-format, its later ones new-format (never back).
    for i in 0..6 {
        let item = format!("item-{i}");
        for u in 0..40 {
            let user = format!("u{u}");
            let flips = 1 + (i + u) % 3;
            let switch_at = (u % 4) as u64; // 0: all new; 3+: all old
            let mut prev = 0;
            let mut earlier: Vec<i64> = Vec::new();
            for op in 1..=flips as u64 {
                let at = now - 60_000 + (op as i64) * 1_000 + u as i64;
                let flip = Flip {
                    item: &item,
                    user: &user,
                    op_id: op,
                    liked: op % 2 == 1,
                    event_time_ms: at,
                    prev_event_time_ms: prev,
                    earlier_event_times_ms: &earlier.clone(),
                    source: Source::Test,
                    platform: ClientPlatform::Android,
                };
                if prev > 0 {
                    earlier.insert(0, prev);
                }
                prev = at;
                let key = likes::hash::event_key(&item, likes::hash::bucket_of(&user, buckets));
                let (new, old) = (flip.record(buckets).1, released_bytes(&flip, buckets));
                // Each event twice, the copy in the other encoding: an old API's event
                // republished by an upgraded relay (or the reverse) dies as a duplicate.
                let (first, copy) = if op > switch_at {
                    (new, old)
                } else {
                    (old, new)
                };
                records.push((key.clone(), first));
                records.push((key, copy));
            }
            *truth.entry(item.clone()).or_default() += i64::from(flips % 2 == 1);
        }
    }
    fx::produce(&settings, &topology, &records).await;
    let want = fx::nonzero(&truth);
    let have = fx::wait_for_counts(&mut running, &settings, &want, Duration::from_secs(120)).await;
    assert_eq!(have, want, "counts over a log of old and new events");
    let (d, _) = running.stop().await;
    assert_eq!(
        d.dead_letters, 0,
        "no event of either schema is refused: {d:?}"
    );
    assert!(
        d.duplicates >= (records.len() / 2) as u64,
        "every copy died as a duplicate: {d:?}"
    );
    fx::teardown(&settings, &topology).await;
}
