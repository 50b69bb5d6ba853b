//! What every benchmark and the load generator share (issue 47: these lived inside one
//! benchmark's file each, and the benchmarks imported each other for them): the API client
//! and its open loops, quantiles, the processes a benchmark starts (the API, the stages) and
//! their metrics ports, and the stack's own pids. No benchmark is imported here; each
//! benchmark's run returns its results, and only the report renders them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde::Serialize;
use tokio::sync::Mutex;

use super::scrape::{buckets, cpu_seconds, diff, quantile, scrape};
use likes::api::auth::Signer;
use likes::config::Settings;
use likes::runtime::metrics as m;
use likes_testkit::procs::{self, Proc};

/// Latency figures of one loop, milliseconds.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Latency {
    pub offered_per_s: f64,
    pub achieved_per_s: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Cassandra's CPU milliseconds per completed write during the loop (NaN when its pid
    /// file is not found).
    pub cassandra_cpu_ms: f64,
}

fn figures(mut lat: Vec<f64>, errors: u64, elapsed: Duration, offered: f64) -> Latency {
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| quantile_of(&lat, p);
    Latency {
        offered_per_s: offered,
        achieved_per_s: lat.len() as f64 / elapsed.as_secs_f64(),
        errors,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        p999_ms: q(0.999),
        cassandra_cpu_ms: f64::NAN,
    }
}

/// Runs `op(i)` at `rate` for `seconds`, open loop; returns the latency figures.
pub(crate) async fn open_loop<F, Fut>(rate: f64, seconds: u64, op: F) -> Latency
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let cassandra = cassandra_pid();
    let cpu_before = cassandra.map(cpu_seconds);
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
    let done = lat.len().max(1) as f64;
    let mut l = figures(
        lat,
        errors.load(std::sync::atomic::Ordering::Relaxed),
        elapsed,
        rate,
    );
    l.cassandra_cpu_ms = match (cassandra, cpu_before) {
        (Some(pid), Some(before)) => (cpu_seconds(pid) - before) * 1000.0 / done,
        _ => f64::NAN,
    };
    l
}

/// The Cassandra that `make up` started, from its pid file (as stack/stack.sh places it).
pub(crate) fn cassandra_pid() -> Option<u32> {
    stack_pid("cassandra")
}

/// A process `make up` started (`cassandra`, `kafka`), from its pid file.
pub(crate) fn stack_pid(name: &str) -> Option<u32> {
    let path = likes_testkit::stack::dir().join(format!("{name}.pid"));
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Starts `likes api` in the bench's namespace, without the relay (the bench measures
/// the write path alone).
pub(crate) fn spawn_api(settings: &Settings, dir: &std::path::Path) -> Result<Proc> {
    spawn_api_bin(settings, dir, &procs::likes_bin()?, "api", &[])
}

/// [`spawn_api`] of the `likes` binary at `bin`, logging to `<dir>/<name>.log`.
pub(crate) fn spawn_api_bin(
    settings: &Settings,
    dir: &std::path::Path,
    bin: &std::path::Path,
    name: &'static str,
    extra_env: &[(String, String)],
) -> Result<Proc> {
    let a = &settings.api;
    let env = procs::env_in(
        &settings.cql.keyspace,
        &settings.kafka.topic_prefix,
        [
            ("LIKES__API__LISTEN", a.listen.clone()),
            ("LIKES__API__SESSION_KEY", a.session_key.clone()),
            (
                "LIKES__API__MAX_WRITES_IN_FLIGHT",
                a.max_writes_in_flight.to_string(),
            ),
            (
                "LIKES__API__WRITE_LATENCY_TARGET",
                humantime::format_duration(a.write_latency_target).to_string(),
            ),
            (
                "LIKES__API__MAX_WRITES_PER_S",
                a.max_writes_per_s.to_string(),
            ),
            ("LIKES__API__RELAY", "false".to_string()),
            // Off unless the bench set it (`bench overload` scrapes the API).
            ("LIKES__METRICS__LISTEN", settings.metrics.listen.clone()),
            ("RUST_LOG", "warn".to_string()),
        ],
    );
    let mut env = env;
    // Set only when it is not the default, so a `likes` from before each user's share
    // (LIKES_BIN, for a before/after run of `likes-tools hostile`) still starts: its config
    // refuses keys it does not know.
    let default = Settings::defaults()?.api.max_writes_per_user_per_s;
    if a.max_writes_per_user_per_s != default {
        env.push((
            "LIKES__API__MAX_WRITES_PER_USER_PER_S".into(),
            a.max_writes_per_user_per_s.to_string(),
        ));
    }
    env.extend(extra_env.iter().cloned());
    procs::spawn_bin_attached(bin, "api", name, dir, &env)
}

pub(super) const API_METRICS_PORT: u16 = 19482;

pub(super) const SLO_P99_MS: f64 = 150.0;

/// What one open-loop run saw, milliseconds from each request's scheduled time.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) ok: Vec<f64>,
    pub(super) shed: Vec<f64>,
    pub(super) errors: u64,
}

/// The server's histogram of admitted writes from its creation on.
pub(super) struct Since(Vec<(f64, f64)>);

pub(super) fn quantile_since() -> Since {
    Since(buckets(
        &scrape(API_METRICS_PORT),
        m::API_ADMITTED_WRITE_SECONDS,
    ))
}

impl Since {
    /// The p99 (seconds) of the writes admitted since, and the limit now.
    pub(super) fn p99_and_limit(&self) -> (f64, f64) {
        let metrics = scrape(API_METRICS_PORT);
        let server = diff(&buckets(&metrics, m::API_ADMITTED_WRITE_SECONDS), &self.0);
        let limit = metrics.get(m::API_WRITE_LIMIT).copied().unwrap_or(f64::NAN);
        (quantile(&server, 0.99), limit)
    }
}

/// The `q` quantile of `sorted` (nearest rank below; NaN when empty): every benchmark's.
pub(crate) fn quantile_of(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// The p99 of `v` (sorted in place).
pub(super) fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile_of(v, 0.99)
}

pub(super) struct Client {
    pub(super) http: reqwest::Client,
    pub(super) url: String,
    pub(super) signer: Arc<Signer>,
    pub(super) expires: i64,
}

impl Client {
    /// Likes of fresh edges at `rate` for `seconds`, open loop.
    pub(super) async fn writes(&self, tag: &str, rate: f64, seconds: u64) -> Seen {
        let n = (rate * seconds as f64) as u64;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(n as usize);
        for i in 0..n {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            let user = format!("o{tag}-{i}");
            let token = self.signer.sign(&user, self.expires);
            let req = self
                .http
                .post(format!("{}/v1/items/item-{}/likes", self.url, i % 10_000))
                .bearer_auth(token)
                .header("Idempotency-Key", format!("o{tag}-{i}"));
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                let status = req.send().await.map(|r| r.status().as_u16());
                let ms = due.elapsed().as_secs_f64() * 1000.0;
                let mut s = seen.lock().await;
                match status {
                    Ok(200..=299) => s.ok.push(ms),
                    Ok(503) => s.shed.push(ms),
                    _ => s.errors += 1,
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let out = std::mem::take(&mut *seen.lock().await);
        out
    }

    /// Count reads at `rate` until `stop`; returns their latencies (errors count as 30 s).
    pub(super) async fn reads(&self, rate: f64, stop: Arc<AtomicU64>) -> Vec<f64> {
        let started = Instant::now();
        let token = self.signer.sign("reader", self.expires);
        let mut tasks = Vec::new();
        for i in 0.. {
            if stop.load(Ordering::Relaxed) == 1 {
                break;
            }
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            let req = self
                .http
                .get(format!("{}/v1/items/item-{}/count", self.url, i % 10_000))
                .bearer_auth(&token);
            tasks.push(tokio::spawn(async move {
                match req.send().await {
                    Ok(r) if r.status().is_success() => due.elapsed().as_secs_f64() * 1000.0,
                    _ => 30_000.0,
                }
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(ms) = t.await {
                out.push(ms);
            }
        }
        out
    }

    /// Reads alone for `seconds`.
    pub(super) async fn reads_for(&self, rate: f64, seconds: u64) -> Vec<f64> {
        let stop = Arc::new(AtomicU64::new(0));
        let s = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            s.store(1, Ordering::Relaxed);
        });
        self.reads(rate, stop).await
    }
}

/// `likes api` with the write path's own bound (4,096 in flight, the adaptive limit off), or
/// with the product's admission.
pub(super) fn spawn_api_admitted(
    settings: &Settings,
    dir: &std::path::Path,
    adaptive: bool,
) -> Result<Proc> {
    let mut settings = settings.clone();
    // As deployed: the product's own bound and target (`config/default.toml`).
    let (max, target) = if adaptive {
        let d = Settings::defaults()?.api;
        (d.max_writes_in_flight, d.write_latency_target)
    } else {
        (4096, Duration::ZERO)
    };
    settings.api.max_writes_in_flight = max;
    settings.api.write_latency_target = target;
    settings.api.max_writes_per_s = 0.0;
    settings.api.max_writes_per_user_per_s = 0.0;
    settings.metrics.listen = format!("127.0.0.1:{API_METRICS_PORT}");
    spawn_api(&settings, dir)
}

/// The highest rate sustained within the SLO: up by half until a step fails, then one
/// bisection step (a failed first step halves the rate, down to 25 writes/s).
pub(super) async fn capacity(client: &Client, tag: &str, step_seconds: u64) -> f64 {
    let sustained = |s: &mut Seen, rate: f64| {
        let done = s.ok.len() as f64;
        p99(&mut s.ok) < SLO_P99_MS
            && (s.errors + s.shed.len() as u64) as f64 <= 0.01 * done.max(1.0)
            && done / step_seconds as f64 >= 0.9 * rate
    };
    let (mut best, mut rate, mut failed) = (0.0, 200.0, None);
    for step in 0.. {
        let mut s = client
            .writes(&format!("{tag}c{step}"), rate, step_seconds)
            .await;
        let ok = sustained(&mut s, rate);
        eprintln!(
            "bench overload: capacity step {rate:.0}/s: {} ({} ok, p99 {:.0} ms, {} shed, {} errors)",
            if ok { "sustained" } else { "not sustained" },
            s.ok.len(),
            p99(&mut s.ok),
            s.shed.len(),
            s.errors
        );
        if !ok && best == 0.0 && rate > 25.0 {
            // The first step failed: a busy moment of this shared box, or a smaller one.
            // Down by half, not give up: one bad step must not fail the whole report.
            rate /= 2.0;
            continue;
        }
        if !ok {
            failed = Some(rate);
            break;
        }
        best = rate;
        rate *= 1.5;
    }
    if let Some(fail) = failed.filter(|_| best > 0.0) {
        let mid: f64 = (best * fail).sqrt();
        let mut s = client.writes(&format!("{tag}cm"), mid, step_seconds).await;
        if sustained(&mut s, mid) {
            best = mid;
        }
    }
    best
}

/// The stages' metrics ports during a run.
pub(super) const DEDUPE_PORT: u16 = 19_464;

pub(super) const COUNT_PORT: u16 = 19_465;

/// Starts a stage of a benchmark in the bench's own namespace, its metrics on `port`.
pub(crate) fn spawn_stage(
    stage: &'static str,
    settings: &Settings,
    port: u16,
    dir: &std::path::Path,
) -> Result<Proc> {
    let env = procs::env_in(
        &settings.cql.keyspace,
        &settings.kafka.topic_prefix,
        [
            (
                "LIKES__DEDUPE__STATE_DIR",
                settings.dedupe.state_dir.display().to_string(),
            ),
            (
                "LIKES__DEDUPE__INSTANCE_ID",
                settings.dedupe.instance_id.clone(),
            ),
            ("LIKES__METRICS__LISTEN", format!("127.0.0.1:{port}")),
            (
                "LIKES__TOPOLOGY__PATH",
                dir.join("topology.toml").display().to_string(),
            ),
            // Stage 1's start phases are an info line (the recovery bench prints it).
            ("RUST_LOG", "warn,likes::dedupe=info".to_string()),
        ],
    );
    procs::spawn_attached(stage, stage, dir, &env)
}

pub(crate) async fn wait_ready(http: &reqwest::Client, url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(anyhow!("likes api ready: timed out after 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
