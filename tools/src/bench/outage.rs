//! The API's writes through a broker outage (issue 26: Kafka down must not mean writes
//! down), a part of `likes-tools bench overload`'s rounds.
//!
//! Likes of fresh edges at a steady rate, open loop: the stack's broker is killed with
//! kill -9 after [`BEFORE`] and started again by `stack/stack.sh up` after [`DOWN`] (the
//! outage lasts until that start returns); the writes go on for [`AFTER`] past it. Each write's scheduled time puts it in one of the three
//! stretches. Once a write's flip has applied, it is answered without waiting for the broker
//! (docs/architecture.md, the write path); with the broker away its event stays in the outbox
//! for the relay. So during the outage writes are answered as before; only the count lags.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde::Serialize;
use tokio::sync::Mutex;

use super::harness::Client;

/// Writes before the kill, while the broker is down, after it is back.
pub const BEFORE: Duration = Duration::from_secs(15);
pub const DOWN: Duration = Duration::from_secs(30);
pub const AFTER: Duration = Duration::from_secs(15);

/// One stretch of the run: the writes scheduled in it and how they fared.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Stretch {
    pub writes: u64,
    pub ok: u64,
    /// ok / writes.
    pub availability: f64,
    /// Of the writes answered 2xx, from the scheduled send.
    pub ok_p99_ms: f64,
}

/// What a run saw.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Outage {
    pub rate_per_s: f64,
    /// From the kill to the stack's start returning (the broker serving again), seconds.
    pub down_s: f64,
    /// Of which the broker's start (a JVM loading its partitions: on this 2-core box it takes
    /// CPU from Cassandra and the API, which a broker on its own machines would not).
    pub starting_s: f64,
    pub before: Stretch,
    /// From the kill to the start of the broker's start.
    pub during: Stretch,
    /// While the broker starts.
    pub starting: Stretch,
    pub after: Stretch,
    /// Per 5 s of the run (by scheduled send): answers by status (0: no answer in 10 s).
    pub timeline: Vec<std::collections::BTreeMap<u16, u64>>,
}

/// Runs the writes at `rate` around a broker outage; the broker is up again when it returns
/// (or the error says why not).
pub(super) async fn broker(client: &Client, tag: &str, rate: f64) -> Result<Outage> {
    let stack_dir = likes_testkit::stack::dir();
    let script = likes_testkit::stack::script();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    // The writes go on until AFTER past the broker's return (ms since `started`).
    let until_ms = AtomicU64::new(u64::MAX);
    let writes = async {
        let mut tasks = Vec::new();
        for i in 0.. {
            let at = Duration::from_secs_f64(i as f64 / rate);
            if at.as_millis() as u64 >= until_ms.load(Ordering::Relaxed) {
                break;
            }
            let due = started + at;
            tokio::time::sleep_until(due.into()).await;
            let user = format!("k{tag}-{i}");
            let req = client
                .http
                .post(format!("{}/v1/items/item-{}/likes", client.url, i % 10_000))
                .bearer_auth(client.signer.sign(&user, client.expires))
                .header("Idempotency-Key", user.clone())
                // A write the API holds longer than this is as good as lost to its user.
                .timeout(Duration::from_secs(10));
            let answers = answers.clone();
            tasks.push(tokio::spawn(async move {
                let status = req.send().await.map_or(0, |r| r.status().as_u16());
                let ms = due.elapsed().as_secs_f64() * 1000.0;
                answers.lock().await.push((at.as_secs_f64(), status, ms));
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    };
    let up = || {
        let script = script.clone();
        async move {
            tokio::task::spawn_blocking(move || likes_testkit::stack::up(&script))
                .await?
                .map_err(|e| anyhow!(e))
        }
    };
    let outage = async {
        let run = async {
            tokio::time::sleep(BEFORE).await;
            // Before the kill: writes sent while the broker dies are the outage's.
            let killed = started.elapsed();
            let dir = stack_dir.clone();
            tokio::task::spawn_blocking(move || likes_testkit::stack::kill9(&dir, "kafka"))
                .await?
                .map_err(|e| anyhow!(e))?;
            eprintln!("bench overload: broker killed (kill -9); back in {DOWN:?}");
            tokio::time::sleep(DOWN).await;
            let starting = started.elapsed();
            if let Err(e) = up().await {
                eprintln!("bench overload: the broker did not start ({e}); once more");
                up().await?;
            }
            Ok::<_, anyhow::Error>((killed, starting, started.elapsed()))
        };
        let r = run.await;
        // The writes go on AFTER past the broker's return; a failed outage ends them now.
        let end = match &r {
            Ok((_, _, back)) => *back + AFTER,
            Err(_) => started.elapsed(),
        };
        until_ms.store(end.as_millis() as u64, Ordering::Relaxed);
        r
    };
    let ((), times) = tokio::join!(writes, outage);
    let (killed, starting, back) = times?;
    let answers = answers.lock().await;
    let stretch = |from: Duration, to: Duration| {
        let within: Vec<_> = answers
            .iter()
            .filter(|a| a.0 >= from.as_secs_f64() && a.0 < to.as_secs_f64())
            .collect();
        let mut ok: Vec<f64> = within
            .iter()
            .filter(|a| (200..300).contains(&a.1))
            .map(|a| a.2)
            .collect();
        Stretch {
            writes: within.len() as u64,
            ok: ok.len() as u64,
            availability: if within.is_empty() {
                f64::NAN
            } else {
                ok.len() as f64 / within.len() as f64
            },
            ok_p99_ms: super::harness::p99(&mut ok),
        }
    };
    let mut timeline: Vec<std::collections::BTreeMap<u16, u64>> = Vec::new();
    for a in answers.iter() {
        let k = (a.0 / 5.0) as usize;
        if timeline.len() <= k {
            timeline.resize_with(k + 1, Default::default);
        }
        *timeline[k].entry(a.1).or_insert(0) += 1;
    }
    let o = Outage {
        rate_per_s: rate,
        down_s: (back - killed).as_secs_f64(),
        starting_s: (back - starting).as_secs_f64(),
        before: stretch(Duration::ZERO, killed),
        during: stretch(killed, starting),
        starting: stretch(starting, back),
        after: stretch(back, back + AFTER),
        timeline,
    };
    eprintln!(
        "bench overload: broker down {:.0} s at {rate:.0} writes/s: answered 2xx {:.1} % (p99 {:.0} ms), while it started ({:.0} s) {:.1} % (p99 {:.0} ms); before {:.1} % (p99 {:.0} ms), after {:.1} % (p99 {:.0} ms)",
        o.down_s,
        o.during.availability * 100.0,
        o.during.ok_p99_ms,
        o.starting_s,
        o.starting.availability * 100.0,
        o.starting.ok_p99_ms,
        o.before.availability * 100.0,
        o.before.ok_p99_ms,
        o.after.availability * 100.0,
        o.after.ok_p99_ms
    );
    let line: Vec<String> = o
        .timeline
        .iter()
        .enumerate()
        .map(|(k, m)| format!("{}s {m:?}", k * 5))
        .collect();
    eprintln!(
        "bench overload: answers by status per 5 s: {}",
        line.join("; ")
    );
    Ok(o)
}
