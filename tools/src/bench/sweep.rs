//! `likes-tools bench sweep`, the last part of `make bench`: offered load through the whole
//! system as it is deployed — `likes api` with the product's own admission and its relay,
//! `likes dedupe`, `likes count` — from a quarter of the API's capacity to four times it
//! (docs/performance.md, "The sweep").
//!
//! What makes its figures honest, each against a way the sweep before it misled:
//! - admission on, at the product's defaults: with it off, a level past capacity builds a queue
//!   that only the write deadline ends, and its latency measures that queue;
//! - a level ends only when the pipeline has applied all of it: after the load, one canary like
//!   per `events` partition and per `deltas` partition, each polled until its count reads 1 (a
//!   partition keeps order, so everything of the level before a canary is applied before it).
//!   The level's staleness then holds every event of the level and nothing of the next;
//! - the levels run interleaved, each repeat its own rotation, named in the report;
//! - staleness from the sink's histogram, whose buckets resolve 0.1–600 s
//!   (`STALENESS_BUCKETS` in src/runtime/metrics.rs), not a cap at 30 s;
//! - "admitted" counts the writes answered 2xx that the level scheduled, over its seconds.
//!
//! Per level: offered, admitted, shed and their latency at the client (from the scheduled
//! send) and at the server, reads beside them, staleness at the sink and where it goes, the
//! publishes the API deferred to its outbox, stage restarts, and how long the pipeline took
//! to catch up. Goals, judged on the median of the repeats: staleness p99 ≤ window + 1 s,
//! admitted p99 < 150 ms at the client, shed answered p99 < 5 ms, reads p99 ≤ 2× unloaded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde::Serialize;

use super::harness::spawn_stage;
use super::harness::{self, Client, API_METRICS_PORT};
use super::scrape::{buckets, cpu_seconds, diff, quantile, scrape};
use super::stats::{fig, mmm, Goal};
use crate::loadgen::{self, Live, Mix, MixArgs, Phase, Target};
use likes::api::auth::Signer;
use likes::config::Settings;
use likes::runtime::metrics as m;
use likes::topology::Topology;
use likes_testkit::procs::{self, stop};

const DEDUPE_PORT: u16 = 19565;
const COUNT_PORT: u16 = 19566;
const SLO_P99_MS: f64 = 150.0;

/// Knobs of `likes-tools bench sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Writes/s taken as 1× capacity. Unset: found first on the sweep's own stack, both stages
    /// running: the highest rate the API with a fixed bound answers with p99 < 150 ms.
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Offered load of each level, in capacities.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2,4")]
    pub factors: Vec<f64>,
    /// Seconds of load per level.
    #[arg(long, default_value_t = 20.0)]
    pub level_seconds: f64,
    /// Repeats of every level (the report gives medians and min–max).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Count reads a second beside the writes.
    #[arg(long, default_value_t = 50.0)]
    pub read_rate: f64,
    /// Longest wait after a level for the pipeline to apply all of it, seconds; a level that
    /// does not catch up is reported as such and the sweep goes on.
    #[arg(long, default_value_t = 300)]
    pub catch_up_timeout: u64,
    /// The adaptive limit's target instead of the product's default (e.g. 75ms): the sweep
    /// of another admission setting, named in its report.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub write_latency_target: Option<std::time::Duration>,
    /// Where sweep.md, its plots and its JSON go (`make bench` writes its own sweep's plots
    /// beside bench/report.md).
    #[arg(long, default_value = "bench/sweep")]
    pub out: PathBuf,
}

impl SweepArgs {
    pub fn check(&self) -> Result<()> {
        let positive = |v: f64| !v.is_nan() && v > 0.0;
        if self.repeats == 0
            || self.factors.is_empty()
            || !self.factors.iter().all(|&f| positive(f))
            || !positive(self.level_seconds)
            || !positive(self.read_rate)
            || self.capacity.is_some_and(|c| !positive(c))
        {
            anyhow::bail!(
                "--repeats, --factors, --level-seconds, --read-rate and --capacity must be above 0"
            );
        }
        Ok(())
    }
}

/// One level of the sweep, one repeat.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LevelRun {
    /// In capacities.
    pub factor: f64,
    pub offered_per_s: f64,
    /// Writes the level scheduled that were answered 2xx, over its seconds.
    pub admitted_per_s: f64,
    /// Answered 429 or 503.
    pub shed: u64,
    /// Failed otherwise (timeouts, connections, other statuses).
    pub errors: u64,
    pub failures: BTreeMap<String, u64>,
    pub client_p50_ms: f64,
    pub client_p99_ms: f64,
    /// `likes_api_admitted_write_seconds`: from admission to the answer.
    pub server_p50_ms: f64,
    pub server_p99_ms: f64,
    pub shed_p99_ms: f64,
    /// `likes_api_shed_answer_seconds`: the server's part of a shed answer.
    pub shed_server_p99_ms: f64,
    pub reads_p99_ms: f64,
    /// At the sink: the counter row written, from the event's time.
    pub staleness_p50_s: f64,
    pub staleness_p99_s: f64,
    /// p50 / p99 at each point of the path: stage 1 reads the event, its delta is on the log,
    /// its window is closed.
    pub stage1_read_s: [f64; 2],
    pub delta_on_log_s: [f64; 2],
    pub window_closed_s: [f64; 2],
    /// Publishes the API left to its outbox (no broker ack within `api.publish_wait`).
    pub deferred: f64,
    /// Restarts of either stage's pipeline during the level.
    pub restarts: f64,
    /// Seconds from the level's last answer until every canary was counted; NaN when the
    /// pipeline did not catch up within `--catch-up-timeout`.
    pub catch_up_s: f64,
    /// The adaptive write limit at the level's end.
    pub limit_at_end: f64,
    /// Cores each process used while the level's load ran, by name: where the box's two
    /// cores went (the load generator is this process, on the same cores).
    pub cores: BTreeMap<String, f64>,
    /// (latency ms, cumulative share) of the admitted writes, for the CDF plot.
    #[serde(skip)]
    pub cdf: Vec<(f64, f64)>,
}

#[derive(Debug, Default, Serialize)]
pub struct SweepReport {
    pub capacity_per_s: f64,
    /// The capacity was searched on the sweep's stack (not given with --capacity).
    pub capacity_searched: bool,
    /// The API's `api.write_latency_target` in this run.
    pub write_latency_target_ms: f64,
    pub window_s: f64,
    pub level_seconds: f64,
    pub reads_unloaded_p99_ms: f64,
    /// The factors in the order each repeat ran them.
    pub orders: Vec<Vec<f64>>,
    /// By factor (in `--factors` order), one run per repeat.
    pub levels: Vec<Vec<LevelRun>>,
}

/// Repeat `rep`'s order of `n` levels: low and high alternating (0, n-1, 1, n-2, …), so no
/// level always follows its neighbour, rotated by the repeat, so no level always runs first.
pub fn order(n: usize, rep: usize) -> Vec<usize> {
    let (mut lo, mut hi) = (0, n);
    let mut base = Vec::with_capacity(n);
    while lo < hi {
        base.push(lo);
        lo += 1;
        if lo < hi {
            hi -= 1;
            base.push(hi);
        }
    }
    base.rotate_left(rep % n.max(1));
    base
}

/// The canary likes of one level: (item, user) pairs whose events cover every `events`
/// partition and whose items cover every `deltas` partition.
pub fn canaries(topology: &Topology, tag: &str) -> Vec<(String, String)> {
    use likes::hash::{bucket_of, event_key, partition_for};
    let (ev, de) = (
        topology.topics.events.partitions as u32,
        topology.topics.deltas.partitions as u32,
    );
    let mut need_events: BTreeSet<u32> = (0..ev).collect();
    let mut need_deltas: BTreeSet<u32> = (0..de).collect();
    let mut out = Vec::new();
    for n in 0.. {
        if need_events.is_empty() && need_deltas.is_empty() {
            break;
        }
        let (item, user) = (format!("canary-{tag}-{n}"), format!("canary-{tag}-u{n}"));
        let key = event_key(&item, bucket_of(&user, topology.buckets));
        let e = need_events.remove(&partition_for(key.as_bytes(), ev));
        let d = need_deltas.remove(&partition_for(item.as_bytes(), de));
        if e || d {
            out.push((item, user));
        }
    }
    out
}

pub async fn run(base: &Settings, topology: &Topology, args: &SweepArgs) -> Result<SweepReport> {
    args.check()?;
    let stamp = likes::runtime::clock::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("sweep{stamp}.");
    settings.cql.keyspace = format!("sweep_{stamp}");
    settings.dedupe.instance_id = format!("sweep{stamp}");
    settings.api.session_key = format!("sweep-session-key-{stamp:0>20}");
    settings.api.listen = "127.0.0.1:19481".into();
    settings.metrics.listen = format!("127.0.0.1:{API_METRICS_PORT}");
    let dir = std::env::temp_dir().join(format!("likes-sweep-{stamp}"));
    settings.dedupe.state_dir = dir.join("state");
    likes_testkit::namespace::write_topology(&dir, topology)?;
    let (session, _) = likes_testkit::namespace::create(&settings, topology, true).await?;
    settle().await;
    let report = sweep(&settings, topology, args, &dir, stamp).await;
    likes_testkit::namespace::drop(&session, &settings, topology).await?;
    let _ = std::fs::remove_dir_all(&dir);
    let report = report?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| anyhow!(format!("{}: {e}", args.out.display())))?;
    let raw = args.out.join("out");
    std::fs::create_dir_all(&raw)?;
    std::fs::write(
        raw.join(format!("sweep-{stamp}.json")),
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(report)
}

async fn sweep(
    settings: &Settings,
    topology: &Topology,
    args: &SweepArgs,
    dir: &Path,
    stamp: i64,
) -> Result<SweepReport> {
    let mut dedupe = spawn_stage("dedupe", settings, DEDUPE_PORT, dir)?;
    let mut count = spawn_stage("count", settings, COUNT_PORT, dir)?;
    let url = format!("http://{}", settings.api.listen);
    let client = Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .build()
            .map_err(|e| anyhow!(format!("http client: {e}")))?,
        url: url.clone(),
        signer: Arc::new(Signer::new(settings.api.session_key.as_bytes())),
        expires: stamp / 1000 + 6 * 3600,
    };
    let mut pids = vec![
        ("load generator", std::process::id()),
        ("dedupe", dedupe.child.id()),
        ("count", count.child.id()),
    ];
    pids.extend(super::harness::cassandra_pid().map(|p| ("cassandra", p)));
    pids.extend(super::harness::stack_pid("kafka").map(|p| ("kafka", p)));
    let result = levels(settings, topology, args, dir, stamp, &client, pids).await;
    stop(&mut count);
    stop(&mut dedupe);
    result
}

async fn levels(
    settings: &Settings,
    topology: &Topology,
    args: &SweepArgs,
    dir: &Path,
    stamp: i64,
    client: &Client,
    mut pids: Vec<(&'static str, u32)>,
) -> Result<SweepReport> {
    let (capacity, searched) = match args.capacity {
        Some(c) => (c, false),
        None => {
            let mut api = harness::spawn_api_admitted(settings, dir, false)?;
            super::harness::wait_ready(&client.http, &client.url).await?;
            let c = harness::capacity(client, "sc", 8).await;
            stop(&mut api);
            if c <= 0.0 {
                anyhow::bail!(
                    "bench sweep: the API did not sustain even 25 writes/s with p99 < 150 ms \
                     beside both stages: a debug build, or a stack in trouble?"
                );
            }
            eprintln!("bench sweep: capacity {c:.0} writes/s (fixed bound, both stages running)");
            (c, true)
        }
    };
    let mut api = spawn_as_deployed(settings, dir, args.write_latency_target)?;
    pids.push(("api", api.child.id()));
    let out = measure(settings, topology, args, stamp, client, capacity, &pids).await;
    stop(&mut api);
    let mut report = out?;
    report.capacity_searched = searched;
    report.write_latency_target_ms = args
        .write_latency_target
        .unwrap_or(Settings::defaults()?.api.write_latency_target)
        .as_secs_f64()
        * 1000.0;
    Ok(report)
}

/// Waits, up to a minute, until Cassandra is quiet (under a fifth of a core over 2 s): a new
/// keyspace's tables keep it busy flushing the schema for a while, and a capacity searched
/// meanwhile is that work's, not the API's (a first run here found 46 writes/s).
async fn settle() {
    let Some(pid) = super::harness::cassandra_pid() else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let before = super::scrape::cpu_seconds(pid);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let used = super::scrape::cpu_seconds(pid) - before;
        if used.is_nan() || used < 0.4 {
            return;
        }
    }
    eprintln!("bench sweep: Cassandra still busy after a minute; going on");
}

/// `likes api` with the product's admission defaults and its relay on, as deployed.
fn spawn_as_deployed(
    settings: &Settings,
    dir: &Path,
    target: Option<std::time::Duration>,
) -> Result<procs::Proc> {
    let defaults = Settings::defaults()?.api;
    let mut s = settings.clone();
    s.api.max_writes_in_flight = defaults.max_writes_in_flight;
    s.api.write_latency_target = target.unwrap_or(defaults.write_latency_target);
    s.api.max_writes_per_s = defaults.max_writes_per_s;
    s.api.max_writes_per_user_per_s = defaults.max_writes_per_user_per_s;
    super::harness::spawn_api_bin(
        &s,
        dir,
        &procs::likes_bin()?,
        "api",
        &[("LIKES__API__RELAY".into(), "true".into())],
    )
}

async fn measure(
    settings: &Settings,
    topology: &Topology,
    args: &SweepArgs,
    stamp: i64,
    client: &Client,
    capacity: f64,
    pids: &[(&'static str, u32)],
) -> Result<SweepReport> {
    super::harness::wait_ready(&client.http, &client.url).await?;
    let target = Arc::new(Target::http(settings, &client.url)?);
    let mut mix = Mix::new(MixArgs {
        items: 10_000,
        viral_share: 0.05,
        unlike_share: 0.1,
        retry_share: 0.05,
        relike_share: 0.0,
        relike_after_ms: 0,
        read_share: 0.0,
        seed: 42,
        run_id: format!("sw{stamp}"),
    });
    // Warm-up, not measured: connections, the adaptive limit, the first windows.
    let warm = Arc::new(Live::default());
    loadgen::drive(
        target.clone(),
        &mut mix,
        &[phase(capacity * 0.5, 5.0)],
        warm,
    )
    .await;
    catch_up(
        client,
        topology,
        settings,
        "warm",
        args.catch_up_timeout,
        0.0,
    )
    .await;
    let mut unloaded = client.reads_for(args.read_rate, 10).await;
    let mut report = SweepReport {
        capacity_per_s: capacity,
        window_s: topology.window.as_secs_f64(),
        level_seconds: args.level_seconds,
        reads_unloaded_p99_ms: harness::p99(&mut unloaded),
        levels: vec![Vec::new(); args.factors.len()],
        ..Default::default()
    };
    for rep in 0..args.repeats {
        let order = order(args.factors.len(), rep);
        report
            .orders
            .push(order.iter().map(|&k| args.factors[k]).collect());
        for k in order {
            let factor = args.factors[k];
            let tag = format!("{rep}-{k}");
            let run = level(
                settings, topology, args, client, &target, &mut mix, &tag, factor, capacity, pids,
            )
            .await;
            eprintln!(
                "bench sweep: repeat {}/{} at {factor}x ({:.0}/s): admitted {:.0}/s, {} shed (p99 {:.1} ms, server {:.2}), \
                 p99 {:.0} ms (server {:.0}), reads p99 {:.1} ms, staleness p99 {:.2} s, \
                 {} deferred, caught up after {:.1} s",
                rep + 1,
                args.repeats,
                run.offered_per_s,
                run.admitted_per_s,
                run.shed,
                run.shed_p99_ms,
                run.shed_server_p99_ms,
                run.client_p99_ms,
                run.server_p99_ms,
                run.reads_p99_ms,
                run.staleness_p99_s,
                run.deferred,
                run.catch_up_s
            );
            report.levels[k].push(run);
        }
    }
    Ok(report)
}

#[allow(clippy::too_many_arguments)] // one level: where, what and how much
async fn level(
    settings: &Settings,
    topology: &Topology,
    args: &SweepArgs,
    client: &Client,
    target: &Arc<Target>,
    mix: &mut Mix,
    tag: &str,
    factor: f64,
    capacity: f64,
    pids: &[(&'static str, u32)],
) -> LevelRun {
    let rate = capacity * factor;
    let before = Scrapes::now();
    let cpu = || -> Vec<f64> { pids.iter().map(|&(_, p)| cpu_seconds(p)).collect() };
    let (cpu_before, started) = (cpu(), Instant::now());
    let live = Arc::new(Live::default());
    let stop_reads = Arc::new(AtomicU64::new(0));
    let ((), mut reads) = tokio::join!(
        async {
            loadgen::drive(
                target.clone(),
                mix,
                &[phase(rate, args.level_seconds)],
                live.clone(),
            )
            .await;
            stop_reads.store(1, Ordering::Relaxed);
        },
        client.reads(args.read_rate, stop_reads.clone())
    );
    let cores: BTreeMap<String, f64> = {
        let secs = started.elapsed().as_secs_f64();
        let mut by_name = BTreeMap::new();
        for ((name, _), (a, b)) in pids.iter().zip(cpu().into_iter().zip(cpu_before)) {
            *by_name.entry(name.to_string()).or_insert(0.0) += (a - b) / secs;
        }
        by_name
    };
    let deferred = Scrapes::now().api_sum(m::API_PUBLISHES_DEFERRED)
        - before.api_sum(m::API_PUBLISHES_DEFERRED);
    let catch_up_s = catch_up(
        client,
        topology,
        settings,
        tag,
        args.catch_up_timeout,
        deferred,
    )
    .await;
    let after = Scrapes::now();
    let summary = loadgen::Summary::of(&live, Duration::from_secs_f64(args.level_seconds));
    let shed: u64 = summary
        .failures
        .iter()
        .filter(|(why, _)| why.starts_with("429") || why.starts_with("503"))
        .map(|(_, n)| n)
        .sum();
    let shed_p99_ms = live.shed_p99_ms();
    let cdf = {
        let h = live.latency_us.lock().unwrap();
        (0..=200)
            .map(|i| {
                let q = i as f64 / 200.0;
                (h.value_at_quantile(q) as f64 / 1000.0, q)
            })
            .collect()
    };
    let server = after.since(&before, Port::Api, m::API_ADMITTED_WRITE_SECONDS);
    let q = |port, name| {
        let d = after.since(&before, port, name);
        [quantile(&d, 0.5), quantile(&d, 0.99)]
    };
    let staleness = q(Port::Count, m::STALENESS_SECONDS);
    LevelRun {
        factor,
        offered_per_s: rate,
        admitted_per_s: summary.ok as f64 / args.level_seconds,
        shed,
        errors: summary.failed - shed,
        failures: summary.failures.clone(),
        client_p50_ms: if summary.ok > 0 {
            summary.p50_ms
        } else {
            f64::NAN
        },
        client_p99_ms: if summary.ok > 0 {
            summary.p99_ms
        } else {
            f64::NAN
        },
        server_p50_ms: quantile(&server, 0.5) * 1000.0,
        server_p99_ms: quantile(&server, 0.99) * 1000.0,
        shed_p99_ms,
        shed_server_p99_ms: quantile(&after.since(&before, Port::Api, m::API_SHED_SECONDS), 0.99)
            * 1000.0,
        reads_p99_ms: harness::p99(&mut reads),
        staleness_p50_s: staleness[0],
        staleness_p99_s: staleness[1],
        stage1_read_s: q(Port::Dedupe, m::EVENT_DELAY_SECONDS),
        delta_on_log_s: q(Port::Count, m::INPUT_DELAY_SECONDS),
        window_closed_s: q(Port::Count, m::WINDOW_CLOSED_SECONDS),
        deferred,
        restarts: after.stage_sum(m::STAGE_RESTARTS) - before.stage_sum(m::STAGE_RESTARTS),
        catch_up_s,
        limit_at_end: after
            .api
            .get(m::API_WRITE_LIMIT)
            .copied()
            .unwrap_or(f64::NAN),
        cores,
        cdf,
    }
}

fn phase(rate: f64, seconds: f64) -> Phase {
    Phase {
        name: "level".into(),
        seconds,
        rate,
        viral_share: 0.05,
    }
}

#[derive(Clone, Copy)]
enum Port {
    Api,
    Dedupe,
    Count,
}

/// The three processes' /metrics at one moment.
struct Scrapes {
    api: HashMap<String, f64>,
    dedupe: HashMap<String, f64>,
    count: HashMap<String, f64>,
}

impl Scrapes {
    fn now() -> Self {
        Scrapes {
            api: scrape(API_METRICS_PORT),
            dedupe: scrape(DEDUPE_PORT),
            count: scrape(COUNT_PORT),
        }
    }

    fn of(&self, port: Port) -> &HashMap<String, f64> {
        match port {
            Port::Api => &self.api,
            Port::Dedupe => &self.dedupe,
            Port::Count => &self.count,
        }
    }

    /// Histogram `name`'s buckets grown since `before`.
    fn since(&self, before: &Scrapes, port: Port, name: &str) -> Vec<(f64, f64)> {
        diff(
            &buckets(self.of(port), name),
            &buckets(before.of(port), name),
        )
    }

    /// A counter summed over its labels.
    fn sum(metrics: &HashMap<String, f64>, name: &str) -> f64 {
        let labelled = format!("{name}{{");
        metrics
            .iter()
            .filter(|(k, _)| *k == name || k.starts_with(&labelled))
            .map(|(_, v)| v)
            .sum()
    }

    fn api_sum(&self, name: &str) -> f64 {
        Self::sum(&self.api, name)
    }

    fn stage_sum(&self, name: &str) -> f64 {
        Self::sum(&self.dedupe, name) + Self::sum(&self.count, name)
    }
}

/// Waits until the pipeline has applied everything sent before it: canary likes on every
/// partition of both topics, each counted. Publishes the API deferred reach the log through
/// its relay once they are `api.relay_min_age` old, so after a level with any, the canaries
/// go out only once those are due. Returns the seconds it took, NaN past `timeout_s`.
async fn catch_up(
    client: &Client,
    topology: &Topology,
    settings: &Settings,
    tag: &str,
    timeout_s: u64,
    deferred: f64,
) -> f64 {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_s);
    if deferred > 0.0 {
        tokio::time::sleep(settings.api.relay_min_age + 2 * settings.api.relay_interval).await;
    }
    let mut pending = canaries(topology, tag);
    let sent = futures::future::join_all(pending.iter().map(|(item, user)| async move {
        while Instant::now() < deadline {
            let r = client
                .http
                .post(format!("{}/v1/items/{item}/likes", client.url))
                .bearer_auth(client.signer.sign(user, client.expires))
                .header("Idempotency-Key", format!("{item}-{user}"))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }))
    .await;
    if sent.contains(&false) {
        return f64::NAN;
    }
    let token = client.signer.sign("sweep-canary-reader", client.expires);
    while Instant::now() < deadline {
        let mut still = Vec::new();
        for (item, user) in pending {
            let counted = client
                .http
                .get(format!("{}/v1/items/{item}/count", client.url))
                .bearer_auth(&token)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success());
            let count = match counted {
                Some(r) => r
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v.get("count")?.as_i64()),
                None => None,
            };
            if count != Some(1) {
                still.push((item, user));
            }
        }
        if still.is_empty() {
            return started.elapsed().as_secs_f64();
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "bench sweep: {tag}: {} canaries not counted within {timeout_s} s",
        pending.len()
    );
    f64::NAN
}

/// A goal row: its name, how to read it from a run, the goal, decimals.
type GoalRow = (
    &'static str,
    fn(&SweepReport, &LevelRun) -> f64,
    Goal,
    usize,
);

impl SweepReport {
    /// The sweep's section of bench/report.md (and bench/sweep.md): the rows per level, then
    /// the goals with their verdicts.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let orders: Vec<String> = self
            .orders
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let o: Vec<String> = o.iter().map(|f| format!("{f}×")).collect();
                format!("repeat {}: {}", i + 1, o.join(", "))
            })
            .collect();
        let _ = writeln!(
            s,
            "`likes api` with the product's admission defaults and its relay on, `likes dedupe`, \
             `likes count`; `likes-tools loadgen`'s mix over HTTP (5% viral, 10% unlikes, 5% keyed \
             retries), open loop, {:.0} s per level, count reads at 50/s beside it. 1× = {:.0} \
             writes/s, the API's capacity ({}). Each level ends when canary likes on every \
             partition of both topics are counted; its staleness then holds all of its events. \
             The adaptive limit's target {:.0} ms. Order, interleaved: {}. Latency counts from the scheduled send; staleness is the \
             counter row's write time minus the event's time. Window {} s.\n",
            self.level_seconds,
            self.capacity_per_s,
            if self.capacity_searched {
                "p99 < 150 ms with a fixed bound, searched on this stack with both stages running"
            } else {
                "given with --capacity"
            },
            self.write_latency_target_ms,
            orders.join("; "),
            self.window_s
        );
        let _ = writeln!(
            s,
            "| offered/s (× capacity) | admitted/s | shed | errors | admitted p50 / p99 ms, client | server p50 / p99 ms | shed answered p99 ms, client / server | reads p99 ms | staleness p50 / p99 s | stage 1 reads / delta on log / window closed, p99 s | deferred publishes | stage restarts | caught up after, s |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for runs in &self.levels {
            let Some(first) = runs.first() else { continue };
            let g = |f: fn(&LevelRun) -> f64| mmm(runs.iter().map(f));
            let _ = writeln!(
                s,
                "| {:.0} ({}×) | {} | {:.0} | {:.0} | {:.1} / {} | {:.1} / {} | {} / {} | {} | {:.2} / {} | {:.2} / {:.2} / {:.2} | {:.0} | {:.0} | {} |",
                first.offered_per_s,
                first.factor,
                fig(g(|r| r.admitted_per_s), 0),
                g(|r| r.shed as f64).0,
                g(|r| r.errors as f64).0,
                g(|r| r.client_p50_ms).0,
                fig(g(|r| r.client_p99_ms), 0),
                g(|r| r.server_p50_ms).0,
                fig(g(|r| r.server_p99_ms), 0),
                fig(g(|r| r.shed_p99_ms), 1),
                fig(g(|r| r.shed_server_p99_ms), 2),
                fig(g(|r| r.reads_p99_ms), 1),
                g(|r| r.staleness_p50_s).0,
                fig(g(|r| r.staleness_p99_s), 2),
                g(|r| r.stage1_read_s[1]).0,
                g(|r| r.delta_on_log_s[1]).0,
                g(|r| r.window_closed_s[1]).0,
                g(|r| r.deferred).0,
                g(|r| r.restarts).0,
                fig(g(|r| r.catch_up_s), 1),
            );
        }
        let names: BTreeSet<&String> = self
            .levels
            .iter()
            .flatten()
            .flat_map(|r| r.cores.keys())
            .collect();
        if !names.is_empty() {
            let head: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            let _ = writeln!(
                s,
                "\nWhere the two cores went while each level's load ran, cores used (median):\n\n| offered | {} | total |\n|---|{}---|",
                head.join(" | "),
                "---|".repeat(head.len())
            );
            for runs in &self.levels {
                let Some(first) = runs.first() else { continue };
                let per: Vec<f64> = names
                    .iter()
                    .map(|n| {
                        mmm(runs
                            .iter()
                            .map(|r| r.cores.get(*n).copied().unwrap_or(f64::NAN)))
                        .0
                    })
                    .collect();
                let cells: Vec<String> = per.iter().map(|c| format!("{c:.2}")).collect();
                let _ = writeln!(
                    s,
                    "| {}× | {} | {:.2} |",
                    first.factor,
                    cells.join(" | "),
                    per.iter().filter(|c| c.is_finite()).sum::<f64>()
                );
            }
        }
        let mut failures = BTreeMap::<String, u64>::new();
        for run in self.levels.iter().flatten() {
            for (why, n) in &run.failures {
                *failures.entry(why.clone()).or_insert(0) += n;
            }
        }
        if !failures.is_empty() {
            let list: Vec<String> = failures.iter().map(|(w, n)| format!("{n} × {w}")).collect();
            let _ = writeln!(
                s,
                "\nFailed requests over every level and repeat, by reason: {}.",
                list.join("; ")
            );
        }
        let _ = writeln!(
            s,
            "\nReads alone, before the levels: p99 {:.1} ms.\n\n| offered | goal | median (min–max) | verdict |\n|---|---|---|---|",
            self.reads_unloaded_p99_ms
        );
        let rows: [GoalRow; 5] = [
            (
                "staleness p99 − window, s",
                |rep, r| r.staleness_p99_s - rep.window_s,
                Goal::at_most(1.0),
                2,
            ),
            (
                "admitted writes' p99 at the client, ms",
                |_, r| r.client_p99_ms,
                Goal::at_most(SLO_P99_MS),
                0,
            ),
            (
                "shed writes (429/503) answered, p99 ms at the client",
                |_, r| r.shed_p99_ms,
                Goal::at_most(5.0),
                1,
            ),
            (
                "the same at the server (first middleware to the answer), p99 ms",
                |_, r| r.shed_server_p99_ms,
                Goal::at_most(5.0),
                2,
            ),
            (
                "reads' p99 / unloaded reads' p99",
                |rep, r| r.reads_p99_ms / rep.reads_unloaded_p99_ms,
                Goal::at_most(2.0),
                2,
            ),
        ];
        for runs in &self.levels {
            let Some(first) = runs.first() else { continue };
            for (name, f, goal, digits) in rows {
                let v = mmm(runs.iter().map(|r| f(self, r)));
                let verdict =
                    if v.0.is_nan() && (name.starts_with("shed") || name.starts_with("the same")) {
                        "none shed".to_string()
                    } else {
                        goal.verdict(v.0)
                    };
                let _ = writeln!(
                    s,
                    "| {}× ({:.0}/s) | {name} | {} | {verdict} |",
                    first.factor,
                    first.offered_per_s,
                    fig(v, digits)
                );
            }
        }
        s
    }

    /// bench/sweep.md of a `likes-tools bench sweep` run (its plots: [`super::write_sweep`]).
    pub fn write(&self, out: &Path) -> Result<PathBuf> {
        let md = format!(
            "# The sweep of offered load through the whole system\n\nWritten by `likes-tools bench \
             sweep` (also the last part of `make bench`). Every figure is the median of {} repeats, \
             with min–max in brackets.\n\n{}\n![staleness against offered load](sweep-staleness.png)\n\
             ![admitted and shed writes' latency against offered load](sweep-latency.png)\n\
             ![admitted against offered](sweep-throughput.png)\n![latency CDF](sweep-latency-cdf.png)\n",
            self.orders.len(),
            self.table()
        );
        let path = out.join("sweep.md");
        std::fs::write(&path, md)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_repeat_interleaves_the_levels_in_its_own_rotation() {
        assert_eq!(order(5, 0), vec![0, 4, 1, 3, 2]);
        assert_eq!(order(5, 1), vec![4, 1, 3, 2, 0]);
        assert_eq!(order(5, 2), vec![1, 3, 2, 0, 4]);
        for rep in 0..7 {
            let mut o = order(4, rep);
            o.sort();
            assert_eq!(o, vec![0, 1, 2, 3], "every level once");
        }
    }

    #[test]
    fn canaries_cover_every_partition_of_both_topics() {
        use likes::hash::{bucket_of, event_key, partition_for};
        let t = Topology::parse(likes::topology::EMBEDDED, "test").unwrap();
        let c = canaries(&t, "7-1");
        let ev = t.topics.events.partitions as u32;
        let de = t.topics.deltas.partitions as u32;
        let events: BTreeSet<u32> = c
            .iter()
            .map(|(i, u)| partition_for(event_key(i, bucket_of(u, t.buckets)).as_bytes(), ev))
            .collect();
        let deltas: BTreeSet<u32> = c
            .iter()
            .map(|(i, _)| partition_for(i.as_bytes(), de))
            .collect();
        assert_eq!(events.len() as u32, ev);
        assert_eq!(deltas.len() as u32, de);
        assert!(c.len() <= (ev + de) as usize);
    }
}
