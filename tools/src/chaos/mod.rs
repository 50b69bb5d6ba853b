//! `likes-tools chaos` (`make chaos`): the whole system under load while faults drawn from a seed
//! strike it, then a verdict from a full scan.
//!
//! Each run starts `likes api` (with the relay), `likes dedupe` and `likes count` as processes
//! in a namespace of its own (keyspace and topic prefix), drives likes, unlikes and keyed
//! retries through the HTTP API (zipf items, one viral), and meanwhile kills: each process
//! with kill -9 (two dedupe instances, so partitions move between them), dedupe together
//! with its local state, the Kafka broker and Cassandra with kill -9 (started again after a
//! few seconds), and a stage's group reset to an earlier time with `likes replay`. Processes are restarted as Kubernetes would,
//! on exit after a backoff, and the report says how often each was and whether it ever
//! exited on its own. Then it waits for the pipeline to drain and checks every item (see
//! [`check`]). A seed always draws the same faults at the same moments, so a failing seed
//! replays its schedule; the load's timing is the machine's.

mod check;
mod cluster;
mod faults;
mod history;
mod strikes;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::demo::wait_ready;
use crate::loadgen::{self, Live, Mix, MixArgs, Target};
use anyhow::{anyhow, Context, Result};
use faults::{Fleet, Planned};
use likes::config::Settings;
use likes::runtime::shutdown::CancellationToken;
use likes::topology::Topology;

/// How long the pipeline may take to drain after the load (the relay leaves entries younger
/// than `api.relay_min_age`, a stage may be in its backoff).
const DRAIN: Duration = Duration::from_secs(240);

/// What to run.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// The first run's seed; run k uses seed + k.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs, one after another.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 90)]
    pub seconds: u64,
    /// Requests a second (the viral quarter of a run offers 1.5x).
    #[arg(long, default_value_t = 150.0)]
    pub rate: f64,
    /// Faults per run besides the broker and the Cassandra kill every run has.
    #[arg(long, default_value_t = 4)]
    pub extra_faults: usize,
    /// Run on the replicated stack (`make up-cluster`: 3 brokers, 3 Cassandra nodes, RF 3)
    /// with its faults: leader bounces, a Cassandra node killed, partitions, pauses, skews.
    #[arg(long)]
    pub cluster: bool,
    /// Replicated stack: the widest clock skew a fault gives a process, seconds; the run's
    /// `cql.max_clock_skew` (the bound the processes check) is set to it.
    #[arg(long, default_value_t = 10)]
    pub max_skew_s: u64,
    /// No fault at all: the load and the checks alone (`make chaos-selftest`).
    #[arg(long)]
    pub no_faults: bool,
    /// Where the JSON report goes (rewritten after each run).
    #[arg(long, default_value = "chaos-report.json")]
    pub report: PathBuf,
    /// A short dedupe horizon for the run's processes, in seconds (default: the topology's,
    /// 7 days), so flips of edges whose stage-1 state expired happen under the faults.
    #[arg(long)]
    pub horizon: Option<u64>,
    /// API processes producing for the same edges (the first also runs the relay; requests
    /// go to one at random).
    #[arg(long, default_value_t = 3)]
    pub apis: usize,
    /// How far the last API process's clock is off, ms (test builds: `make chaos` builds
    /// with fail points).
    #[arg(long, default_value_t = 1500, allow_hyphen_values = true)]
    pub skew_ms: i64,
    /// The stack script that starts the broker and Cassandra again [default: this
    /// checkout's stack/stack.sh].
    #[arg(long)]
    pub stack_script: Option<PathBuf>,
    /// Share of requests that are the actor's own read of an edge it wrote (checked with the
    /// writes for linearizability).
    #[arg(long, default_value_t = 0.15)]
    pub read_share: f64,
    /// The linearizability checker [default: $LIKES_CACHE/bin/likes-linearizability, which
    /// `make chaos-build` builds from tools/linearizability].
    #[arg(long)]
    pub checker: Option<PathBuf>,
    /// Fail points armed in every API process (FAILPOINTS syntax; fail-point builds): e.g.
    /// `api-lose-write=2%return` acknowledges writes it never makes, which the run must report.
    #[arg(long)]
    pub api_failpoints: Option<String>,
    /// Fail points armed in both stage-1 processes (FAILPOINTS syntax; fail-point builds):
    /// e.g. `dedupe-drop-delta=1*return` loses one delta, which the exactness checks must
    /// report (`make chaos-selftest`).
    #[arg(long)]
    pub stage_failpoints: Option<String>,
}

/// One run's report.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub namespace: String,
    pub requests_sent: u64,
    pub requests_ok: u64,
    pub requests_failed: u64,
    pub failures: std::collections::BTreeMap<String, u64>,
    /// The seed's schedule.
    pub planned: Vec<Planned>,
    /// What struck and when (a fault waits while the broker or Cassandra is down).
    pub struck: Vec<Planned>,
    /// Per process: restarts, and exits it made on its own (status each).
    pub processes: Vec<ProcessReport>,
    /// The dedupe horizon the run's processes had, seconds.
    pub horizon_s: u64,
    /// Seconds from the end of the load until every count equalled its edges (None: never).
    pub drained_after_s: Option<f64>,
    /// What `likes reconcile --dead-letters` did when the pipeline alone did not drain
    /// (flips dead-lettered past a short horizon are the recount queue's, by design).
    pub recount_queue: Option<String>,
    /// The pipeline by itself, before any reconcile or recount job, counted every item as
    /// its LIKED edges: the drain converged without the recount queue and stage 1's deltas
    /// alone (no correction) equal the edges of every item. Required unless the run has a
    /// short horizon, past which flips are the recount queue's by design.
    pub pipeline_alone_exact: bool,
    /// Items whose count trailed or differed from their edges right after each outage ended
    /// (the pipeline's lag included), the most of any.
    pub max_items_behind_mid_run: usize,
    /// Writes while the broker or Cassandra was down: a broker outage must not take writes
    /// down (only the count lags); a Cassandra outage does, failing fast.
    pub outages: Vec<Outage>,
    pub verdict: check::Verdict,
    /// The client history, edge by edge: linearizable as a register with request keys.
    pub linearizability: history::Linearizability,
    pub passed: bool,
    pub logs: String,
}

/// One dependency outage of a run, and the writes scheduled while it lasted.
#[derive(Debug, Clone, Serialize)]
pub struct Outage {
    pub dependency: &'static str,
    /// From the kill to the stack's start returning, seconds after the load began.
    pub from_s: f64,
    pub to_s: f64,
    pub writes: loadgen::Availability,
    /// The same for the stretch as long before it (the baseline it is read against).
    pub before: loadgen::Availability,
}

impl std::fmt::Display for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} down {:.0} s (t={:.0}-{:.0} s): writes {}/{} ok ({:.1} %), p99 {:.0} ms; before it {:.1} %, p99 {:.0} ms",
            self.dependency,
            self.to_s - self.from_s,
            self.from_s,
            self.to_s,
            self.writes.ok,
            self.writes.requests,
            self.writes.ratio * 100.0,
            self.writes.ok_p99_ms,
            self.before.ratio * 100.0,
            self.before.ok_p99_ms
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessReport {
    pub process: &'static str,
    pub restarts: u32,
    pub exits_on_its_own: Vec<String>,
}

/// Runs `args.runs` seeds one after another; true when every run passed. Writes the JSON
/// report after each run, so a long series killed halfway keeps what it did.
pub async fn run(base: &Settings, topology: &Topology, args: &ChaosArgs) -> Result<bool> {
    let mut reports = Vec::new();
    // A Ctrl-C or SIGTERM is caught, not fatal: the run under way ends early and still stops
    // the processes it started (they are in process groups of their own); no run follows.
    let interrupted = likes::runtime::shutdown::on_signal();
    for k in 0..args.runs {
        if interrupted.is_cancelled() {
            break;
        }
        let seed = args.seed + k;
        say(&format!("chaos: run {}/{} (seed {seed})", k + 1, args.runs));
        let r = match run_one(base, topology, args, seed, &interrupted).await {
            Ok(r) => r,
            Err(e) => {
                // Nothing left cut off for whatever runs next on this machine.
                if args.cluster {
                    cluster::teardown();
                }
                return Err(e);
            }
        };
        say(&format!(
            "chaos: seed {seed} (horizon {} s): {} — {} requests ({} ok), {} faults, drift {} items ({} likes), acknowledged likes lost {} of {}, unlikes lost {} of {}, likes of erased users left {}, drained {}",
            r.horizon_s,
            if r.passed { "PASS" } else { "FAIL" },
            r.requests_sent,
            r.requests_ok,
            r.struck.len(),
            r.verdict.drift_items,
            r.verdict.drift_abs,
            r.verdict.acked_likes_lost,
            r.verdict.acked_likes,
            r.verdict.acked_unlikes_lost,
            r.verdict.acked_unlikes,
            r.verdict.erased_likes_left,
            r.drained_after_s.map_or("never".into(), |s| format!("after {s:.0} s")),
        ));
        for o in &r.outages {
            say(&format!("chaos: seed {seed}: {o}"));
        }
        reports.push(r);
        let json =
            serde_json::to_string_pretty(&reports).map_err(|e| anyhow!(format!("report: {e}")))?;
        std::fs::write(&args.report, json)
            .map_err(|e| anyhow!(format!("{}: {e}", args.report.display())))?;
    }
    let failed: Vec<u64> = reports
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.seed)
        .collect();
    say(&format!(
        "chaos: {} runs, {} passed; report {}",
        reports.len(),
        reports.len() - failed.len(),
        args.report.display()
    ));
    if !failed.is_empty() {
        say(&format!(
            "chaos: failing seeds (each replays its fault schedule: likes-tools chaos --seed S): {failed:?}"
        ));
    }
    Ok(failed.is_empty())
}

/// One seeded run: its own namespace and processes, load, the faults, the drain, the checks.
async fn run_one(
    base: &Settings,
    topology: &Topology,
    args: &ChaosArgs,
    seed: u64,
    interrupted: &CancellationToken,
) -> Result<RunReport> {
    let stamp = likes::runtime::clock::now_ms() / 1000 % 1_000_000;
    let namespace = format!("chaos_{seed}_{stamp}");
    let stack_dir = likes_testkit::stack::dir();
    let dir = stack_dir.join("chaos").join(&namespace);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut settings = run_settings(base, &namespace)?;
    if args.cluster {
        cluster::preflight()?;
        settings = cluster::settings(settings, Duration::from_secs(args.max_skew_s));
    }
    let mut topology = topology.clone();
    let mut env = process_env(&settings, &dir);
    if args.cluster {
        env.extend(cluster::env(&settings));
    }
    if let Some(h) = args.horizon {
        // The run's processes read a topology of their own: the same but for the horizon.
        topology.dedupe_ttl = Duration::from_secs(h);
        let path = dir.join("topology.toml");
        let text = toml::to_string(&topology).map_err(|e| anyhow!(format!("topology: {e}")))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        env.push(("LIKES__TOPOLOGY__PATH".into(), path.display().to_string()));
        // A short horizon on purpose: stage 1 refuses one under its floor otherwise.
        env.push(("LIKES__DEDUPE__ALLOW_SHORT_HORIZON".into(), "true".into()));
    }
    let topology = &topology;
    let (session, _) = likes_testkit::namespace::create(&settings, topology, false).await?;
    let mut urls = vec![format!("http://{}", settings.api.listen)];
    // Each API's own environment: its fail points, and its address and clock after the first.
    let api_env = |mut e: Vec<(String, String)>| {
        if let Some(fp) = &args.api_failpoints {
            e.push(("FAILPOINTS".to_string(), fp.clone()));
        }
        e
    };
    let mut apis = vec![("api", api_env(Vec::new()))];
    for k in 2..=args.apis.max(1) {
        let port = free_port()?;
        urls.push(format!("http://127.0.0.1:{port}"));
        let mut e = vec![
            (
                "LIKES__API__LISTEN".to_string(),
                format!("127.0.0.1:{port}"),
            ),
            ("LIKES__API__RELAY".to_string(), "false".to_string()),
        ];
        if k == args.apis {
            e.push(("LIKES_TEST_CLOCK_SKEW_MS".into(), args.skew_ms.to_string()));
        }
        apis.push((API_NAMES[k - 2], api_env(e)));
    }
    let mut fleet = Fleet::start(&dir, env.clone(), apis, |name| {
        let mut own = Vec::new();
        if args.cluster {
            own.push((
                likes_testkit::procs::RUN_AS.to_string(),
                cluster::gid_of(name).to_string(),
            ));
        }
        if let (Some(fp), "dedupe" | "dedupe-2") = (&args.stage_failpoints, name) {
            own.push(("FAILPOINTS".to_string(), fp.clone()));
        }
        own
    })?;
    let url = urls[0].clone();
    // Readiness through the APIs only; the stages are supervised from here on.
    for u in &urls {
        wait_ready(u, &mut Vec::new(), &dir).await?;
    }

    let plan = if args.no_faults {
        Vec::new()
    } else if args.cluster {
        faults::schedule_cluster(
            seed,
            args.seconds as f64,
            args.extra_faults,
            args.max_skew_s as i64,
            settings.api.relay_min_age.as_secs(),
        )
    } else {
        faults::schedule(seed, args.seconds as f64, args.extra_faults)
    };
    say(&format!(
        "chaos: seed {seed}: {} faults planned",
        plan.len()
    ));
    for p in &plan {
        say(&format!("  t={:>5.1}s {:?}", p.at_s, p.fault));
    }
    let live = Arc::new(Live::recording_history());
    let _ = url;
    let target = Arc::new(Target::http_spread(&settings, &urls)?);
    let mut mix = Mix::new(MixArgs {
        items: 300,
        viral_share: 0.05,
        unlike_share: 0.15,
        retry_share: 0.1,
        // Likes again of unliked edges: with a short horizon, flips of edges stage 1 forgot.
        relike_share: 0.1,
        // Past a short horizon by then; the last seconds' unlikes stay, for the checks.
        relike_after_ms: 15_000,
        read_share: args.read_share,
        seed,
        run_id: format!("c{seed}x{stamp}"),
    });
    // Half steady, a quarter viral at 1.5 times the rate, the rest steady.
    let s = args.seconds as f64;
    let phases = loadgen::with_burst(s, s / 2.0, s / 4.0, args.rate, 1.5, 0.4);
    let started = Instant::now();
    let load = {
        let live = live.clone();
        tokio::spawn(async move { loadgen::drive(target, &mut mix, &phases, live).await })
    };
    let mut stack_script = (args.stack_script.clone()).unwrap_or_else(likes_testkit::stack::script);
    if args.cluster {
        stack_script = cluster::script(&stack_script);
    }
    let mut strikes = strikes::Strikes {
        settings: &settings,
        topology: topology.clone(),
        session: &session,
        dir: &dir,
        stack_dir: &stack_dir,
        stack_script: &stack_script,
        fleet: &mut fleet,
        interrupted,
        struck: Vec::new(),
        max_drift: 0,
        down_until: None,
        nodes_down: Vec::new(),
        healing: Vec::new(),
        cluster: args.cluster,
        max_skew_s: args.max_skew_s as i64,
        replaying: None,
        env: env.clone(),
        jobs: Vec::new(),
        live: live.clone(),
        erased: Vec::new(),
        outages: Vec::new(),
    };
    strikes.run(&plan, &load, started).await?;
    let jobs = std::mem::take(&mut strikes.jobs);
    let now_topology = strikes.topology.clone();
    let (mut struck, max_drift, env, erased, outages) = (
        strikes.struck,
        strikes.max_drift,
        strikes.env,
        strikes.erased,
        strikes.outages,
    );
    if interrupted.is_cancelled() {
        say("chaos: interrupted; stopping the load and the run's processes");
        load.abort();
    }
    match load.await {
        Err(e) if !e.is_cancelled() => return Err(anyhow!("the load generator failed: {e}")),
        _ => {}
    }
    let summary = loadgen::Summary::of(&live, started.elapsed());
    let outages = outages
        .into_iter()
        .map(|(dependency, from_s, to_s)| {
            let to_s = to_s.unwrap_or(from_s);
            Outage {
                dependency,
                from_s,
                to_s,
                writes: live.availability(from_s, to_s),
                before: live.availability(from_s - (to_s - from_s), from_s),
            }
        })
        .collect();
    say(&format!(
        "chaos: load done: {} sent, {} ok, {} failed; draining",
        summary.sent, summary.ok, summary.failed
    ));

    // The operations jobs started by the faults finish (they wait for the pipeline, so the
    // fleet is supervised meanwhile: a stage killed last must come back for them).
    for (at_s, name, status) in finish_jobs(jobs, &mut fleet, interrupted).await? {
        if let Some(p) = struck.iter_mut().find(|p| p.at_s == at_s) {
            let o = p.outcome.get_or_insert_with(String::new);
            if !o.is_empty() {
                o.push_str("; ");
            }
            o.push_str(&format!("{name}: {status}"));
        }
    }
    let watched = Watched {
        session: &session,
        namespace: &namespace,
        settings: &settings,
        topology: &now_topology,
    };
    let mut drained_after_s = drain(&mut fleet, &watched, interrupted).await?;
    let drained_alone = drained_after_s.is_some();
    let mut recount_queue = None;
    if drained_after_s.is_none() && !interrupted.is_cancelled() {
        // What the pipeline could not count exactly (flips dead-lettered, or counted on a
        // guess) is the recount queue's: drained as production drains it.
        say("chaos: counts still differ after the drain; draining the recount queue (likes reconcile --dead-letters)");
        let job = likes_testkit::procs::spawn_job(
            &["reconcile", "--dead-letters", "--reason", "chaos-recount"],
            "recount",
            &dir,
            &env,
        )?;
        let done = finish_jobs(vec![(0.0, job)], &mut fleet, interrupted).await?;
        recount_queue = done.into_iter().next().map(|d| d.2);
        drained_after_s = drain(&mut fleet, &watched, interrupted).await?;
    }
    let seen = live
        .edges
        .as_ref()
        .map(|e| e.lock().unwrap().clone())
        .unwrap_or_default();
    let verdict = check::verdict(&session, &settings, topology, &seen, &erased).await?;
    fleet.stop();
    if args.cluster {
        cluster::teardown();
    }
    let recorded = live
        .history
        .as_ref()
        .map(|h| std::mem::take(&mut *h.lock().unwrap()));
    let linearizability = history::check(
        &recorded.unwrap_or_default(),
        &erased,
        &dir,
        &history::checker(args.checker.as_deref()),
    )?;
    say(&format!("chaos: seed {seed}: history: {linearizability}"));
    let pipeline_alone_exact = drained_alone
        && verdict.silent_drift == 0
        && verdict.stage1_off_queued == 0
        && verdict.off_past_the_premise == 0;
    if !pipeline_alone_exact {
        say(&format!(
            "chaos: seed {seed}: the pipeline alone was not exact: drained without the recount queue {drained_alone}, stage-1 deltas off on {} items the queue names within what their flips explain, {} with a flip published past the horizon (a broker down longer than it), {} silently",
            verdict.stage1_off_queued, verdict.off_past_the_premise, verdict.silent_drift
        ));
    }
    let passed = verdict.passed()
        && linearizability.passed()
        && (pipeline_alone_exact || args.horizon.is_some());
    let processes = fleet
        .tally()
        .into_iter()
        .map(|(process, restarts, exits)| ProcessReport {
            process,
            restarts,
            exits_on_its_own: exits,
        })
        .collect();
    if passed {
        // A passing run leaves nothing behind; a failing one keeps its namespace and logs.
        let _ = likes_testkit::namespace::drop(&session, &settings, topology).await;
        let _ = std::fs::remove_dir_all(dir.join("dedupe-state"));
    }
    Ok(RunReport {
        seed,
        namespace,
        requests_sent: summary.sent,
        requests_ok: summary.ok,
        requests_failed: summary.failed,
        failures: summary.failures,
        planned: plan,
        struck,
        processes,
        horizon_s: topology.dedupe_ttl.as_secs(),
        drained_after_s,
        recount_queue,
        pipeline_alone_exact,
        max_items_behind_mid_run: max_drift,
        outages,
        verdict,
        linearizability,
        passed,
        logs: dir.display().to_string(),
    })
}

/// Names of the API processes after the first.
const API_NAMES: [&str; 7] = [
    "api-2", "api-3", "api-4", "api-5", "api-6", "api-7", "api-8",
];

/// A port for an API to listen on, below Linux's ephemeral range (32768-60999): a port the
/// kernel hands out (bind to 0) may be taken a moment later as the local end of one of the
/// many client connections the run's processes open, and the API then fails to bind it
/// (seen: "Address already in use" for one of three APIs).
fn free_port() -> Result<u16> {
    for _ in 0..200 {
        let port = rand::random_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(anyhow!("no free port in 20000-32000 after 200 tries"))
}

/// Waits for operations jobs (at most 10 minutes: each has its own wait timeout) while
/// supervising the fleet; returns (when it struck, job, how it ended) for each.
async fn finish_jobs(
    mut jobs: Vec<(f64, likes_testkit::procs::Proc)>,
    fleet: &mut Fleet,
    interrupted: &CancellationToken,
) -> Result<Vec<(f64, &'static str, String)>> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut done = Vec::new();
    while !jobs.is_empty() {
        fleet.tick()?;
        let late = Instant::now() > deadline || interrupted.is_cancelled();
        let mut i = 0;
        while i < jobs.len() {
            let (at, job) = &mut jobs[i];
            let status = match job.child.try_wait() {
                Ok(Some(s)) if s.success() => Some("ok".to_string()),
                Ok(Some(s)) => Some(format!("failed ({s})")),
                _ if late => {
                    let _ = job.child.kill();
                    let _ = job.child.wait();
                    Some("killed after 10 min (or on an interrupt)".to_string())
                }
                _ => None,
            };
            match status {
                Some(s) => {
                    done.push((*at, job.name, s));
                    jobs.swap_remove(i);
                }
                None => i += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(done)
}

/// A run's settings: its namespace, a session key, the API on a free port.
fn run_settings(base: &Settings, namespace: &str) -> Result<Settings> {
    let mut settings = base.clone();
    settings.cql.keyspace = namespace.to_string();
    settings.kafka.topic_prefix = format!("{namespace}.");
    if settings.api.session_key.is_empty() {
        settings.api.session_key = format!("chaos-{:032x}", rand::random::<u128>());
    }
    let port = free_port()?;
    settings.api.listen = format!("127.0.0.1:{port}");
    Ok(settings)
}

/// The environment of a run's processes.
fn process_env(settings: &Settings, dir: &std::path::Path) -> Vec<(String, String)> {
    likes_testkit::procs::env_in(
        &settings.cql.keyspace,
        &settings.kafka.topic_prefix,
        [
            ("LIKES__API__LISTEN", settings.api.listen.clone()),
            ("LIKES__API__SESSION_KEY", settings.api.session_key.clone()),
            ("LIKES__API__RELAY", "true".into()),
            (
                "LIKES__DEDUPE__STATE_DIR",
                dir.join("dedupe-state").display().to_string(),
            ),
            ("LIKES__DEDUPE__INSTANCE_ID", "chaos-0".into()),
            ("RUST_LOG", "info".into()),
        ],
    )
}

/// The run's namespace as the drain reads it: its counts, and its pipeline's offsets.
#[derive(Clone, Copy)]
struct Watched<'a> {
    session: &'a Arc<scylla::client::session::Session>,
    namespace: &'a str,
    settings: &'a Settings,
    /// The topology the run's processes read now (a window change records another).
    topology: &'a Topology,
}

/// Waits, supervising, until no item drifts; returns how long that took, or None when the
/// pipeline has passed a cut taken now and items still drift (what stage 1 could not count
/// exactly past a short horizon is the recount queue's: waiting longer changes nothing), or
/// [`DRAIN`] passed, or Ctrl-C.
async fn drain(
    fleet: &mut Fleet,
    watched: &Watched<'_>,
    interrupted: &CancellationToken,
) -> Result<Option<f64>> {
    let Watched {
        session,
        namespace,
        settings,
        topology,
    } = *watched;
    let load_end = Instant::now();
    // The cut is waited for beside the polls, so that the fleet stays supervised: a stage
    // killed last must come back for the pipeline to pass it.
    let (settings, topology) = (settings.clone(), topology.clone());
    let passed = tokio::spawn(async move {
        let pipeline = likes::ops::cut::Pipeline::connect(&settings, &topology).await?;
        pipeline.wait_past(likes::ops::cut::choose(), true).await
    });
    let mut passed = Some(passed);
    while load_end.elapsed() < DRAIN && !interrupted.is_cancelled() {
        fleet.tick()?;
        let finished = passed.as_ref().is_some_and(|p| p.is_finished());
        if let Ok((_, 0)) = check::drift(session, namespace).await {
            if let Some(p) = passed {
                p.abort();
            }
            return Ok(Some(load_end.elapsed().as_secs_f64()));
        }
        if finished {
            match passed.take().expect("checked").await {
                Ok(Ok(())) => return Ok(None),
                // The cut could not be waited for (its own timeout): poll until DRAIN.
                Ok(Err(e)) => say(&format!(
                    "chaos: waiting for the pipeline to pass the load's end: {e}"
                )),
                Err(e) => say(&format!("chaos: the wait for the pipeline failed: {e}")),
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if let Some(p) = passed {
        p.abort();
    }
    Ok(None)
}

pub(crate) fn say(line: &str) {
    println!("{line}");
}
