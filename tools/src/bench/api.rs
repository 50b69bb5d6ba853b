//! `likes-tools bench api`: the API's capacity and latency against a bare LWT loop, both run
//! by this command against the same Cassandra, interleaved in each round:
//!
//! - **capacity**: the highest offered rate each loop sustains with p99 under the SLO
//!   (`--slo-p99-ms`, 150 ms: the seed's), found by stepping the rate up by half each step
//!   from `--start-rate` until a step fails (p99 over the SLO, over 1% errors, or under 90% of
//!   the offered rate achieved), then one bisection step between the last pass and the fail;
//! - **latency at half the API's capacity**: the API over loopback, the write path called in
//!   process (no HTTP, JSON or auth: API / in-process is the API's own overhead) and the bare
//!   LWT loop, each at that rate.
//!
//! The API is `likes api` as a child process (like/unlike mix: 80% likes of new edges, 20%
//! unlikes of earlier ones, a fresh request key each). The bare LWT loop is one
//! `INSERT ... IF NOT EXISTS` per write: the one Paxos round docs/design.md allows a write, and
//! nothing else. Goals (issue 13): API capacity ≥ 0.7 × the bare loop's; API p99 at half its
//! capacity ≤ 2 × the bare loop's p99 at that rate. Ratios are taken within each round
//! (the box drifts between rounds), then the median over rounds with min–max.
//!
//! Open loop: each request is sent at its scheduled time whatever the latency of earlier
//! ones, and latency counts from that scheduled time, so a stall shows up in the figures.
//! Cassandra's CPU time per completed write is read from /proc for each loop: on a shared
//! 2-core box it says where the capacity goes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Mutex;

use super::api_costs::{Cost, Costs};
use super::harness::{open_loop, spawn_api, wait_ready, Latency};
use super::stats::{fig, mmm, Goal};
use anyhow::{anyhow, Result};
use likes::api::{self, auth::Signer};
use likes::config::Settings;
use likes::topology::Topology;
use likes_testkit::procs::stop;

/// The API's capacity over the bare LWT loop's must reach this.
pub const CAPACITY_GOAL: f64 = 0.7;
/// Cassandra's CPU per write of the write path over the bare LWT loop's (issue 26, item 4).
pub const CPU_GOAL: f64 = 1.25;
/// The API's p99 over the bare LWT loop's, at half the API's capacity, must stay under this.
pub const LATENCY_GOAL: f64 = 2.0;

/// Knobs of `likes-tools bench api`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiBenchArgs {
    /// The p99 bound a rate must keep to count as sustained, milliseconds.
    #[arg(long, default_value_t = 150.0)]
    pub slo_p99_ms: f64,
    /// The first rate of the capacity search, writes/s.
    #[arg(long, default_value_t = 100.0)]
    pub start_rate: f64,
    /// Seconds per step of the capacity search.
    #[arg(long, default_value_t = 10)]
    pub step_seconds: u64,
    /// Seconds per loop at half the API's capacity.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Rounds (capacity of both, then the loops at half capacity); medians and min–max.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Writes/s at which each statement of the write path runs alone (its Cassandra CPU).
    #[arg(long, default_value_t = 200.0)]
    pub cost_rate: f64,
    /// Only the statements' costs and the API's own CPU per write at --cost-rate: no
    /// capacity search (a quick look at the database cost of a write).
    #[arg(long)]
    pub costs_only: bool,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

impl ApiBenchArgs {
    pub fn check(&self) -> Result<()> {
        let positive = |v: f64| !v.is_nan() && v > 0.0;
        if !positive(self.slo_p99_ms)
            || !positive(self.start_rate)
            || self.step_seconds == 0
            || self.seconds == 0
            || self.rounds == 0
            || !positive(self.cost_rate)
        {
            anyhow::bail!(
                "--slo-p99-ms, --start-rate, --step-seconds, --seconds and --rounds and --cost-rate must be above 0"
            );
        }
        Ok(())
    }
}

impl Latency {
    /// Whether the loop sustained its offered rate within the SLO.
    fn sustained(&self, slo_p99_ms: f64) -> bool {
        let done = self.achieved_per_s.max(1.0);
        self.p99_ms < slo_p99_ms
            && (self.errors as f64) <= 0.01 * done
            && self.achieved_per_s >= 0.9 * self.offered_per_s
    }
}

/// A capacity search: the steps it ran and the highest rate sustained.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Capacity {
    pub per_s: f64,
    pub steps: Vec<Latency>,
}

/// One round: both capacities, then the three loops at half the API's capacity.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Round {
    pub api_capacity: Capacity,
    pub bare_capacity: Capacity,
    pub half_rate: f64,
    pub api: Latency,
    pub in_process: Latency,
    pub bare_lwt: Latency,
    /// Each statement of the write path alone at the half rate (api_costs.rs).
    pub costs: Vec<Cost>,
}

impl Round {
    fn capacity_ratio(&self) -> f64 {
        self.api_capacity.per_s / self.bare_capacity.per_s
    }

    fn p99_ratio(&self) -> f64 {
        self.api.p99_ms / self.bare_lwt.p99_ms
    }
}

/// The loops, with their names in the report.
#[derive(Debug, Clone, Copy)]
enum Loop {
    Api,
    InProcess,
    Bare,
}

/// A loop at half capacity: its name and where a round keeps it.
type HalfLoop = (&'static str, fn(&Round) -> &Latency);

const HALF_LOOPS: [HalfLoop; 3] = [
    ("API over loopback", |r| &r.api),
    ("write path in process", |r| &r.in_process),
    ("bare LWT", |r| &r.bare_lwt),
];

#[derive(Debug, Default, Serialize)]
pub struct ApiBenchReport {
    pub slo_p99_ms: f64,
    pub step_seconds: u64,
    pub seconds: u64,
    pub rounds: Vec<Round>,
}

impl ApiBenchReport {
    fn over(&self, f: impl Fn(&Round) -> f64) -> (f64, f64, f64) {
        mmm(self.rounds.iter().map(f))
    }

    /// API capacity / bare LWT capacity: median over rounds, min, max.
    pub fn capacity_ratio(&self) -> (f64, f64, f64) {
        self.over(Round::capacity_ratio)
    }

    /// API p99 / bare LWT p99 at half the API's capacity.
    pub fn p99_ratio(&self) -> (f64, f64, f64) {
        self.over(Round::p99_ratio)
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
    // The write path's own capacity: a wide, fixed bound (the adaptive limit is what
    // `bench overload` measures).
    settings.api.max_writes_in_flight = 4096;
    settings.api.write_latency_target = Duration::ZERO;
    settings.api.max_writes_per_s = 0.0;
    settings.api.max_writes_per_user_per_s = 0.0;
    settings.api.relay = false;
    let (session, _) = likes_testkit::namespace::create(&settings, topology, true).await?;
    let dir = std::env::temp_dir().join(format!("likes-benchapi-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    let mut report = ApiBenchReport {
        slo_p99_ms: args.slo_p99_ms,
        step_seconds: args.step_seconds,
        seconds: args.seconds,
        ..Default::default()
    };

    let ks = &settings.cql.keyspace;
    let edge_lwt = Arc::new(
        session
            .prepare(format!(
                "INSERT INTO {ks}.edges (item_id, bucket, user_id, state, op_id, updated_at, epoch) \
                 VALUES (?, 0, ?, 1, 1, toTimestamp(now()), 0) IF NOT EXISTS"
            ))
            .await
            .map_err(|e| anyhow!(format!("prepare the bare LWT: {e}")))?,
    );
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
        costs: Arc::new(Costs::prepare(session.clone(), ks).await?),
    };
    // Cold JVM paths and a fresh keyspace fail the search's first step for the wrong reason
    // (p99 near a second at 100/s): a few seconds of each loop first, not counted.
    let warm = loops.api("w", args.start_rate, 5).await;
    loops.bare("w", args.start_rate, 5).await;
    eprintln!(
        "bench api: warm-up at {:.0}/s: API p99 {:.1} ms (not counted)",
        args.start_rate, warm.p99_ms
    );
    for round in 0..args.rounds {
        let r = loops.round(&format!("r{round}"), args).await;
        eprintln!(
            "bench api: round {}/{}: capacity API {:.0}/s, bare LWT {:.0}/s; at {:.0}/s p99 API {:.1} ms, in process {:.1} ms, bare LWT {:.1} ms",
            round + 1,
            args.rounds,
            r.api_capacity.per_s,
            r.bare_capacity.per_s,
            r.half_rate,
            r.api.p99_ms,
            r.in_process.p99_ms,
            r.bare_lwt.p99_ms
        );
        report.rounds.push(r);
    }
    stop(&mut child);
    likes_testkit::namespace::drop(&session, &settings, topology).await?;
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
    costs: Arc<Costs>,
}

impl Loops {
    /// One round: the capacity of the API and of the bare LWT, then the API, the write path
    /// in process and the bare LWT at half the API's capacity.
    async fn round(&self, tag: &str, args: &ApiBenchArgs) -> Round {
        if args.costs_only {
            let (s, rate) = (args.seconds, args.cost_rate);
            return Round {
                half_rate: rate,
                api: self.run(Loop::Api, tag, rate, s).await,
                in_process: self.run(Loop::InProcess, tag, rate, s).await,
                bare_lwt: self.run(Loop::Bare, tag, rate, s).await,
                costs: self.costs(tag, args).await,
                ..Default::default()
            };
        }
        let api_capacity = self.capacity(Loop::Api, &format!("{tag}c"), args).await;
        let bare_capacity = self.capacity(Loop::Bare, &format!("{tag}c"), args).await;
        let half_rate = (api_capacity.per_s / 2.0).max(1.0);
        let (s, tag) = (args.seconds, format!("{tag}h"));
        Round {
            api: self.run(Loop::Api, &tag, half_rate, s).await,
            in_process: self.run(Loop::InProcess, &tag, half_rate, s).await,
            bare_lwt: self.run(Loop::Bare, &tag, half_rate, s).await,
            costs: self.costs(&tag, args).await,
            api_capacity,
            bare_capacity,
            half_rate,
        }
    }

    /// Each statement alone, last in a round; then a pause, so that the flushes and
    /// compactions of what they wrote do not land on the next round's loops.
    async fn costs(&self, tag: &str, args: &ApiBenchArgs) -> Vec<Cost> {
        let c = self
            .costs
            .measure(tag, args.cost_rate, (args.seconds / 2).max(5))
            .await;
        tokio::time::sleep(Duration::from_secs(15)).await;
        c
    }

    /// The highest rate `which` sustains within the SLO: up by half a step until a step
    /// fails, then one bisection step between the last pass and the fail.
    async fn capacity(&self, which: Loop, tag: &str, args: &ApiBenchArgs) -> Capacity {
        let mut c = Capacity::default();
        let mut rate = args.start_rate;
        let mut failed_at = None;
        for step in 0.. {
            let l = self
                .run(which, &format!("{tag}{step}"), rate, args.step_seconds)
                .await;
            eprintln!(
                "bench api: {which:?} at {rate:.0}/s: achieved {:.0}/s, p99 {:.1} ms, {} errors",
                l.achieved_per_s, l.p99_ms, l.errors
            );
            c.steps.push(l);
            if !l.sustained(args.slo_p99_ms) {
                failed_at = Some(rate);
                break;
            }
            c.per_s = rate;
            rate *= 1.5;
        }
        if let Some(fail) = failed_at.filter(|_| c.per_s > 0.0) {
            let mid = (c.per_s * fail).sqrt();
            let l = self
                .run(which, &format!("{tag}m"), mid, args.step_seconds)
                .await;
            c.steps.push(l);
            if l.sustained(args.slo_p99_ms) {
                c.per_s = mid;
            }
        }
        c
    }

    async fn run(&self, which: Loop, tag: &str, rate: f64, seconds: u64) -> Latency {
        match which {
            Loop::Api => self.api(tag, rate, seconds).await,
            Loop::InProcess => self.in_process(tag, rate, seconds).await,
            Loop::Bare => self.bare(tag, rate, seconds).await,
        }
    }

    async fn api(&self, tag: &str, rate: f64, seconds: u64) -> Latency {
        open_loop(rate, seconds, |i| {
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
        .await
    }

    async fn in_process(&self, tag: &str, rate: f64, seconds: u64) -> Latency {
        open_loop(rate, seconds, |i| {
            let (app, mix) = (self.app.clone(), self.mix.clone());
            let key = format!("k{tag}-{i}");
            async move {
                let (user, item, like) = mix.lock().await.next();
                let write = likes::write::Write::by_user(&user, &item, like, &key);
                app.writer.write(&write).await.is_ok()
            }
        })
        .await
    }

    async fn bare(&self, tag: &str, rate: f64, seconds: u64) -> Latency {
        open_loop(rate, seconds, |i| {
            let (s, st) = (self.session.clone(), self.edge_lwt.clone());
            let (item, user) = (format!("bare-{}", i % 10_000), format!("b{tag}-{i}"));
            async move { s.execute_unpaged(&st, (item, user)).await.is_ok() }
        })
        .await
    }
}

impl std::fmt::Display for ApiBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.rounds.len();
        writeln!(
            f,
            "| capacity (p99 < {:.0} ms, {} s steps), median of {n} (min–max) | writes/s |\n|---|---|",
            self.slo_p99_ms, self.step_seconds
        )?;
        writeln!(
            f,
            "| API over loopback | {} |",
            fig(self.over(|r| r.api_capacity.per_s), 0)
        )?;
        writeln!(
            f,
            "| bare LWT loop | {} |",
            fig(self.over(|r| r.bare_capacity.per_s), 0)
        )?;
        let cap = self.capacity_ratio();
        writeln!(
            f,
            "| **API / bare LWT** | {} — goal {} |\n",
            fig(cap, 2),
            Goal::at_least(CAPACITY_GOAL).verdict(cap.0)
        )?;
        writeln!(
            f,
            "| at half the API's capacity ({} writes/s), {} s, median of {n} | achieved/s | errors | p50 ms | p99 ms (min–max) | p999 ms | Cassandra CPU ms/write |",
            fig(self.over(|r| r.half_rate), 0),
            self.seconds
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|")?;
        for (name, get) in HALF_LOOPS {
            let m = |g: fn(&Latency) -> f64| self.over(|r| g(get(r)));
            writeln!(
                f,
                "| {name} | {:.0} | {:.0} | {:.1} | {} | {:.1} | {:.2} |",
                m(|l| l.achieved_per_s).0,
                m(|l| l.errors as f64).0,
                m(|l| l.p50_ms).0,
                fig(m(|l| l.p99_ms), 1),
                m(|l| l.p999_ms).0,
                m(|l| l.cassandra_cpu_ms).0
            )?;
        }
        let cpu = self.over(|r| r.in_process.cassandra_cpu_ms / r.bare_lwt.cassandra_cpu_ms);
        writeln!(
            f,
            "\n**Cassandra CPU per write, write path in process / bare LWT**: {} — goal {} (the API over loopback sends the same statements; its loop runs first, after the capacity search's flushes: {}).",
            fig(cpu, 2),
            Goal::at_most(CPU_GOAL).verdict(cpu.0),
            fig(self.over(|r| r.api.cassandra_cpu_ms / r.bare_lwt.cassandra_cpu_ms), 2)
        )?;
        self.costs(f)?;
        let p99 = self.p99_ratio();
        write!(
            f,
            "\n**API p99 / bare LWT p99** at that rate: {} — goal {}. API / in-process p50: {}.",
            fig(p99, 2),
            Goal::at_most(LATENCY_GOAL).verdict(p99.0),
            fig(self.over(|r| r.api.p50_ms / r.in_process.p50_ms), 2)
        )
    }
}

impl ApiBenchReport {
    /// The table of where Cassandra's CPU per write goes, statement by statement.
    fn costs(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(first) = self.rounds.first() else {
            return Ok(());
        };
        writeln!(
            f,
            "\n| each statement alone at that rate, median of {} | Cassandra CPU ms each, idle taken off (min–max) | p99 ms |\n|---|---|---|",
            self.rounds.len()
        )?;
        for (k, c) in first.costs.iter().enumerate() {
            let m = |g: fn(&Cost) -> f64| self.over(|r| r.costs.get(k).map(g).unwrap_or(f64::NAN));
            writeln!(
                f,
                "| {} | {} | {:.1} |",
                c.name,
                fig(m(|c| c.cpu_ms), 2),
                m(|c| c.p99_ms).0
            )?;
        }
        Ok(())
    }
}
