//! `likes-tools demo` (`make demo`): the whole system on the local stack, for a newcomer to watch.
//!
//! `likes api` (with the relay), `likes dedupe` and `likes count` start as processes of their
//! own, exactly as deployed. Load comes through the HTTP API: steady, then a viral burst, then
//! steady again; during the burst the count stage is killed with SIGKILL and restarted. A
//! live view shows requests and events a second, staleness at the sink and the top items with
//! their count and asOf. At the end the count of every item that moved is compared with the edges
//! (the LIKED rows in `edges`, the source of truth) once the pipeline has caught up, and the
//! verdict is printed. The processes stay up for a look; `make down` stops them and the stack.
//!
//! An account erasure runs mid-load: a user who liked the top items before the load starts is
//! erased (`POST /v1/admin/erasures`, then `likes erase` as its own process), and the verdict
//! shows each of those items' counts without that like.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod slo;

use crate::bench::scrape::{buckets, quantile, scrape};
use crate::loadgen::{self, Live, Mix, MixArgs, Phase, Target, VIRAL_ITEM};
use anyhow::{anyhow, Result};
use likes::config::Settings;
use likes::runtime::metrics as m;
use likes::store::counts::Counts;
use likes::topology::Topology;
use likes_testkit::procs::{spawn, Proc};

const DEMO_KEYSPACE: &str = "likes_demo";
const DEMO_TOPIC_PREFIX: &str = "demo.";
const API_METRICS: u16 = 9464;
const DEDUPE_METRICS: u16 = 9465;
const COUNT_METRICS: u16 = 9466;
/// How long the pipeline may take to catch up after the load before the verdict.
const CONVERGE: Duration = Duration::from_secs(120);
/// Items in the final table.
const TOP: usize = 8;

/// Where the demo keeps its pid files, logs and stage-1 state: beside the stack's, so
/// `make down` finds and stops the processes.
/// Seconds of load before the measured scenario (see `run`).
const WARMUP_SECONDS: u64 = 10;

pub fn demo_dir() -> PathBuf {
    likes_testkit::stack::dir().join("demo")
}

/// Stops the processes an earlier demo left (by their pid files, only if still `likes`).
fn stop_earlier(dir: &Path) {
    for name in ["api", "dedupe", "count"] {
        let file = dir.join(format!("{name}.pid"));
        let Ok(pid) = std::fs::read_to_string(&file) else {
            continue;
        };
        let pid = pid.trim();
        let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains("likes"))
            .unwrap_or(false);
        if ours {
            let _ = Command::new("kill").args(["-TERM", pid]).status();
            for _ in 0..100 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = std::fs::remove_file(file);
    }
}

/// Runs the scenario; true when every item's count equals its LIKED edges.
pub async fn run(base: &Settings, topology: &Topology, seconds: u64, rate: f64) -> Result<bool> {
    let mut settings = base.clone();
    // A namespace of its own: the verdict compares counts with edges, so events produced
    // into the default topics by anything else (`likes-tools loadgen --kafka`, tests of a
    // deployment) must not reach the demo's counters.
    settings.cql.keyspace = DEMO_KEYSPACE.into();
    settings.kafka.topic_prefix = DEMO_TOPIC_PREFIX.into();
    if settings.api.session_key.is_empty() {
        settings.api.session_key = format!("demo-{:032x}", rand::random::<u128>());
    }
    if settings.api.admin_token.len() < 32 {
        settings.api.admin_token = format!("demo-admin-{:032x}", rand::random::<u128>());
    }
    let dir = demo_dir();
    std::fs::create_dir_all(&dir).map_err(|e| anyhow!(format!("{}: {e}", dir.display())))?;
    stop_earlier(&dir);

    say("demo: schema and topics");
    let (session, said) = likes_testkit::namespace::create(&settings, topology, false).await?;
    for line in said {
        say(&format!("demo: {line}"));
    }

    let common = |metrics: u16| process_env(&settings, &dir, metrics);
    say("demo: starting likes api (with the relay), likes dedupe, likes count");
    let mut procs = vec![
        spawn("api", "api", &dir, &common(API_METRICS))?,
        spawn("dedupe", "dedupe", &dir, &common(DEDUPE_METRICS))?,
        spawn("count", "count", &dir, &common(COUNT_METRICS))?,
    ];
    let url = format!("http://{}", settings.api.listen);
    wait_ready(&url, &mut procs, &dir).await?;

    let counts = Counts::prepare(session.clone(), &settings.cql.keyspace).await?;
    let erasure = Erasure::before_load(&settings, topology, &url).await?;
    say(&format!(
        "demo: {} liked {} top items; it will be erased mid-load",
        erasure.user,
        erasure.items.len()
    ));

    let sc = Scenario::new(seconds as f64, rate);
    // Every request's outcome is kept: the verdict judges the writes' SLOs from them.
    let live = Arc::new(Live::keeping_answers());
    let target = Arc::new(Target::http(&settings, &url)?);
    let mut mix = Mix::new(MixArgs {
        items: 200,
        viral_share: 0.05,
        unlike_share: 0.1,
        retry_share: 0.05,
        relike_share: 0.0,
        relike_after_ms: 0,
        read_share: 0.0,
        seed: likes::runtime::clock::now_ms() as u64,
        run_id: format!("demo{}", likes::runtime::clock::now_ms()),
    });
    say(&format!(
        "demo: load {rate:.0} requests/s steady, {:.0}/s in the viral burst, for {seconds} s (--rate); a {} build",
        rate * 2.0,
        if cfg!(debug_assertions) {
            "debug (make demo's; users deploy a release build)"
        } else {
            "release"
        }
    ));
    // On a fresh machine Cassandra's and Kafka's JVMs are cold: the first run's live view
    // showed p50 300 ms / p99 1 s against 6 / 80 ms on the second (issue 26). A warm-up at
    // the demo's rate, neither shown nor measured (its likes are counted and checked like the
    // rest), so the view shows the system as it runs rather than as its JVMs compile.
    say(&format!(
        "demo: warming up for {WARMUP_SECONDS} s at {rate:.0} requests/s (not shown or measured)"
    ));
    let warm_up = [Phase {
        name: "warm-up".into(),
        seconds: WARMUP_SECONDS as f64,
        rate,
        viral_share: 0.05,
    }];
    loadgen::drive(
        target.clone(),
        &mut mix,
        &warm_up,
        Arc::new(Live::default()),
    )
    .await;
    let started = Instant::now();
    let load = {
        let (live, phases) = (live.clone(), sc.phases.clone());
        tokio::spawn(async move { loadgen::drive(target, &mut mix, &phases, live).await })
    };

    let mut staleness = slo::Staleness::default();
    let mut watch = Watch {
        staleness: &mut staleness,
        procs: &mut procs,
        dir: &dir,
        env: &common(COUNT_METRICS),
        counts: &counts,
        topology,
        live: &live,
        sc: &sc,
        erasure: &erasure,
    };
    watch.run(&load, started).await?;
    let _ = load.await;
    erasure.finish(&mut procs).await?;
    let summary = loadgen::Summary::of(&live, started.elapsed());
    say(&format!("\n{summary}"));

    let counts_ok = verdict(&session, &live, &erasure).await?;
    // The flips of the load's last windows reached the sink while the verdict waited.
    staleness.observe(buckets(&scrape(COUNT_METRICS), m::STALENESS_SECONDS), false);
    let kill = (
        sc.kill_at.as_secs_f64(),
        (sc.restart_at + slo::RECOVERY).as_secs_f64(),
    );
    let rows = slo::judge(&live.availability(0.0, f64::INFINITY), &staleness, kill);
    // Where the writes' tail is: the answers' due times count from the warm-up's start.
    let offset = (started - live.t0).as_secs_f64();
    let stretch = |from: f64, to: f64| live.availability(offset + from, offset + to);
    let (before, during, after) = (
        stretch(0.0, kill.0),
        stretch(kill.0, kill.1),
        stretch(kill.1, f64::INFINITY),
    );
    say(&format!(
        "\nwrites by stretch (2xx, accepted p99): before the kill {:.2} %, {:.1} ms; the kill's seconds {:.2} %, {:.1} ms; after {:.2} %, {:.1} ms",
        before.ratio * 100.0,
        before.ok_p99_ms,
        during.ratio * 100.0,
        during.ok_p99_ms,
        after.ratio * 100.0,
        after.ok_p99_ms
    ));
    let mut table =
        "\n| the design's SLO, at the demo's load | measured | |\n|---|---|---|\n".to_string();
    for r in &rows {
        table += &format!(
            "| {} | {} | {} |\n",
            r.what,
            r.measured,
            if r.met { "met" } else { "NOT MET" }
        );
    }
    say(&table);
    let missed: Vec<&str> = rows
        .iter()
        .filter(|r| !r.met)
        .map(|r| r.what.as_str())
        .collect();
    let ok = counts_ok && missed.is_empty();
    say(&format!(
        "verdict: {}",
        match (counts_ok, missed.is_empty()) {
            (true, true) => "OK: every count equals its edges, across the viral burst, the kill -9 of the count stage and the erasure; every SLO met".to_string(),
            (false, _) => "MISMATCH: some counts differ from their edges (table above)".to_string(),
            (true, false) => format!("SLO NOT MET: the counts are exact, but not within the design's SLOs: {}", missed.join("; ")),
        }
    ));
    say(&format!(
        "\nStill running, for a look:\n  likes api     {url}  (try: curl {url}/v1/items/{VIRAL_ITEM}/count)\n  /metrics      http://127.0.0.1:{API_METRICS}/metrics (api)  :{DEDUPE_METRICS} (dedupe)  :{COUNT_METRICS} (count)\n  namespace     keyspace {DEMO_KEYSPACE}, topics {DEMO_TOPIC_PREFIX}*\n  logs          {}\nStop everything (these processes, Kafka, Cassandra): make down",
        dir.display()
    ));
    Ok(ok)
}

/// The scenario: a third steady, a viral burst at twice the rate, the rest steady; the count
/// stage is killed a quarter into the burst and restarted seven seconds later.
struct Scenario {
    seconds: f64,
    phases: Vec<Phase>,
    kill_at: Duration,
    restart_at: Duration,
}

impl Scenario {
    fn new(s: f64, rate: f64) -> Self {
        let kill_at = Duration::from_secs_f64(s / 3.0 + s / 16.0);
        Scenario {
            seconds: s,
            phases: loadgen::with_burst(s, s / 3.0, s / 4.0, rate, 2.0, 0.5),
            kill_at,
            restart_at: kill_at + Duration::from_secs(7),
        }
    }
}

/// The environment of the demo's processes: its namespace, the metrics port, the relay on.
fn process_env(settings: &Settings, dir: &Path, metrics: u16) -> Vec<(String, String)> {
    likes_testkit::procs::env_in(
        DEMO_KEYSPACE,
        DEMO_TOPIC_PREFIX,
        [
            ("LIKES__METRICS__LISTEN", format!("127.0.0.1:{metrics}")),
            ("LIKES__API__SESSION_KEY", settings.api.session_key.clone()),
            ("LIKES__API__ADMIN_TOKEN", settings.api.admin_token.clone()),
            ("LIKES__API__RELAY", "true".to_string()),
            (
                "LIKES__DEDUPE__STATE_DIR",
                // Stage 1's state belongs to its topics: named after the namespace.
                dir.join(format!("dedupe-state-{DEMO_KEYSPACE}"))
                    .display()
                    .to_string(),
            ),
            ("RUST_LOG", "info".to_string()),
        ],
    )
}

/// The live part of the demo: the kill and restart of the count stage, and a frame a second.
struct Watch<'a> {
    staleness: &'a mut slo::Staleness,
    procs: &'a mut Vec<Proc>,
    dir: &'a Path,
    env: &'a [(String, String)],
    counts: &'a Counts,
    topology: &'a Topology,
    live: &'a Live,
    sc: &'a Scenario,
    erasure: &'a Erasure,
}

impl Watch<'_> {
    async fn run(&mut self, load: &tokio::task::JoinHandle<()>, started: Instant) -> Result<()> {
        let tty = std::io::stdout().is_terminal();
        let mut view = View::default();
        let mut killed: Option<Instant> = None;
        let mut restarted = false;
        let mut frame = 0u64;
        while !load.is_finished() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let t = started.elapsed();
            let mut event = None;
            if killed.is_none() && t >= self.sc.kill_at {
                let count = self
                    .procs
                    .iter_mut()
                    .find(|p| p.name == "count")
                    .expect("count runs");
                // Child::kill is SIGKILL: the stage gets no chance to commit or clean up.
                let _ = count.child.kill();
                let _ = count.child.wait();
                killed = Some(Instant::now());
                event = Some(format!("kill -9 of likes count (pid {})", count.child.id()));
            }
            if !restarted && t >= self.sc.restart_at {
                let i = self
                    .procs
                    .iter()
                    .position(|p| p.name == "count")
                    .expect("count runs");
                self.procs[i] = spawn("count", "count", self.dir, self.env)?;
                restarted = true;
                event = Some(format!(
                    "likes count restarted (pid {})",
                    self.procs[i].child.id()
                ));
            }
            if self.erasure.id.lock().unwrap().is_none() && t.as_secs_f64() >= self.sc.seconds * 0.7
            {
                let id = self.erasure.request().await?;
                self.procs
                    .push(spawn("erase", "erase", self.dir, self.env)?);
                event = Some(format!(
                    "erasure {id} of {} requested; likes erase started",
                    self.erasure.user
                ));
            }
            let phase = phase_at(&self.sc.phases, t);
            let status =
                match (killed, restarted) {
                    (Some(_), false) => "count stage: DOWN (killed with kill -9)".to_string(),
                    (Some(k), true) => format!(
                    "count stage: restarted {:.0} s after its kill -9; it resumes from its last commit",
                    (self.sc.restart_at - self.sc.kill_at).as_secs_f64().min(k.elapsed().as_secs_f64())
                ),
                    _ => format!(
                        "count stage: up (kill -9 at t={:.0}s)",
                        self.sc.kill_at.as_secs_f64()
                    ),
                };
            let top = top_items(self.live, 5);
            let rows = read_counts(self.counts, self.topology, &top).await;
            // One scrape of the sink's staleness a frame, for the view and the verdict.
            let staleness = buckets(&scrape(COUNT_METRICS), m::STALENESS_SECONDS);
            let in_kill = killed.is_some() && t < self.sc.restart_at + slo::RECOVERY;
            self.staleness.observe(staleness.clone(), in_kill);
            let mut text = view.render(
                &staleness,
                t,
                self.sc.seconds,
                &phase,
                &status,
                self.live,
                &rows,
                event.as_deref(),
            );
            if let Some(line) = self.erasure.status().await {
                text = text.trim_end().to_string() + "\n" + &line + "\n\n";
            }
            frame += 1;
            if tty {
                print!("\x1b[H\x1b[2J{text}");
            } else if frame.is_multiple_of(5) || event.is_some() {
                // A log, not a screen: a frame every 5 s, and every kill or restart.
                print!("{text}");
            }
            let _ = std::io::stdout().flush();
        }
        Ok(())
    }
}

/// Every item that moved (a counter row or a LIKED edge) against its edges, once caught
/// up; prints a table of the top items and any that differ. True when all agree.
async fn verdict(
    session: &Arc<scylla::client::session::Session>,
    live: &Live,
    erasure: &Erasure,
) -> Result<bool> {
    // The verdict: every item that moved (a counter row or a LIKED edge) against its
    // edges, once caught up; the table shows the top items and any that differ.
    let mut top = top_items(live, TOP);
    for item in &erasure.items {
        if !top.contains(item) {
            top.push(item.clone());
        }
    }
    say(&format!(
        "\ndemo: load done; waiting up to {} s for the pipeline to catch up (windows close, the relay publishes)",
        CONVERGE.as_secs()
    ));
    let deadline = Instant::now() + CONVERGE;
    let (rows, checked, ok) = loop {
        let (expected, counted) =
            likes_testkit::namespace::edges_and_counts(session, DEMO_KEYSPACE).await?;
        let items: std::collections::BTreeSet<&String> =
            expected.keys().chain(counted.keys()).collect();
        let mut rows = Vec::new();
        let mut bad = 0;
        for item in &items {
            let want = expected.get(*item).copied().unwrap_or(0);
            let (count, as_of) = counted.get(*item).copied().unwrap_or((0, None));
            let differs = want != count;
            bad += usize::from(differs);
            if top.contains(item) || (differs && bad <= 20) {
                rows.push(((*item).clone(), want, count, as_of));
            }
        }
        let left = erasure.liked_left(session).await?;
        let ok = bad == 0 && left == 0;
        if ok || Instant::now() > deadline {
            break (rows, items.len(), ok);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let mut table = format!(
        "\n| item | expected (LIKED edges) | counted | {}'s like (before → after erasure) | asOf |\n|---|---|---|---|---|\n",
        erasure.user
    );
    for (item, expected, count, as_of) in &rows {
        let erased = match erasure.likes_now(session, item).await? {
            Some(now) => format!("1 → {}", u8::from(now)),
            None => "-".into(),
        };
        table += &format!(
            "| {item} | {expected} | {count} | {erased} | {} |{}\n",
            as_of.map(fmt_time).unwrap_or_else(|| "-".into()),
            if expected == count { "" } else { " MISMATCH" }
        );
    }
    let left = erasure.liked_left(session).await?;
    say(&format!(
        "erasure: {} liked {} items before the load (each like answered changed: true); LIKED edges of that user now: {left}. Each of those items' count equals its LIKED edges, which no longer hold that like: the count dropped by exactly it",
        erasure.user,
        erasure.items.len()
    ));
    say(&table);
    say(&format!(
        "checked {checked} items: every item with a counter row or a LIKED edge"
    ));
    say(&format!(
        "counts: {}",
        if ok {
            "every count equals its edges"
        } else {
            "MISMATCH: some counts differ from their edges"
        }
    ));
    Ok(ok)
}

fn say(line: &str) {
    println!("{line}");
}

fn fmt_time(ms: i64) -> String {
    let age = (likes::runtime::clock::now_ms() - ms) as f64 / 1000.0;
    format!("{age:.1} s ago")
}

fn phase_at(phases: &[Phase], t: Duration) -> String {
    let mut end = 0.0;
    for p in phases {
        end += p.seconds;
        if t.as_secs_f64() < end {
            return format!(
                "{} ({:.0} req/s, {:.0}% of likes to {VIRAL_ITEM})",
                p.name,
                p.rate,
                p.viral_share * 100.0
            );
        }
    }
    "finishing the requests in flight".into()
}

pub(super) async fn wait_ready(url: &str, procs: &mut [Proc], dir: &Path) -> Result<()> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        for p in procs.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(anyhow!(format!(
                    "likes {} exited ({status}) while starting; see {}",
                    p.name,
                    dir.join(format!("{}.log", p.name)).display()
                )));
            }
        }
        if Instant::now() > deadline {
            return Err(anyhow!("likes api ready at {url}: timed out after 90 s"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The items with the most acknowledged net likes so far.
fn top_items(live: &Live, n: usize) -> Vec<String> {
    let net = live.net_by_item.lock().unwrap();
    let mut v: Vec<(&String, &i64)> = net.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.into_iter().take(n).map(|(k, _)| k.clone()).collect()
}

/// (item, count, asOf ms) from `like_counts`; 0 and None before its first window (or
/// when the read fails: the view goes on).
async fn read_counts(
    counts: &Counts,
    topology: &Topology,
    items: &[String],
) -> Vec<(String, i64, Option<i64>)> {
    let mut out = Vec::new();
    for item in items {
        let (count, as_of) = counts
            .read(topology.counter_shard(item), item)
            .await
            .unwrap_or((0, None));
        out.push((item.clone(), count, as_of));
    }
    out
}

/// The live view: rates from counter deltas between frames, staleness over the last 5 s.
#[derive(Default)]
struct View {
    last_ok: u64,
    last_events: f64,
    last_at: Option<Instant>,
    staleness: Vec<Vec<(f64, f64)>>,
}

impl View {
    #[allow(clippy::too_many_arguments)]
    fn render(
        &mut self,
        staleness: &[(f64, f64)],
        t: Duration,
        total: f64,
        phase: &str,
        status: &str,
        live: &Live,
        rows: &[(String, i64, Option<i64>)],
        event: Option<&str>,
    ) -> String {
        let now = Instant::now();
        let dt = self
            .last_at
            .map(|a| now.duration_since(a).as_secs_f64())
            .unwrap_or(1.0)
            .max(1e-3);
        self.last_at = Some(now);
        let ok = live.ok.load(Ordering::Relaxed);
        let req_rate = (ok - self.last_ok.min(ok)) as f64 / dt;
        self.last_ok = ok;
        let dedupe = scrape(DEDUPE_METRICS);
        let events = dedupe.get(m::EVENTS_IN).copied().unwrap_or(0.0);
        let ev_rate = (events - self.last_events).max(0.0) / dt;
        self.last_events = events;
        self.staleness.push(staleness.to_vec());
        if self.staleness.len() > 6 {
            self.staleness.remove(0);
        }
        // Over the last 5 s.
        let recent = slo::since(staleness, &self.staleness[0]);
        let (p50, p99) = (quantile(&recent, 0.5), quantile(&recent, 0.99));
        let lat = live.latency_us.lock().unwrap();
        let mut out = format!(
            "likes-tools demo  t = {:>3.0} s of {total:.0}   {phase}\n{status}\n",
            t.as_secs_f64()
        );
        if let Some(e) = event {
            out += &format!(">>> {e}\n");
        }
        out += &format!(
            "requests  {ok} ok, {} failed, {req_rate:.0}/s now; latency p50 {:.1} ms, p99 {:.1} ms\n",
            live.failed.load(Ordering::Relaxed),
            lat.value_at_quantile(0.5) as f64 / 1000.0,
            lat.value_at_quantile(0.99) as f64 / 1000.0,
        );
        out += &format!(
            "events    {ev_rate:.0}/s into stage 1; staleness at the sink (last 5 s): p50 {}  p99 {}\n",
            secs(p50),
            secs(p99)
        );
        out += "top items            count   asOf\n";
        for (item, count, as_of) in rows {
            out += &format!(
                "  {item:<18} {count:>5}   {}\n",
                as_of
                    .map(fmt_time)
                    .unwrap_or_else(|| "no window yet".into())
            );
        }
        out += "\n";
        out
    }
}

fn secs(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.2} s")
    }
}

/// The account erased mid-load: it likes the top items first (the viral one and the head of
/// the zipf), then an operator requests its erasure and `likes erase` works it.
struct Erasure {
    user: String,
    items: Vec<String>,
    http: reqwest::Client,
    url: String,
    admin_token: String,
    /// The user's bucket: where its edge rows are.
    bucket: i32,
    id: std::sync::Mutex<Option<String>>,
}

impl Erasure {
    async fn before_load(settings: &Settings, topology: &Topology, url: &str) -> Result<Self> {
        let user = format!("celebrity-{}", likes::runtime::clock::now_ms());
        let mut items = vec![VIRAL_ITEM.to_string()];
        items.extend((1..=10).map(|i| format!("item-{i}")));
        let signer = likes::api::auth::Signer::from_session_key(&settings.api.session_key)?;
        let token = signer.sign(&user, likes::runtime::clock::now_ms() / 1000 + 3600);
        let http = reqwest::Client::new();
        for item in &items {
            let r = http
                .post(format!("{url}/v1/items/{item}/likes"))
                .bearer_auth(&token)
                .header("Idempotency-Key", format!("{user}-{item}"))
                .send()
                .await?;
            let answer: serde_json::Value = r.json().await.unwrap_or_default();
            if answer["changed"] != serde_json::json!(true) {
                return Err(anyhow!("{user} liking {item}: {answer}"));
            }
        }
        Ok(Self {
            items,
            http,
            url: url.to_string(),
            admin_token: settings.api.admin_token.clone(),
            bucket: likes::hash::bucket_of(&user, topology.buckets) as i32,
            id: std::sync::Mutex::new(None),
            user,
        })
    }

    /// `POST /v1/admin/erasures`: the erasure's id.
    async fn request(&self) -> Result<String> {
        let r = self
            .http
            .post(format!("{}/v1/admin/erasures", self.url))
            .header("X-Admin-Token", &self.admin_token)
            .json(&serde_json::json!({ "userId": self.user }))
            .send()
            .await?;
        if r.status() != reqwest::StatusCode::ACCEPTED {
            return Err(anyhow!("requesting the erasure: {}", r.status()));
        }
        let body: serde_json::Value = r.json().await?;
        let id = body["id"].as_str().unwrap_or_default().to_string();
        *self.id.lock().unwrap() = Some(id.clone());
        Ok(id)
    }

    /// `GET /v1/admin/erasures/{id}`, as a line of the live view.
    async fn status(&self) -> Option<String> {
        let id = self.id.lock().unwrap().clone()?;
        let r = self
            .http
            .get(format!("{}/v1/admin/erasures/{id}", self.url))
            .header("X-Admin-Token", &self.admin_token)
            .send()
            .await
            .ok()?;
        let e: serde_json::Value = r.json().await.ok()?;
        Some(format!(
            "erasure   {id} of {}: {} (items walked {}, unliked {})",
            self.user, e["state"], e["walked"], e["unliked"]
        ))
    }

    /// Waits for `likes erase` to finish its walk (the purge is days later, by design).
    async fn finish(&self, procs: &mut [Proc]) -> Result<()> {
        let Some(p) = procs.iter_mut().find(|p| p.name == "erase") else {
            return Err(anyhow!(
                "the erasure was never requested (a run shorter than the scenario?)"
            ));
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = p.child.try_wait()? {
                if !status.success() {
                    return Err(anyhow!("likes erase failed ({status}); see its log"));
                }
                break;
            }
            if Instant::now() > deadline {
                return Err(anyhow!("likes erase still running after 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if let Some(line) = self.status().await {
            say(&format!("demo: {line}"));
        }
        Ok(())
    }

    /// Whether the erased user's edge on `item` is LIKED now (None: not one of its items).
    async fn likes_now(
        &self,
        session: &Arc<scylla::client::session::Session>,
        item: &str,
    ) -> Result<Option<bool>> {
        if !self.items.iter().any(|i| i == item) {
            return Ok(None);
        }
        let store = likes::store::edges::Edges::prepare(session.clone(), DEMO_KEYSPACE).await?;
        Ok(Some(
            store
                .read(item, self.bucket, &self.user)
                .await?
                .is_some_and(|e| e.liked),
        ))
    }

    /// LIKED edges the erased user still has (0 once erased).
    async fn liked_left(&self, session: &Arc<scylla::client::session::Session>) -> Result<usize> {
        let store = likes::store::edges::Edges::prepare(session.clone(), DEMO_KEYSPACE).await?;
        let mut left = 0;
        for item in &self.items {
            if store
                .read(item, self.bucket, &self.user)
                .await?
                .is_some_and(|e| e.liked)
            {
                left += 1;
            }
        }
        Ok(left)
    }
}
