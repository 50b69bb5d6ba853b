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

/// A namespace, its relay, and a minute long settled (past every entry's minimum age) with
/// every shard's floor at it; the time its entries are written at.
async fn settled(
    base: &str,
) -> (
    likes::config::Settings,
    likes::topology::Topology,
    Relay,
    i64,
    i64,
) {
    let settings = common::settings(base);
    let topology = likes::topology::Topology::load(None).unwrap();
    common::topology::setup(&settings, &topology).await;
    let relay = Relay::connect(&settings, &topology).await.unwrap();
    let minute = outbox_minute(likes::runtime::clock::now_ms()) - 5;
    for shard in 0..OUTBOX_SHARDS as i32 {
        relay.outbox.set_floor(shard, minute).await.unwrap();
    }
    (settings, topology, relay, minute, minute * 60_000 + 1_000)
}

/// The threshold is the whole Cassandra's: the tests that lower it take turns.
static LOWERED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tombstone_heavy_outbox_partition_stalls_neither_its_shard_nor_the_others() {
    let _turn = LOWERED.lock().await;
    let (settings, topology, relay, minute, at) = settled("relaytomb").await;
    let outbox = &relay.outbox;
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

/// Issue 56: a drain cut short. A pass deleted a page of a settled partition's entries and
/// was stopped (a kill, a broker away: fail point `relay-after-page`); the next pass and every
/// cut's outbox check read the partition from its start again, through those tombstones,
/// until Cassandra refused the read, and the rest of the backlog behind them never drained.
/// Now the floor keeps a resume position in its minute, and the next pass starts there.
/// The threshold is lowered to 500, under one page (1,000) of tombstones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_drain_cut_short_resumes_past_its_own_tombstones() {
    let _turn = LOWERED.lock().await;
    let (settings, topology, relay, minute, at) = settled("relayresume").await;
    let outbox = &relay.outbox;
    // 1,500 due entries of 15 edges that never flipped (the relay fences each edge and
    // deletes its entries unpublished: one read and one fence per edge and page).
    futures::stream::iter(0..1_500)
        .map(|i| async move {
            outbox
                .put(
                    (7, minute),
                    &format!("resume-item-{:02}", i / 100),
                    "u0",
                    &format!("{i:016x}"),
                    at,
                )
                .await
                .unwrap()
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;

    let _low = Threshold::lower(500);
    let min_age = settings.api.relay_min_age;
    fail::cfg("relay-after-page", "1*return").unwrap();
    let cut_short = relay::pass(&relay, min_age).await.unwrap();
    fail::remove("relay-after-page");
    assert_eq!(
        (cut_short.failed, cut_short.cleared),
        (1, 1_000),
        "the first page drained, then the drain stopped: {cut_short:?}"
    );
    let resume = outbox.floor_at(7).await.unwrap().unwrap();
    assert_eq!(resume.minute, minute);
    assert!(
        resume.after.is_some(),
        "the floor keeps where the drain got to"
    );

    let mut errors = Vec::new();
    for _ in 0..3 {
        match relay::pass(&relay, min_age).await {
            Ok(p) if p.failed == 0 => break,
            Ok(p) => errors.push(p.first_error.unwrap_or_default()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert!(
        outbox.floor(7).await.unwrap().unwrap() > minute,
        "the rest of the backlog never drained past the page's tombstones ({} failed passes, e.g. {:?})",
        errors.len(),
        errors.first()
    );
    drop(_low);
    common::topology::teardown(&settings, &topology).await;
}
