//! Crashes at the moments a signal cannot hit reliably, through fail points (build with
//! `--features failpoints`; `make test` does): after stage 1's Kafka commit and before its
//! state write, after its transaction is built and before the commit, and after stage 2's
//! counter writes and before its offset commit. Each time the stage dies, restarts and the
//! counts still equal the ground truth, with no (item, window) applied twice.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::procs;
use common::topology as fx;

/// How long a phase waits for the counts to reach the truth: a count above it never comes
/// down, so a short wait decides.
const SETTLE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn crashes_at_the_narrow_moments_never_change_the_counts() {
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("failpoints").await;

    let script = fx::script(5, 20, 40, 5);
    let want = fx::nonzero(&script.truth);
    let points = [
        ("dedupe", "dedupe-after-commit"),
        ("dedupe", "dedupe-before-commit"),
        ("count", "count-after-sink-before-commit"),
    ];
    let chunks: Vec<_> = script
        .records
        .chunks(script.records.len() / points.len() + 1)
        .collect();
    // dedupe is the first target and starts inside the loop, armed.
    count.start();
    for (chunk, (stage, point)) in chunks.iter().zip(points) {
        let target = if stage == "dedupe" {
            &mut dedupe
        } else {
            &mut count
        };
        if target.starts > 0 {
            target.stop();
        }
        target.start_with(&[("FAILPOINTS", &format!("{point}=panic"))]);
        fx::produce(&settings, &topology, chunk).await;
        assert!(
            target.wait_exit(Duration::from_secs(60)),
            "{point} never fired; log:\n{}",
            target.tail()
        );
        target.start();
    }

    let have = procs::drain(&mut dedupe, &mut count, &settings, &want).await;
    assert_eq!(
        have, want,
        "counts must equal the ground truth after every fail point"
    );
    procs::assert_audit(&audit, &want);
    // Every first start restores (0 records); the crash after the commit must have restored
    // real records, from the changelog the crashed transaction wrote.
    let log = std::fs::read_to_string(dir.join("dedupe.log")).unwrap();
    let restored: u64 = log
        .lines()
        .filter(|l| l.contains("restored from the changelog"))
        .filter_map(|l| {
            let n = l.split("restored=").nth(1)?;
            n.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    assert!(
        restored > 0,
        "the crash after the commit must have been recovered from the changelog (records > 0)"
    );
    fx::teardown(&settings, &topology).await;
}

/// Issue 45, item 4: a conditional batch whose answer is lost (as a timeout loses it, after
/// the batch applied) is sent again in place. The fence makes the resend safe: it meets the
/// row its first send wrote and its windows bounce off. Before, the error started stage 2 over
/// from its last commit, after a 1-10 s backoff, once per lost answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_lost_answer_is_sent_again_in_place_not_by_a_restart() {
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("resend").await;
    let script = fx::script(6, 20, 40, 5);
    let want = fx::nonzero(&script.truth);
    dedupe.start();
    // One shard's batch at a time, so the three lost answers are one batch's: its first send
    // and two resends (the audit must still read it as applied once).
    count.start_with(&[
        ("FAILPOINTS", "count-sink-answer-lost=3*return"),
        ("LIKES__COUNT__MAX_IN_FLIGHT", "1"),
    ]);
    fx::produce(&settings, &topology, &script.records).await;
    let have = procs::drain(&mut dedupe, &mut count, &settings, &want).await;
    assert_eq!(have, want, "counts must equal the ground truth");
    procs::assert_audit(&audit, &want);
    let log = std::fs::read_to_string(dir.join("count.log")).unwrap();
    assert!(
        !log.contains("starting it over"),
        "a lost answer must not restart the stage; log:\n{}",
        count.tail()
    );
    assert_eq!(
        log.matches("conditional batch unanswered; sending it again")
            .count(),
        3,
        "each of the three lost answers is resent once; log:\n{}",
        count.tail()
    );
    assert_eq!(count.starts, 1);
    fx::teardown(&settings, &topology).await;
}

/// Issue 23, item 4: a window change after stage 2 died between its counter writes and its
/// offset commit. The windows it applied were cut on the old grid; the next process re-reads
/// their records, and a window of the new length that straddles an applied one would add
/// them again. Twice: on partitions stage 2 had never committed (250 ms → 1 s), and on
/// partitions committed with a length (1 s → 1.5 s, a length the old does not divide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_window_change_after_a_crash_before_the_commit_applies_nothing_twice() {
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("windowchange").await;
    let env = common::env_for(&settings);
    let with_window = |ms: u64| {
        let t = topology
            .clone()
            .with_window(Duration::from_millis(ms))
            .unwrap();
        let path = dir.join(format!("topology-{ms}.toml"));
        std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
        let mut env = env.clone();
        env.push(("LIKES__TOPOLOGY__PATH", path.display().to_string()));
        let (ok, out, err) = common::likes(&["migrate", "--accept-window-change"], &env);
        assert!(ok, "migrate to a {ms} ms window failed:\n{out}\n{err}");
        ("LIKES__TOPOLOGY__PATH", path.display().to_string())
    };
    let base_ms = likes::runtime::clock::now_ms() - 60_000;
    let chunks: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, u)| fx::script_of(40 + i as u64, 8, 30, 5, ("item", u), base_ms))
        .collect();
    let mut want = BTreeMap::new();
    let mut settle = |i: usize| {
        for (item, n) in &chunks[i].truth {
            *want.entry(item.clone()).or_insert(0) += n;
        }
        fx::nonzero(&want)
    };
    dedupe.start();

    // Stage 1 turns the chunk into deltas; stage 2 then dies after its first counter write,
    // before the offset commit.
    let crash_after_write = |count: &mut procs::Stage, window: &(&str, String)| {
        count.start_with(&[
            (window.0, &window.1),
            ("FAILPOINTS", "count-after-sink-before-commit=panic"),
        ]);
        assert!(
            count.wait_exit(Duration::from_secs(60)),
            "the fail point never fired; log:\n{}",
            count.tail()
        );
    };

    // A: 250 ms windows, killed after its first write, before any commit.
    let w250 = with_window(250);
    fx::produce(&settings, &topology, &chunks[0].records).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    crash_after_write(&mut count, &w250);

    // B: 1 s windows, up to date, then a clean stop (commits carry the 1 s length).
    let w1000 = with_window(1000);
    count.start_with(&[(w1000.0, &w1000.1)]);
    fx::produce(&settings, &topology, &chunks[1].records).await;
    settle(0);
    let want_ab = settle(1);
    let have = procs::settle(&mut dedupe, &mut count, &settings, &want_ab, SETTLE).await;
    assert_eq!(
        have, want_ab,
        "250 ms → 1 s after a crash on partitions never committed: counts must equal the truth"
    );
    count.stop();

    // C: 1 s windows again, killed after a write, before its commit.
    fx::produce(&settings, &topology, &chunks[2].records).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    crash_after_write(&mut count, &w1000);

    // D: 1.5 s windows, which straddle the 1 s ones.
    let w1500 = with_window(1500);
    count.start_with(&[(w1500.0, &w1500.1)]);
    fx::produce(&settings, &topology, &chunks[3].records).await;
    settle(2);
    let want_all = settle(3);
    let have = procs::settle(&mut dedupe, &mut count, &settings, &want_all, SETTLE).await;
    assert_eq!(
        have, want_all,
        "1 s → 1.5 s after a crash on committed partitions: counts must equal the truth"
    );
    dedupe.stop();
    count.stop();
    procs::assert_audit(&audit, &want_all);
    fx::teardown(&settings, &topology).await;
}

/// Issue 23, item 5: a restore killed midway resumes where it stopped instead of at offset
/// 0, and the state it ends with is whole: every event produced again afterwards is a
/// duplicate, and the counts do not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
async fn a_restore_killed_midway_resumes_where_it_stopped() {
    let procs::Harness {
        settings,
        topology,
        dir,
        audit,
        mut dedupe,
        mut count,
        ..
    } = procs::harness("restoreresume").await;
    // The restore records its position in each batch and when a partition reaches its end;
    // the fail point stops it after the first such write.
    let script = fx::script(7, 20, 60, 4);
    let want = fx::nonzero(&script.truth);
    dedupe.start();
    count.start();
    fx::produce(&settings, &topology, &script.records).await;
    let have = procs::settle(&mut dedupe, &mut count, &settings, &want, SETTLE).await;
    assert_eq!(have, want);
    dedupe.stop();

    // A new disk, and a restore killed after its first write.
    std::fs::remove_dir_all(&settings.dedupe.state_dir).unwrap();
    dedupe.start_with(&[("FAILPOINTS", "dedupe-restore-after-batch=return")]);
    assert!(
        dedupe.wait_exit(Duration::from_secs(120)),
        "the restore never reached its first batch; log:\n{}",
        dedupe.tail()
    );
    dedupe.start();
    fx::produce(&settings, &topology, &script.records).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let have = procs::settle(&mut dedupe, &mut count, &settings, &want, SETTLE).await;
    assert_eq!(
        have, want,
        "after the resumed restore every event is a duplicate: the counts must not move"
    );
    dedupe.stop();
    count.stop();
    let log = std::fs::read_to_string(dir.join("dedupe.log")).unwrap();
    let last_start = log.rfind("dedupe started").unwrap_or(0);
    let resumed = log[last_start..]
        .lines()
        .filter(|l| l.contains("restoring from the changelog") && l.contains("start=Offset("))
        .count();
    assert!(
        resumed > 0,
        "the second restore must resume at the first one's position:\n{}",
        &log[last_start..]
    );
    procs::assert_audit(&audit, &want);
    fx::teardown(&settings, &topology).await;
}
