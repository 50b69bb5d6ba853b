//! `likes bench api`: like/unlike load over loopback against `likes api` (a child process on
//! the real stack), open loop at a fixed rate, next to two baselines run the same way in the
//! same run against the same Cassandra:
//!
//! - the write path called in process (the same CQL and produce, no HTTP, JSON or auth):
//!   the ratio API / in-process is the API's own overhead;
//! - a bare LWT loop (one `INSERT ... IF NOT EXISTS` per write): the ratio API / bare LWT is
//!   what the three layers of idempotency cost.
//!
//! Open loop: each request is sent at its scheduled time whatever the latency of earlier
//! ones, and latency counts from that scheduled time, so a stall shows up in the figures.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Mutex;

use super::bench::{drop_namespace, stop, StageProc};
use crate::api::{self, auth::Signer};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::{cmd, cql};

#[derive(Debug, Clone)]
pub struct ApiBenchArgs {
    pub rate: f64,
    pub seconds: u64,
    pub seed: u64,
    pub out: PathBuf,
}

/// Latency figures of one loop, milliseconds.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Latency {
    pub achieved_per_s: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct ApiBenchReport {
    pub offered_per_s: f64,
    pub seconds: u64,
    pub api: Latency,
    pub in_process: Latency,
    pub bare_lwt: Latency,
    /// API p50 / in-process p50: HTTP, JSON and auth (the median is steadier than the p99
    /// on a shared 2-core box).
    pub overhead_ratio_p50: f64,
    /// API p99 / in-process p99.
    pub overhead_ratio_p99: f64,
    /// API p99 / bare LWT p99: the whole write path against one conditional write.
    pub vs_bare_lwt_p99: f64,
}

/// One operation of the mix: (user, item, like?) with a fresh or a retried request key.
struct Mix {
    rng: StdRng,
    next_user: u64,
    liked: Vec<(u64, u32)>,
}

impl Mix {
    fn next(&mut self) -> (String, String, bool) {
        if !self.liked.is_empty() && self.rng.random_bool(0.2) {
            let j = self.rng.random_range(0..self.liked.len());
            let (u, i) = self.liked.swap_remove(j);
            return (format!("u{u}"), format!("item-{i}"), false);
        }
        self.next_user += 1;
        let item = self.rng.random_range(0..10_000u32);
        self.liked.push((self.next_user, item));
        (format!("u{}", self.next_user), format!("item-{item}"), true)
    }
}

fn figures(mut lat: Vec<f64>, errors: u64, elapsed: Duration) -> Latency {
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]
        }
    };
    Latency {
        achieved_per_s: lat.len() as f64 / elapsed.as_secs_f64(),
        errors,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        p999_ms: q(0.999),
    }
}

/// Runs `op(i)` at `rate` for `seconds`, open loop; returns the latency figures.
async fn open_loop<F, Fut>(rate: f64, seconds: u64, op: F) -> Latency
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let n = (rate * seconds as f64) as u64;
    let lat = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let fut = op(i);
        let (lat, errors) = (lat.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let ok = fut.await;
            let ms = due.elapsed().as_secs_f64() * 1000.0;
            if ok {
                lat.lock().await.push(ms);
            } else {
                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed();
    let lat = std::mem::take(&mut *lat.lock().await);
    figures(
        lat,
        errors.load(std::sync::atomic::Ordering::Relaxed),
        elapsed,
    )
}

pub async fn run(
    base: &Settings,
    topology: &Topology,
    args: &ApiBenchArgs,
) -> Result<ApiBenchReport> {
    let stamp = crate::dedupe::state::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("benchapi{stamp}.");
    settings.cql.keyspace = format!("benchapi_{stamp}");
    settings.api.session_key = format!("bench-session-key-{stamp:0>20}");
    settings.api.listen = "127.0.0.1:19480".into();
    settings.api.max_writes_in_flight = 4096;
    settings.api.max_writes_per_s = 0.0;
    settings.api.relay = false;
    let session = cql::connect(&settings.cql).await?;
    cmd::migrate::run(&session, &settings.cql).await?;
    cmd::topics::run(&settings, topology).await?;
    let dir = std::env::temp_dir().join(format!("likes-benchapi-{stamp}"));
    std::fs::create_dir_all(&dir).map_err(|e| Error::State(e.to_string()))?;
    let mut report = ApiBenchReport {
        offered_per_s: args.rate,
        seconds: args.seconds,
        ..Default::default()
    };

    // 1. Bare LWT loop.
    let bare = Arc::new(
        session
            .prepare(format!(
                "INSERT INTO {}.edges (item_id, bucket, user_id, state, op_id, updated_at, epoch) \
                 VALUES (?, 0, ?, 1, 1, toTimestamp(now()), 0) IF NOT EXISTS",
                settings.cql.keyspace
            ))
            .await
            .map_err(|e| Error::Schema(format!("prepare the bare LWT: {e}")))?,
    );
    report.bare_lwt = open_loop(args.rate, args.seconds, |i| {
        let (s, st) = (session.clone(), bare.clone());
        async move {
            s.execute_unpaged(&st, (format!("bare-{}", i % 10_000), format!("b{i}")))
                .await
                .is_ok()
        }
    })
    .await;
    eprintln!("bench api: bare LWT {:?}", report.bare_lwt);

    // 2. The write path in process.
    let app = api::App::connect(&settings, topology).await?;
    let mix = Arc::new(Mutex::new(Mix {
        rng: StdRng::seed_from_u64(args.seed),
        next_user: 0,
        liked: Vec::new(),
    }));
    report.in_process = open_loop(args.rate, args.seconds, |i| {
        let (app, mix) = (app.clone(), mix.clone());
        async move {
            let (user, item, like) = mix.lock().await.next();
            let user = format!("p{user}");
            api::write::write(&app, &user, &item, like, &format!("k{i}"))
                .await
                .is_ok()
        }
    })
    .await;
    eprintln!("bench api: in process {:?}", report.in_process);

    // 3. The API over loopback, as a child process.
    let mut child = spawn_api(&settings, &dir)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| Error::Config(format!("http client: {e}")))?;
    let url = format!("http://{}", settings.api.listen);
    wait_ready(&http, &url).await?;
    let signer = Arc::new(Signer::new(settings.api.session_key.as_bytes()));
    let expires = stamp / 1000 + 3600;
    report.api = open_loop(args.rate, args.seconds, |i| {
        let (http, mix, url, signer) = (http.clone(), mix.clone(), url.clone(), signer.clone());
        async move {
            let (user, item, like) = mix.lock().await.next();
            let token = signer.sign(&user, expires);
            let req = if like {
                http.post(format!("{url}/v1/items/{item}/likes"))
            } else {
                http.delete(format!("{url}/v1/items/{item}/likes/{user}"))
            };
            match req
                .bearer_auth(token)
                .header("Idempotency-Key", format!("h{i}"))
                .send()
                .await
            {
                Ok(r) => r.status().is_success(),
                Err(_) => false,
            }
        }
    })
    .await;
    eprintln!("bench api: api {:?}", report.api);
    stop(&mut child);

    report.overhead_ratio_p50 = report.api.p50_ms / report.in_process.p50_ms;
    report.overhead_ratio_p99 = report.api.p99_ms / report.in_process.p99_ms;
    report.vs_bare_lwt_p99 = report.api.p99_ms / report.bare_lwt.p99_ms;
    drop_namespace(&session, &settings, topology).await?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&args.out).map_err(|e| Error::State(e.to_string()))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| Error::State(e.to_string()))?;
    let path = args.out.join(format!("api-{stamp}.json"));
    std::fs::write(&path, json).map_err(|e| Error::State(e.to_string()))?;
    eprintln!("bench api: report written to {}", path.display());
    Ok(report)
}

fn spawn_api(settings: &Settings, dir: &std::path::Path) -> Result<StageProc> {
    let exe = std::env::current_exe().map_err(|e| Error::Config(e.to_string()))?;
    let log =
        std::fs::File::create(dir.join("api.log")).map_err(|e| Error::State(e.to_string()))?;
    let a = &settings.api;
    let child = Command::new(exe)
        .arg("api")
        .env("LIKES__CQL__KEYSPACE", &settings.cql.keyspace)
        .env("LIKES__KAFKA__TOPIC_PREFIX", &settings.kafka.topic_prefix)
        .env("LIKES__API__LISTEN", &a.listen)
        .env("LIKES__API__SESSION_KEY", &a.session_key)
        .env(
            "LIKES__API__MAX_WRITES_IN_FLIGHT",
            a.max_writes_in_flight.to_string(),
        )
        .env(
            "LIKES__API__MAX_WRITES_PER_S",
            a.max_writes_per_s.to_string(),
        )
        .env("LIKES__API__RELAY", "false")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| Error::State(e.to_string()))?)
        .stderr(log)
        .spawn()
        .map_err(|e| Error::Config(format!("spawn api: {e}")))?;
    Ok(StageProc { child, port: 0 })
}

async fn wait_ready(http: &reqwest::Client, url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(
                Duration::from_secs(60),
                "likes api ready".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl std::fmt::Display for ApiBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| loop at {:.0} writes/s offered, {} s | achieved/s | errors | p50 ms | p99 ms | p999 ms |", self.offered_per_s, self.seconds)?;
        writeln!(f, "|---|---|---|---|---|---|")?;
        for (name, l) in [
            ("API over loopback", &self.api),
            ("write path in process", &self.in_process),
            ("bare LWT", &self.bare_lwt),
        ] {
            writeln!(
                f,
                "| {name} | {:.0} | {} | {:.1} | {:.1} | {:.1} |",
                l.achieved_per_s, l.errors, l.p50_ms, l.p99_ms, l.p999_ms
            )?;
        }
        write!(
            f,
            "\noverhead ratio API / in-process: p50 {:.2}, p99 {:.2}; API / bare LWT (p99): {:.2}",
            self.overhead_ratio_p50, self.overhead_ratio_p99, self.vs_bare_lwt_p99
        )
    }
}
