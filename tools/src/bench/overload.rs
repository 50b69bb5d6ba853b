//! `likes-tools bench overload`: the API past its capacity (issue 26, item 3).
//!
//! Each round first finds the API's capacity: the highest rate of likes it answers with p99
//! under the SLO (150 ms), no more than 1% errors and 90% of the offered rate achieved, with
//! the adaptive limit off (a fixed bound of 4,096: the write path's own capacity). Then
//! `likes api` with the product's admission (the adaptive limit, its defaults) takes 2× and
//! 4× that rate, open loop, for `--seconds` each, while a reader asks for counts at
//! `--read-rate`. Reported per level: goodput (writes answered 200 a second) against the
//! capacity, the p99 of accepted writes at the client (from each request's scheduled time)
//! and at the server (`likes_api_admitted_write_seconds`), the p99 of shed answers (503),
//! and the readers' p99 against their p99 with no write load. Goals: goodput ≥ 0.9×
//! capacity, accepted p99 < 150 ms at both ends, shed p99 < 5 ms, reads' p99 within 2×.
//!
//! Then, at half the capacity, a broker outage ([`super::outage`]): kill -9 of the stack's
//! Kafka for 30 s while the writes go on (goal: ≥ 99 % of them answered 2xx, as before it).
//!
//! Everything runs on this box: the load generator takes CPU from the API and Cassandra,
//! which is part of what the figures show.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde::Serialize;

use super::harness::{capacity, p99, spawn_api_admitted, Client, API_METRICS_PORT};
use super::scrape::{buckets, diff, quantile, scrape};
use super::stats::{fig, mmm, Goal};
use likes::api::auth::Signer;
use likes::config::Settings;
use likes::runtime::metrics as m;
use likes::topology::Topology;
use likes_testkit::procs::stop;

/// Knobs of `likes-tools bench overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverloadArgs {
    /// Seconds of offered load per level.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Seconds per step of the capacity search.
    #[arg(long, default_value_t = 8)]
    pub step_seconds: u64,
    /// Count reads a second beside the writes.
    #[arg(long, default_value_t = 50.0)]
    pub read_rate: f64,
    /// Rounds (capacity, then each level); medians and min–max.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Skip the broker outage of each round (it kills the stack's Kafka with kill -9 and
    /// starts it again).
    #[arg(long)]
    pub no_broker_outage: bool,
    /// Skip the Cassandra slowdown of each round (it pauses the stack's Cassandra with
    /// SIGSTOP / SIGCONT for 15 s).
    #[arg(long)]
    pub no_cassandra_slowdown: bool,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

/// The offered load of each level, in multiples of the capacity: 1× for the plot's first
/// point, 2× and 4× for the goals.
pub const FACTORS: [f64; 3] = [1.0, 2.0, 4.0];

/// One level of offered load.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Level {
    pub factor: f64,
    pub offered_per_s: f64,
    pub goodput_per_s: f64,
    pub shed_share: f64,
    pub errors: u64,
    pub accepted_p99_ms: f64,
    pub accepted_server_p99_ms: f64,
    pub shed_p99_ms: f64,
    pub reads_p99_ms: f64,
    /// The adaptive limit at the end of the level.
    pub limit_at_end: f64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Round {
    pub capacity_per_s: f64,
    pub reads_unloaded_p99_ms: f64,
    pub levels: Vec<Level>,
    /// Writes at half the capacity through a 30 s broker outage.
    pub broker_outage: Option<super::outage::Outage>,
    /// Writes at the capacity while Cassandra is paused in bursts.
    pub cassandra_slowdown: Option<super::slowdown::Slowdown>,
}

#[derive(Debug, Default, Serialize)]
pub struct OverloadReport {
    pub seconds: u64,
    pub rounds: Vec<Round>,
    /// The JSON file the run wrote (its plot goes beside it).
    #[serde(skip)]
    pub written: std::path::PathBuf,
}

pub async fn run(
    base: &Settings,
    topology: &Topology,
    args: &OverloadArgs,
) -> Result<OverloadReport> {
    let stamp = likes::runtime::clock::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("benchover{stamp}.");
    settings.cql.keyspace = format!("benchover_{stamp}");
    settings.api.session_key = format!("bench-session-key-{stamp:0>20}");
    settings.api.listen = "127.0.0.1:19481".into();
    let (session, _) = likes_testkit::namespace::create(&settings, topology, true).await?;
    let dir = std::env::temp_dir().join(format!("likes-benchover-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    let client = Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .build()
            .map_err(|e| anyhow!(format!("http client: {e}")))?,
        url: format!("http://{}", settings.api.listen),
        signer: Arc::new(Signer::new(settings.api.session_key.as_bytes())),
        expires: stamp / 1000 + 3600,
    };
    let mut report = OverloadReport {
        seconds: args.seconds,
        ..Default::default()
    };
    for round in 0..args.rounds {
        let tag = format!("r{round}");
        // The capacity, with the write path's own bound.
        let mut api = spawn_api_admitted(&settings, &dir, false)?;
        super::harness::wait_ready(&client.http, &client.url).await?;
        let capacity = capacity(&client, &tag, args.step_seconds).await;
        stop(&mut api);
        if capacity <= 0.0 {
            anyhow::bail!(
                "bench overload: the API did not sustain even 25 writes/s with \
                 p99 < 150 ms: a debug build, or a stack in trouble? (`make bench-overload` \
                 builds a release)"
            );
        }

        let mut api = spawn_api_admitted(&settings, &dir, true)?;
        super::harness::wait_ready(&client.http, &client.url).await?;
        // Warm the limit up to this box before the measured levels.
        client.writes(&format!("{tag}w"), capacity, 5).await;
        let mut unloaded = client.reads_for(args.read_rate, 10).await;
        let mut r = Round {
            capacity_per_s: capacity,
            reads_unloaded_p99_ms: p99(&mut unloaded),
            levels: Vec::new(),
            broker_outage: None,
            cassandra_slowdown: None,
        };
        for factor in FACTORS {
            let rate = capacity * factor;
            let before = buckets(&scrape(API_METRICS_PORT), m::API_ADMITTED_WRITE_SECONDS);
            let stop_reads = Arc::new(AtomicU64::new(0));
            let (mut seen, mut reads) = tokio::join!(
                async {
                    let s = client
                        .writes(&format!("{tag}x{factor}"), rate, args.seconds)
                        .await;
                    stop_reads.store(1, Ordering::Relaxed);
                    s
                },
                client.reads(args.read_rate, stop_reads.clone())
            );
            let metrics = scrape(API_METRICS_PORT);
            let server = diff(&buckets(&metrics, m::API_ADMITTED_WRITE_SECONDS), &before);
            let total = (seen.ok.len() + seen.shed.len()) as f64 + seen.errors as f64;
            let level = Level {
                factor,
                offered_per_s: rate,
                goodput_per_s: seen.ok.len() as f64 / args.seconds as f64,
                shed_share: seen.shed.len() as f64 / total.max(1.0),
                errors: seen.errors,
                accepted_p99_ms: p99(&mut seen.ok),
                accepted_server_p99_ms: quantile(&server, 0.99) * 1000.0,
                shed_p99_ms: p99(&mut seen.shed),
                reads_p99_ms: p99(&mut reads),
                limit_at_end: metrics.get(m::API_WRITE_LIMIT).copied().unwrap_or(f64::NAN),
            };
            eprintln!(
                "bench overload: {factor}x capacity ({rate:.0}/s): goodput {:.0}/s ({:.2}x), accepted p99 {:.0} ms (server {:.0} ms), shed {:.0}% p99 {:.1} ms, reads p99 {:.1} ms (unloaded {:.1}), limit {:.0}, {} errors",
                level.goodput_per_s,
                level.goodput_per_s / capacity,
                level.accepted_p99_ms,
                level.accepted_server_p99_ms,
                level.shed_share * 100.0,
                level.shed_p99_ms,
                level.reads_p99_ms,
                r.reads_unloaded_p99_ms,
                level.limit_at_end,
                level.errors
            );
            r.levels.push(level);
            // Let the backlog of the last level drain before the next.
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        if !args.no_cassandra_slowdown {
            // ¾ of the capacity: comfortable before, past what a paused database takes.
            match super::slowdown::cassandra(&client, &tag, capacity * 0.75).await {
                Ok(o) => r.cassandra_slowdown = Some(o),
                Err(e) => eprintln!("bench overload: the Cassandra slowdown failed: {e:#}"),
            }
        }
        if !args.no_broker_outage {
            // A failed outage (the broker not killed, or not started again) loses its rows,
            // not the report.
            match super::outage::broker(&client, &tag, (capacity / 2.0).max(10.0)).await {
                Ok(o) => r.broker_outage = Some(o),
                Err(e) => eprintln!("bench overload: the broker outage failed: {e:#}"),
            }
        }
        stop(&mut api);
        report.rounds.push(r);
    }
    likes_testkit::namespace::drop(&session, &settings, topology).await?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join(format!("overload-{stamp}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("bench overload: report written to {}", path.display());
    report.written = path;
    // The plot is the caller's (bench/mod.rs `plot_overload`): a run returns its results and
    // only the report renders them.
    Ok(report)
}

/// A row of the table: its name, median (min–max), goal and decimals.
type Row = (&'static str, (f64, f64, f64), Goal, usize);

/// Rows under one label; a goal with a zero bound is only reported.
fn write_rows(s: &mut String, label: &str, rows: impl IntoIterator<Item = Row>) {
    use std::fmt::Write;
    for (name, v, goal, digits) in rows {
        let verdict = if goal.bound == 0.0 {
            "reported".to_string()
        } else {
            goal.verdict(v.0)
        };
        let _ = writeln!(s, "| {label} | {name} | {} | {verdict} |", fig(v, digits));
    }
}

impl std::fmt::Display for OverloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.table())
    }
}

impl OverloadReport {
    /// The rows of bench/report.md: medians over rounds with min–max, and each goal.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let cap = mmm(self.rounds.iter().map(|r| r.capacity_per_s));
        let _ = writeln!(
            s,
            "API capacity (p99 < 150 ms, fixed bound): {} writes/s; {} s per level, open loop, reads beside them\n",
            fig(cap, 0),
            self.seconds
        );
        let _ = writeln!(
            s,
            "| offered | figure | median (min–max) | goal |\n|---|---|---|---|"
        );
        for (k, factor) in FACTORS.iter().enumerate() {
            let get = |f: fn(&Round, &Level) -> f64| {
                mmm(self
                    .rounds
                    .iter()
                    .filter_map(|r| r.levels.get(k).map(|l| f(r, l))))
            };
            let rows: [Row; 6] = [
                (
                    "goodput / capacity",
                    get(|r, l| l.goodput_per_s / r.capacity_per_s),
                    Goal::at_least(0.9),
                    2,
                ),
                (
                    "accepted writes' p99 at the client, ms",
                    get(|_, l| l.accepted_p99_ms),
                    Goal::at_most(150.0),
                    0,
                ),
                (
                    "accepted writes' p99 at the server, ms",
                    get(|_, l| l.accepted_server_p99_ms),
                    Goal::at_most(150.0),
                    0,
                ),
                (
                    "shed writes (503) answered, p99 ms",
                    get(|_, l| l.shed_p99_ms),
                    Goal::at_most(5.0),
                    1,
                ),
                (
                    "reads' p99 / unloaded reads' p99",
                    get(|r, l| l.reads_p99_ms / r.reads_unloaded_p99_ms),
                    Goal::at_most(2.0),
                    2,
                ),
                (
                    "share of writes shed",
                    get(|_, l| l.shed_share),
                    Goal::at_least(0.0),
                    2,
                ),
            ];
            write_rows(&mut s, &format!("{factor}× capacity"), rows);
        }
        let outages: Vec<_> = self
            .rounds
            .iter()
            .filter_map(|r| r.broker_outage.as_ref())
            .collect();
        if !outages.is_empty() {
            let get = |f: fn(&super::outage::Outage) -> f64| mmm(outages.iter().map(|o| f(o)));
            let down = get(|o| o.down_s);
            let rows: [Row; 6] = [
                (
                    "writes answered 2xx while the broker is down",
                    get(|o| o.during.availability),
                    Goal::at_least(0.99),
                    3,
                ),
                (
                    "their p99, ms",
                    get(|o| o.during.ok_p99_ms),
                    Goal::at_least(0.0),
                    0,
                ),
                (
                    "writes answered 2xx while it starts again (its JVM takes this box's CPU)",
                    get(|o| o.starting.availability),
                    Goal::at_least(0.0),
                    3,
                ),
                (
                    "seconds its start took",
                    get(|o| o.starting_s),
                    Goal::at_least(0.0),
                    0,
                ),
                (
                    "writes answered 2xx before it",
                    get(|o| o.before.availability),
                    Goal::at_least(0.0),
                    3,
                ),
                (
                    "writes answered 2xx in the 15 s after it",
                    get(|o| o.after.availability),
                    Goal::at_least(0.0),
                    3,
                ),
            ];
            let label = format!("½ capacity, broker killed for {:.0} s", down.0);
            write_rows(&mut s, &label, rows);
        }
        let slow: Vec<_> = self
            .rounds
            .iter()
            .filter_map(|r| r.cassandra_slowdown.as_ref())
            .collect();
        if !slow.is_empty() {
            use super::slowdown::{PAUSE, PERIOD};
            let get = |f: fn(&super::slowdown::Slowdown) -> f64| mmm(slow.iter().map(|o| f(o)));
            let rows: [Row; 6] = [
                (
                    "limit at its end / limit before (comes down)",
                    get(|o| o.slowed.limit_at_end / o.before.limit_at_end),
                    Goal::at_most(0.9),
                    2,
                ),
                (
                    "accepted writes' p99 at the server, ms",
                    get(|o| o.slowed.accepted_server_p99_ms),
                    Goal::at_most(150.0),
                    0,
                ),
                (
                    "goodput / offered",
                    get(|o| o.slowed.goodput_per_s / o.rate_per_s),
                    Goal::at_least(0.0),
                    2,
                ),
                (
                    "limit 15 s after it / limit before (goes back up)",
                    get(|o| o.after.limit_at_end / o.before.limit_at_end),
                    Goal::at_least(0.75),
                    2,
                ),
                (
                    "goodput / offered in the 15 s after it",
                    get(|o| o.after.goodput_per_s / o.rate_per_s),
                    Goal::at_least(0.9),
                    2,
                ),
                (
                    "goodput / offered before it",
                    get(|o| o.before.goodput_per_s / o.rate_per_s),
                    Goal::at_least(0.0),
                    2,
                ),
            ];
            let label = format!(
                "¾ capacity, Cassandra paused {} ms of every {} ms for 15 s",
                PAUSE.as_millis(),
                PERIOD.as_millis()
            );
            write_rows(&mut s, &label, rows);
        }
        s
    }
}
