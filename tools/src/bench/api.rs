//! `likes-tools bench api`: like/unlike load over loopback against `likes api` (a child process on
//! the real stack), open loop at a fixed rate, next to three baselines run the same way,
//! interleaved in each round, against the same Cassandra:
//!
//! - the write path called in process (the same CQL and produce, no HTTP, JSON or auth):
//!   the ratio API / in-process is the API's own overhead;
//! - a bare LWT loop (one `INSERT ... IF NOT EXISTS` per write): the one Paxos round every
//!   write needs by DESIGN.md, and nothing else.
//!
//! Open loop: each request is sent at its scheduled time whatever the latency of earlier
//! ones, and latency counts from that scheduled time, so a stall shows up in the figures.
//! Cassandra's CPU time per completed write is read from /proc for each loop: on a shared
//! 2-core box it says where the capacity goes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Mutex;

use super::scrape::cpu_seconds;
use crate::procs::{self, stop, Proc};
use anyhow::{anyhow, Result};
use likes::api::{self, auth::Signer};
use likes::config::Settings;
use likes::topology::Topology;

/// Knobs of `likes-tools bench api`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiBenchArgs {
    /// Offered writes a second.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Seconds per loop.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Rounds of all loops, interleaved; the report gives medians and min–max.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

impl ApiBenchArgs {
    pub fn check(&self) -> Result<()> {
        if self.rate.is_nan() || self.rate <= 0.0 || self.seconds == 0 || self.rounds == 0 {
            anyhow::bail!("--rate, --seconds and --rounds must be above 0");
        }
        Ok(())
    }
}

/// Latency figures of one loop, milliseconds.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Latency {
    pub achieved_per_s: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Cassandra's CPU milliseconds per completed write during the loop (NaN when its pid
    /// file is not found).
    pub cassandra_cpu_ms: f64,
}

/// One round: each loop once.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Round {
    pub api: Latency,
    pub in_process: Latency,
    pub bare_lwt: Latency,
}

/// The loops, in the order a round runs them, with their names in the report.
const LOOPS: [&str; 3] = ["API over loopback", "write path in process", "bare LWT"];

impl Round {
    fn loops(&self) -> [&Latency; 3] {
        [&self.api, &self.in_process, &self.bare_lwt]
    }
}

#[derive(Debug, Default, Serialize)]
pub struct ApiBenchReport {
    pub offered_per_s: f64,
    pub seconds: u64,
    pub rounds: Vec<Round>,
    /// Each figure's median over the rounds.
    pub median: Round,
    /// API p50 / in-process p50 (medians): HTTP, JSON and auth.
    pub overhead_ratio_p50: f64,
    /// API p99 / bare LWT p99 (medians).
    pub vs_bare_lwt_p99: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn spread(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    })
}

impl ApiBenchReport {
    fn summarize(&mut self) {
        let pick = |f: fn(&Round) -> &Latency| {
            let of = |g: fn(&Latency) -> f64| median(self.rounds.iter().map(|r| g(f(r))).collect());
            Latency {
                achieved_per_s: of(|l| l.achieved_per_s),
                errors: of(|l| l.errors as f64) as u64,
                p50_ms: of(|l| l.p50_ms),
                p99_ms: of(|l| l.p99_ms),
                p999_ms: of(|l| l.p999_ms),
                cassandra_cpu_ms: of(|l| l.cassandra_cpu_ms),
            }
        };
        self.median = Round {
            api: pick(|r| &r.api),
            in_process: pick(|r| &r.in_process),
            bare_lwt: pick(|r| &r.bare_lwt),
        };
        let m = &self.median;
        self.overhead_ratio_p50 = m.api.p50_ms / m.in_process.p50_ms;
        self.vs_bare_lwt_p99 = m.api.p99_ms / m.bare_lwt.p99_ms;
    }
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
        cassandra_cpu_ms: f64::NAN,
    }
}

/// Runs `op(i)` at `rate` for `seconds`, open loop; returns the latency figures.
async fn open_loop<F, Fut>(rate: f64, seconds: u64, op: F) -> Latency
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
    );
    l.cassandra_cpu_ms = match (cassandra, cpu_before) {
        (Some(pid), Some(before)) => (cpu_seconds(pid) - before) * 1000.0 / done,
        _ => f64::NAN,
    };
    l
}

/// The Cassandra that `make up` started, from its pid file (as stack/stack.sh places it).
fn cassandra_pid() -> Option<u32> {
    let pid = std::fs::read_to_string(crate::stack_dir()?.join("cassandra.pid")).ok()?;
    pid.trim().parse().ok()
}

pub async fn run(
    base: &Settings,
    topology: &Topology,
    args: &ApiBenchArgs,
) -> Result<ApiBenchReport> {
    let stamp = likes::runtime::clock::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("benchapi{stamp}.");
    settings.cql.keyspace = format!("benchapi_{stamp}");
    settings.api.session_key = format!("bench-session-key-{stamp:0>20}");
    settings.api.listen = "127.0.0.1:19480".into();
    settings.api.max_writes_in_flight = 4096;
    settings.api.max_writes_per_s = 0.0;
    settings.api.relay = false;
    let (session, _) = crate::namespace::create(&settings, topology, true).await?;
    let dir = std::env::temp_dir().join(format!("likes-benchapi-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    let mut report = ApiBenchReport {
        offered_per_s: args.rate,
        seconds: args.seconds,
        ..Default::default()
    };

    let ks = &settings.cql.keyspace;
    let prepare = |q: String| {
        let session = session.clone();
        async move {
            session
                .prepare(q)
                .await
                .map(Arc::new)
                .map_err(|e| anyhow!(format!("prepare a bench LWT: {e}")))
        }
    };
    let edge_lwt = prepare(format!(
        "INSERT INTO {ks}.edges (item_id, bucket, user_id, state, op_id, updated_at, epoch) \
         VALUES (?, 0, ?, 1, 1, toTimestamp(now()), 0) IF NOT EXISTS"
    ))
    .await?;
    let app = api::App::connect(&settings, topology).await?;
    let mix = Arc::new(Mutex::new(Mix {
        rng: StdRng::seed_from_u64(args.seed),
        next_user: 0,
        liked: Vec::new(),
    }));
    let mut child = spawn_api(&settings, &dir)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| anyhow!(format!("http client: {e}")))?;
    let url = format!("http://{}", settings.api.listen);
    wait_ready(&http, &url).await?;
    let signer = Arc::new(Signer::new(settings.api.session_key.as_bytes()));
    let expires = stamp / 1000 + 3600;

    let loops = Loops {
        http,
        url,
        signer,
        expires,
        mix,
        app,
        session: session.clone(),
        edge_lwt,
    };
    for round in 0..args.rounds {
        let r = loops
            .round(&format!("r{round}"), args.rate, args.seconds)
            .await;
        for (name, l) in LOOPS.iter().zip(r.loops()) {
            eprintln!(
                "bench api: round {}/{}: {name}: {l:?}",
                round + 1,
                args.rounds
            );
        }
        report.rounds.push(r);
    }
    stop(&mut child);
    report.summarize();
    likes::cmd::namespace::drop(&session, &settings, topology).await?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&args.out)?;
    let json = serde_json::to_string_pretty(&report)?;
    let path = args.out.join(format!("api-{stamp}.json"));
    std::fs::write(&path, json)?;
    eprintln!("bench api: report written to {}", path.display());
    Ok(report)
}

/// The loops of a round, and what they share.
struct Loops {
    http: reqwest::Client,
    url: String,
    signer: Arc<Signer>,
    expires: i64,
    mix: Arc<Mutex<Mix>>,
    app: Arc<api::App>,
    session: Arc<scylla::client::session::Session>,
    edge_lwt: Arc<scylla::statement::prepared::PreparedStatement>,
}

impl Loops {
    /// One round: the API over HTTP, the write path in process, a bare LWT.
    async fn round(&self, tag: &str, rate: f64, seconds: u64) -> Round {
        let mut r = Round::default();
        r.api = open_loop(rate, seconds, |i| {
            let (http, mix, url, signer) = (
                self.http.clone(),
                self.mix.clone(),
                self.url.clone(),
                self.signer.clone(),
            );
            let expires = self.expires;
            let key = format!("h{tag}-{i}");
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
                    .header("Idempotency-Key", key)
                    .send()
                    .await
                {
                    Ok(r) => r.status().is_success(),
                    Err(_) => false,
                }
            }
        })
        .await;
        r.in_process = open_loop(rate, seconds, |i| {
            let (app, mix) = (self.app.clone(), self.mix.clone());
            let key = format!("k{tag}-{i}");
            async move {
                let (user, item, like) = mix.lock().await.next();
                api::write::write(&app, &user, &item, like, &key)
                    .await
                    .is_ok()
            }
        })
        .await;
        r.bare_lwt = open_loop(rate, seconds, |i| {
            let (s, st) = (self.session.clone(), self.edge_lwt.clone());
            let (item, user) = (format!("bare-{}", i % 10_000), format!("b{tag}-{i}"));
            async move { s.execute_unpaged(&st, (item, user)).await.is_ok() }
        })
        .await;
        r
    }
}

/// Starts `likes api` in the bench's namespace, without the relay (the bench measures
/// the write path alone).
pub(crate) fn spawn_api(settings: &Settings, dir: &std::path::Path) -> Result<Proc> {
    let a = &settings.api;
    let env = procs::env([
        ("LIKES__CQL__KEYSPACE", settings.cql.keyspace.clone()),
        (
            "LIKES__KAFKA__TOPIC_PREFIX",
            settings.kafka.topic_prefix.clone(),
        ),
        ("LIKES__API__LISTEN", a.listen.clone()),
        ("LIKES__API__SESSION_KEY", a.session_key.clone()),
        (
            "LIKES__API__MAX_WRITES_IN_FLIGHT",
            a.max_writes_in_flight.to_string(),
        ),
        (
            "LIKES__API__MAX_WRITES_PER_S",
            a.max_writes_per_s.to_string(),
        ),
        ("LIKES__API__RELAY", "false".to_string()),
        ("RUST_LOG", "warn".to_string()),
    ]);
    procs::spawn_attached("api", "api", dir, &env)
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

impl std::fmt::Display for ApiBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "| loop at {:.0} writes/s offered, {} s, median of {} | achieved/s | errors | p50 ms | p99 ms (min–max) | p999 ms | Cassandra CPU ms/write |",
            self.offered_per_s,
            self.seconds,
            self.rounds.len()
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|")?;
        for (k, (name, l)) in LOOPS.iter().zip(self.median.loops()).enumerate() {
            let (lo, hi) = spread(self.rounds.iter().map(|r| r.loops()[k].p99_ms));
            writeln!(
                f,
                "| {name} | {:.0} | {} | {:.1} | {:.1} ({lo:.1}–{hi:.1}) | {:.1} | {:.2} |",
                l.achieved_per_s, l.errors, l.p50_ms, l.p99_ms, l.p999_ms, l.cassandra_cpu_ms
            )?;
        }
        write!(
            f,
            "\nAPI / in-process p50: {:.2}; API / bare LWT p99: {:.2}",
            self.overhead_ratio_p50, self.vs_bare_lwt_p99
        )
    }
}
