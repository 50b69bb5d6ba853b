//! Issue 43, hole 5: a tombstone-heavy outbox partition. Each relay pass read `LIMIT 1000`
//! from the start of a (shard, minute) partition and deleted in clustering order, so after a
//! broker outage's backlog the tombstones piled up at its front until a read passed
//! Cassandra's `tombstone_failure_threshold`; and the pass returned on that first error, so
//! every shard after it was never drained again. Its own test binary: it lowers the dev
//! stack's threshold (through the JVM's local JMX agent) for its run, and puts it back.

mod common;

use futures::StreamExt;
use likes::relay::{self, Relay};
use likes::store::outbox::{outbox_minute, OUTBOX_SHARDS};

/// The running Cassandra's tombstone failure threshold, lowered until dropped.
struct Threshold {
    pid: String,
    old: String,
}

impl Threshold {
    fn java(args: &[&str]) -> String {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/stack/cassandra/SetTombstoneThreshold.java"
        );
        let out = std::process::Command::new("java")
            .arg(script)
            .args(args)
            .output()
            .expect("java");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn lower(to: u32) -> Threshold {
        // Where stack/stack.sh keeps its pid files.
        let dir = std::env::var("LIKES_STACK_DIR").unwrap_or_else(|_| {
            let cache = std::env::var("LIKES_CACHE")
                .unwrap_or_else(|_| format!("{}/.cache/likes", std::env::var("HOME").unwrap()));
            format!("{cache}/stack")
        });
        let pid = std::fs::read_to_string(format!("{dir}/cassandra.pid"))
            .expect("the dev stack's cassandra.pid (`make up`)")
            .trim()
            .to_string();
        let old = Self::java(&[&pid, &to.to_string()]);
        Threshold { pid, old }
    }
}

impl Drop for Threshold {
    fn drop(&mut self) {
        Self::java(&[&self.pid, &self.old]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tombstone_heavy_outbox_partition_stalls_neither_its_shard_nor_the_others() {
    let settings = common::settings("relaytomb");
    let topology = likes::topology::Topology::load(None).unwrap();
    common::topology::setup(&settings, &topology).await;
    let relay = Relay::connect(&settings, &topology).await.unwrap();
    let outbox = &relay.outbox;
    // A minute long settled, past every entry's minimum age; every shard's floor at it.
    let minute = outbox_minute(likes::runtime::clock::now_ms()) - 5;
    let at = minute * 60_000 + 1_000;
    for shard in 0..OUTBOX_SHARDS as i32 {
        outbox.set_floor(shard, minute).await.unwrap();
    }
    let put = |shard: i32, n: usize, tag: &'static str| {
        futures::stream::iter(0..n)
            .map(move |i| async move {
                outbox
                    .put(
                        (shard, minute),
                        &format!("{tag}-item-{:05}", i / 4),
                        &format!("u{}", i % 4),
                        &format!("{i:016x}"),
                        at,
                    )
                    .await
                    .unwrap()
            })
            .buffer_unordered(64)
            .collect::<Vec<()>>()
    };
    // Shard 3: a broker outage's backlog, 5,000 entries due at once (naming edges that never
    // flipped: the relay deletes them unpublished, no broker needed).
    put(3, 5_000, "backlog").await;
    // Shard 5: a partition already past the threshold (3,000 tombstones before its one live
    // entry), which no read from its start can pass.
    put(5, 3_000, "gone").await;
    let gone: std::collections::BTreeMap<(i32, i64), Vec<likes::store::outbox::Named>> = [(
        (5, minute),
        (0..3_000)
            .map(|i| likes::store::outbox::Named {
                item: format!("gone-item-{:05}", i / 4),
                user: format!("u{}", i % 4),
                entry: format!("{i:016x}"),
            })
            .collect(),
    )]
    .into();
    outbox.delete_many(&gone).await.unwrap();
    outbox
        .put((5, minute), "zz-item", "u0", "live", at)
        .await
        .unwrap();
    // Shard 9, after both: one due entry.
    put(9, 1, "later").await;

    let _low = Threshold::lower(2_000);
    let min_age = settings.api.relay_min_age;
    let mut errors = Vec::new();
    for _ in 0..8 {
        match relay::pass(&relay, min_age).await {
            Ok(p) => println!("pass: {p:?}"),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let floor = |shard| async move { outbox.floor(shard).await.unwrap().unwrap() };
    assert!(
        floor(3).await > minute,
        "the backlog's partition was never drained ({} failed passes, e.g. {:?})",
        errors.len(),
        errors.first()
    );
    assert!(
        floor(9).await > minute,
        "a shard after the unreadable partition was never drained ({} failed passes, e.g. {:?})",
        errors.len(),
        errors.first()
    );
    assert_eq!(
        floor(5).await,
        minute,
        "the unreadable partition keeps its floor: its entry is not lost"
    );
    drop(_low);
    common::topology::teardown(&settings, &topology).await;
}
