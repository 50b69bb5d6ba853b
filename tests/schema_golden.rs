//! Schema evolution, checked on bytes (no stack needed). `tests/golden/v1.0.0/` holds records
//! as the last released schema set (`schemas/released/v1.0.0`) writes them. Today's code must
//! decode them (readers after writers: the replay horizon holds old records), and the
//! released code must decode what today's code writes (a stage not yet upgraded reads new
//! records during a rolling upgrade). prost skips fields it does not know; it does not keep
//! them, so an old stage that re-encoded a record would drop a new field (none re-encodes).
//!
//! `LIKES_WRITE_GOLDEN=1 cargo test --test schema_golden` rewrites the files from the
//! released schema: only when a new schema set is released, never to make a test pass.

use likes::schema::v1 as today;
use prost::Message;

/// The prost types of the released schema set, compiled by `build.rs`.
mod released {
    include!(concat!(env!("OUT_DIR"), "/released/likes.v1.rs"));
}

/// Found at run time: the build cache is shared by checkouts (testkit/src/repo.rs).
fn golden_dir() -> std::path::PathBuf {
    likes_testkit::repo::root().join("tests/golden/v1.0.0")
}

fn released_event() -> released::LikeEvent {
    released::LikeEvent {
        item_id: "item-golden".into(),
        user_id: "user-7".into(),
        op_id: 3,
        state: released::EdgeState::Liked as i32,
        event_time_ms: 1_764_460_800_123,
        epoch: 0,
        bucket: likes::hash::bucket_of("user-7", 64),
        source: released::Source::Api as i32,
        prev_event_time_ms: 1_764_460_700_000,
    }
}

fn released_records() -> Vec<(&'static str, Vec<u8>)> {
    use released::delta_record::Record;
    let record = |r| released::DeltaRecord { record: Some(r) }.encode_to_vec();
    vec![
        ("like_event", released_event().encode_to_vec()),
        (
            "delta",
            record(Record::Delta(released::Delta {
                item_id: "item-golden".into(),
                delta: -2,
                event_time_ms: 1_764_460_800_000,
                events: 4,
                mean_event_time_ms: 1_764_460_800_500,
            })),
        ),
        (
            "tick",
            record(Record::Tick(released::Tick {
                produced_at_ms: 1_764_460_801_000,
            })),
        ),
        (
            "correction",
            record(Record::Correction(released::Correction {
                item_id: "item-golden".into(),
                delta: 5,
                correction_id: "c-golden".into(),
                reason: "drift".into(),
                snapshot_time_ms: 1_764_460_000_000,
                after_snapshot_time_ms: 1_764_400_000_000,
            })),
        ),
    ]
}

fn golden(name: &str) -> Vec<u8> {
    let path = golden_dir().join(format!("{name}.hex"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let hex: String = text.split_whitespace().collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The golden files are what the released schema writes: if this fails, the baseline in
/// `schemas/released/` was edited, which a released schema never is.
#[test]
fn the_released_schema_writes_the_golden_bytes() {
    for (name, bytes) in released_records() {
        if std::env::var("LIKES_WRITE_GOLDEN").as_deref() == Ok("1") {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            std::fs::write(golden_dir().join(format!("{name}.hex")), hex + "\n").unwrap();
        }
        assert_eq!(golden(name), bytes, "{name}: golden bytes differ");
    }
}

/// Old bytes, today's reader: every field keeps its meaning, new fields read as their
/// default, and stage 1's validation accepts the event as it is.
#[test]
fn todays_code_reads_what_the_released_schema_wrote() {
    let e = today::LikeEvent::decode(golden("like_event").as_slice()).unwrap();
    let want = released_event();
    assert_eq!(
        (e.item_id.as_str(), e.user_id.as_str(), e.op_id, e.state),
        ("item-golden", "user-7", 3, today::EdgeState::Liked as i32)
    );
    assert_eq!(
        (e.event_time_ms, e.prev_event_time_ms, e.bucket, e.source),
        (
            want.event_time_ms,
            want.prev_event_time_ms,
            want.bucket,
            today::Source::Api as i32
        )
    );
    assert_eq!(e.client_platform, today::ClientPlatform::Unspecified as i32);
    let valid = likes::dedupe::event::parse(
        Some(likes::hash::event_key("item-golden", e.bucket).as_bytes()),
        Some(golden("like_event").as_slice()),
        64,
    )
    .expect("stage 1 accepts a released-schema event");
    assert_eq!(valid.event, e);

    use today::delta_record::Record;
    let decode = |name| {
        today::DeltaRecord::decode(golden(name).as_slice())
            .unwrap()
            .record
    };
    match decode("delta") {
        Some(Record::Delta(d)) => assert_eq!(
            (d.item_id.as_str(), d.delta, d.events, d.mean_event_time_ms),
            ("item-golden", -2, 4, 1_764_460_800_500)
        ),
        other => panic!("delta decoded as {other:?}"),
    }
    match decode("tick") {
        Some(Record::Tick(t)) => assert_eq!(t.produced_at_ms, 1_764_460_801_000),
        other => panic!("tick decoded as {other:?}"),
    }
    match decode("correction") {
        Some(Record::Correction(c)) => assert_eq!(
            (c.delta, c.snapshot_time_ms, c.after_snapshot_time_ms),
            (5, 1_764_460_000_000, 1_764_400_000_000)
        ),
        other => panic!("correction decoded as {other:?}"),
    }
}

/// New bytes, the released reader (a stage not yet rolled): the new field is skipped and
/// every field it knows decodes as written.
#[test]
fn the_released_schema_reads_what_todays_code_writes() {
    let flip = likes::records::Flip {
        item: "item-golden",
        user: "user-7",
        op_id: 3,
        liked: true,
        event_time_ms: 1_764_460_800_123,
        prev_event_time_ms: 1_764_460_700_000,
        earlier_event_times_ms: &[1_764_460_600_000],
        source: today::Source::Api,
        platform: today::ClientPlatform::Ios,
    };
    let (_, bytes) = flip.record(64);
    let today_event = today::LikeEvent::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        today_event.client_platform,
        today::ClientPlatform::Ios as i32
    );

    let old = released::LikeEvent::decode(bytes.as_slice()).expect("released reader decodes");
    assert_eq!(old, released_event(), "every released field as written");
    assert_eq!(
        today_event.earlier_event_times_ms,
        [1_764_460_600_000],
        "the earlier flip times round-trip"
    );
    // Without the new fields the bytes are exactly what the released schema writes.
    let without = today::LikeEvent {
        client_platform: 0,
        earlier_event_times_ms: vec![],
        ..today_event
    };
    assert_eq!(without.encode_to_vec(), golden("like_event"));
}
