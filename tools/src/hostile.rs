//! `likes-tools hostile` (issue 44, item 6): what hostile clients cost a real user, in a run
//! anyone can repeat. `likes api` runs as a process with its production defaults (admission,
//! each user's share, the server's bounds) on a namespace of its own; a legitimate user writes
//! at a steady rate alone, then again while four kinds of hostile client run beside it:
//!
//! - a flood of writes with no credential, one with a forged token, and unauthenticated
//!   DELETEs (`--flooders` tasks, as fast as the API answers);
//! - one user with a valid token writing as fast as the API answers;
//! - requests with 10,000 invented methods and paths (the metric labels);
//! - slowloris connections that send a header byte a second and never finish.
//!
//! It prints, per phase, the legitimate user's writes answered 2xx and their p99, and the
//! API's RSS and `/metrics` series. The goal (the issue's): ≥ 99 % success, p99 within 2× of
//! the phase alone, RSS and series flat.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use likes::api::auth::Signer;
use likes::config::Settings;
use likes::topology::Topology;
use tokio::io::AsyncWriteExt;

use crate::bench::harness::{spawn_api, wait_ready};
use likes_testkit::procs::stop;

#[derive(clap::Args, Debug, Clone)]
pub struct HostileArgs {
    /// Seconds of each phase (alone, then under attack).
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// The legitimate user's writes a second.
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
    /// Tasks per flood (unauthenticated, forged, DELETE, one valid user).
    #[arg(long, default_value_t = 16)]
    pub flooders: usize,
    /// Slowloris connections held open.
    #[arg(long, default_value_t = 200)]
    pub slowloris: usize,
}

#[derive(Debug, Default, Clone)]
pub struct Phase {
    pub name: &'static str,
    pub sent: u64,
    pub ok: u64,
    pub p99_ms: f64,
    pub rss_mb: f64,
    pub series: usize,
    /// Requests the hostile clients got answered, by kind (0 in the phase alone).
    pub hostile: u64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub phases: Vec<Phase>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "| phase | legitimate writes | answered 2xx | p99 ms | API RSS MB | /metrics series | hostile requests answered |\n|---|---|---|---|---|---|---|"
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "| {} | {} | {:.2} % | {:.1} | {:.0} | {} | {} |",
                p.name,
                p.sent,
                100.0 * p.ok as f64 / p.sent.max(1) as f64,
                p.p99_ms,
                p.rss_mb,
                p.series,
                p.hostile
            )?;
        }
        Ok(())
    }
}

async fn series(http: &reqwest::Client, metrics: &str) -> usize {
    match http.get(format!("http://{metrics}/metrics")).send().await {
        Ok(r) => r
            .text()
            .await
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count(),
        Err(_) => 0,
    }
}

/// The legitimate user: `rate` writes a second for `seconds` (open loop: a slow answer does
/// not delay the next write), each a like or an unlike of its own item with a fresh key;
/// (sent, 2xx, p99 ms).
async fn legitimate(
    http: reqwest::Client,
    url: String,
    token: String,
    rate: f64,
    seconds: u64,
    run: u64,
) -> (u64, u64, f64) {
    let every = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tick = tokio::time::interval(every);
    let mut writes = Vec::new();
    while Instant::now() < end {
        tick.tick().await;
        let n = writes.len();
        let item = format!("legit-{run}-{n}");
        let req = http
            .post(format!("{url}/v1/items/{item}/likes"))
            .bearer_auth(&token)
            .header("Idempotency-Key", format!("legit-{run}-{n}"))
            .timeout(Duration::from_secs(10));
        writes.push(tokio::spawn(async move {
            let t = Instant::now();
            let ok = req.send().await.is_ok_and(|r| r.status().is_success());
            (ok, t.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    let (mut sent, mut ok, mut lat) = (0u64, 0u64, Vec::new());
    for w in writes {
        let (good, ms) = w.await.unwrap_or((false, f64::NAN));
        sent += 1;
        ok += u64::from(good);
        lat.push(ms);
    }
    lat.sort_by(f64::total_cmp);
    let p99 = lat
        .get((lat.len() * 99 / 100).min(lat.len().saturating_sub(1)))
        .copied()
        .unwrap_or(f64::NAN);
    (sent, ok, p99)
}

/// The hostile clients, until `stop`; the requests they got answered.
fn attack(
    http: &reqwest::Client,
    url: &str,
    addr: &str,
    signer: &Signer,
    args: &HostileArgs,
    stop: Arc<AtomicBool>,
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<AtomicU64>) {
    let answered = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let forged = Signer::new(&[7u8; 32]).sign("alice", i64::MAX / 4);
    let mallory = signer.sign("mallory", likes::runtime::clock::now_ms() / 1000 + 3600);
    for kind in 0..4 {
        for n in 0..args.flooders {
            let (http, url, stop, answered) = (
                http.clone(),
                url.to_string(),
                stop.clone(),
                answered.clone(),
            );
            let (forged, mallory) = (forged.clone(), mallory.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let like = format!("{url}/v1/items/flood-{n}/likes");
                    let key = format!("f{kind}-{n}-{i}");
                    let req = match kind {
                        0 => http.post(like),
                        1 => http.post(like).bearer_auth(&forged),
                        2 => http.delete(format!("{url}/v1/items/flood-{n}/likes/alice")),
                        _ => http
                            .post(format!("{url}/v1/items/mallory-{}/likes", i % 1000))
                            .bearer_auth(&mallory),
                    };
                    if req.header("Idempotency-Key", key).send().await.is_ok() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    // 10,000 invented methods and paths, once each.
    {
        let (http, url, stop, answered) = (
            http.clone(),
            url.to_string(),
            stop.clone(),
            answered.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for n in 0..10_000u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(m) = reqwest::Method::from_bytes(format!("M{n:05}").as_bytes()) else {
                    continue;
                };
                if http
                    .request(m, format!("{url}/odd/{n}"))
                    .send()
                    .await
                    .is_ok()
                {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Slowloris: a header byte a second, never finished; reconnects when closed.
    for _ in 0..args.slowloris {
        let (addr, stop) = (addr.to_string(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut c) = tokio::net::TcpStream::connect(&addr).await else {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                if c.write_all(b"GET /v1/items/x/count HTTP/1.1\r\nHost: a\r\n")
                    .await
                    .is_err()
                {
                    continue;
                }
                while !stop.load(Ordering::Relaxed) && c.write_all(b"x").await.is_ok() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }));
    }
    (tasks, answered)
}

pub async fn run(base: &Settings, topology: &Topology, args: &HostileArgs) -> Result<Report> {
    let stamp = likes::runtime::clock::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("hostile{stamp}.");
    settings.cql.keyspace = format!("hostile_{stamp}");
    settings.api.session_key = format!("hostile-session-key-{stamp:0>20}");
    settings.api.listen = "127.0.0.1:19490".into();
    settings.metrics.listen = "127.0.0.1:19491".into();
    settings.api.relay = false;
    likes_testkit::namespace::create(&settings, topology, true).await?;
    let dir = std::env::temp_dir().join(format!("likes-hostile-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    let mut api = spawn_api(&settings, &dir)?;
    let pid = api.child.id();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| anyhow!(format!("http client: {e}")))?;
    let url = format!("http://{}", settings.api.listen);
    wait_ready(&http, &url).await?;
    let signer = Signer::new(settings.api.session_key.as_bytes());
    let token = signer.sign("alice", stamp / 1000 + 3600);
    let mut report = Report::default();
    // Warm-up, not reported: the first writes prepare statements and open connections.
    legitimate(http.clone(), url.clone(), token.clone(), args.rate, 3, 9).await;
    for (run, name) in [(0, "alone"), (1, "under attack"), (2, "alone again")] {
        let stop_attack = Arc::new(AtomicBool::new(false));
        let (tasks, answered) = if run == 1 {
            let (t, a) = attack(
                &http,
                &url,
                &settings.api.listen,
                &signer,
                args,
                stop_attack.clone(),
            );
            (t, Some(a))
        } else {
            (Vec::new(), None)
        };
        let (sent, ok, p99_ms) = legitimate(
            http.clone(),
            url.clone(),
            token.clone(),
            args.rate,
            args.seconds,
            run,
        )
        .await;
        let phase = Phase {
            name,
            sent,
            ok,
            p99_ms,
            rss_mb: crate::bench::scrape::status_mb(pid, "VmRSS:"),
            series: series(&http, &settings.metrics.listen).await,
            hostile: answered.map_or(0, |a| a.load(Ordering::Relaxed)),
        };
        stop_attack.store(true, Ordering::Relaxed);
        for t in tasks {
            t.abort();
        }
        eprintln!("hostile: {name}: {phase:?}");
        report.phases.push(phase);
    }
    stop(&mut api);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}
