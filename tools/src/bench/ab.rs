//! `likes-tools bench ab`: two builds of `likes api` side by side (issue 45, item 5). A change
//! to the write path is judged against the build before it in one run, on one box, against
//! one stack: both APIs run at once on two ports of one namespace, and the same open-loop mix
//! (zipf items, a viral item, unlikes, retries) goes to one, then the other, in ABBA order
//! per round (BAAB the next), so a drift of the shared box over the run falls on both alike.
//!
//! Per segment: writes answered 2xx, p50 and p99 from the scheduled send (open loop), the
//! shed answers' p99, and the p99 of count reads sent beside the writes to the same API. Per
//! round: candidate / baseline ratios from the mean of each one's two segments. The report
//! gives medians with min–max over rounds.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use likes::config::Settings;
use likes::topology::Topology;

use super::harness::{spawn_api_bin, wait_ready};
use super::stats::{fig, mmm};
use crate::loadgen::{self, Live, Mix, MixArgs, Phase, Summary, Target};
use likes_testkit::procs::{likes_bin, stop};

#[derive(Debug, Clone, clap::Args)]
pub struct AbArgs {
    /// The `likes` binary to compare against (e.g. a build of the commit before the change).
    #[arg(long)]
    pub baseline: PathBuf,
    /// The `likes` binary under test (default: the one beside likes-tools, or LIKES_BIN).
    #[arg(long)]
    pub candidate: Option<PathBuf>,
    /// Requests a second to each API in its turn.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Seconds of each segment (four per round).
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Distinct items, by zipf (s = 1).
    #[arg(long, default_value_t = 200)]
    pub items: u32,
    /// Share of likes to the one viral item.
    #[arg(long, default_value_t = 0.05)]
    pub viral_share: f64,
    /// `KEY=VALUE` in the candidate's environment only (a knob the baseline lacks), repeated.
    #[arg(long = "candidate-env")]
    pub candidate_env: Vec<String>,
    /// The APIs' own admission: the default is as deployed; `--no-admission` measures the
    /// write path's latency without the adaptive limit shedding its tail.
    #[arg(long)]
    pub no_admission: bool,
    /// Count reads a second to the API in its turn, beside its writes (0: none).
    #[arg(long, default_value_t = 50.0)]
    pub reads_per_s: f64,
    /// Runs the candidate at this niceness (e.g. -10: first to the cores), same binary or
    /// not: what the API's share of a busy box does to its answers.
    #[arg(long, allow_hyphen_values = true)]
    pub candidate_nice: Option<i32>,
}

/// One segment: which build, and what its writes got.
#[derive(Debug, Clone)]
pub struct Segment {
    pub round: usize,
    pub build: &'static str,
    pub sent: u64,
    pub ok: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub shed: u64,
    /// The shed answers' p99 (NaN: none shed).
    pub shed_p99_ms: f64,
    /// The reads' p99 (NaN: no reads).
    pub reads_p99_ms: f64,
}

#[derive(Debug)]
pub struct Report {
    pub args: AbArgs,
    pub segments: Vec<Segment>,
    /// Per build, what its answered writes cost the database by kind, from its own
    /// `/metrics` over the whole run (a build older than issue 57 exports none).
    pub costs: Vec<(&'static str, Vec<KindCost>)>,
}

/// One kind of write's cost per write (src/write/spent.rs).
#[derive(Debug, Clone)]
pub struct KindCost {
    pub kind: String,
    pub writes: f64,
    pub requests: f64,
    pub waits: f64,
    pub paxos: f64,
}

/// Scrapes one API's per-kind write costs; the totals over every kind come last, as "all".
fn kind_costs(port: u16) -> Vec<KindCost> {
    let m = super::scrape::scrape(port);
    let get = |name: &str, kind: &str| {
        m.get(&format!("{name}{{kind=\"{kind}\"}}"))
            .copied()
            .unwrap_or(0.0)
    };
    let mut out: Vec<KindCost> = Vec::new();
    let mut all = KindCost {
        kind: "all".into(),
        writes: 0.0,
        requests: 0.0,
        waits: 0.0,
        paxos: 0.0,
    };
    for kind in likes::write::spent::Kind::ALL.map(|k| k.label()) {
        let writes = get("likes_api_writes_by_kind_total", kind);
        if writes == 0.0 {
            continue;
        }
        let c = KindCost {
            kind: kind.into(),
            writes,
            requests: get("likes_api_write_cql_requests_total", kind),
            waits: get("likes_api_write_cql_waits_total", kind),
            paxos: get("likes_api_write_paxos_rounds_total", kind),
        };
        all.writes += c.writes;
        all.requests += c.requests;
        all.waits += c.waits;
        all.paxos += c.paxos;
        out.push(c);
    }
    if all.writes > 0.0 {
        out.push(all);
    }
    out
}

pub async fn run(base: &Settings, topology: &Topology, args: &AbArgs) -> Result<Report> {
    if !(args.rate > 0.0 && args.seconds > 0.0 && args.rounds > 0) {
        anyhow::bail!("--rate, --seconds and --rounds must be above 0");
    }
    let candidate = match &args.candidate {
        Some(p) => p.clone(),
        None => likes_bin()?,
    };
    for bin in [&args.baseline, &candidate] {
        if !bin.is_file() {
            anyhow::bail!("{}: no such binary", bin.display());
        }
    }
    let stamp = likes::runtime::clock::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("ab{stamp}.");
    settings.cql.keyspace = format!("ab_{stamp}");
    settings.api.session_key = format!("ab-session-key-{stamp:0>24}");
    // Each user's share stays as deployed: the mix's users write a few times each, far under it.
    if args.no_admission {
        settings.api.write_latency_target = std::time::Duration::ZERO;
        settings.api.max_writes_in_flight = 20_000;
        settings.api.max_writes_per_s = 1e9;
    }
    let (session, _) = likes_testkit::namespace::create(&settings, topology, true).await?;
    let dir = std::env::temp_dir().join(format!("likes-ab-{stamp}"));
    std::fs::create_dir_all(&dir)?;
    let http = reqwest::Client::new();
    let mut apis = Vec::new();
    let mut urls = Vec::new();
    for (i, (bin, name)) in [(&args.baseline, "baseline"), (&candidate, "candidate")]
        .into_iter()
        .enumerate()
    {
        let mut s = settings.clone();
        s.api.listen = format!("127.0.0.1:{}", 19500 + i);
        s.metrics.listen = format!("127.0.0.1:{}", 19600 + i);
        let extra: Vec<(String, String)> = if name == "candidate" {
            args.candidate_env
                .iter()
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| anyhow!(format!("--candidate-env {kv}: not KEY=VALUE")))
                })
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let api = spawn_api_bin(&s, &dir, bin, name, &extra)?;
        if let (Some(n), "candidate") = (args.candidate_nice, name) {
            let st = std::process::Command::new("renice")
                .args(["-n", &n.to_string(), "-p", &api.child.id().to_string()])
                .stdout(std::process::Stdio::null())
                .status()?;
            if !st.success() {
                anyhow::bail!("renice -n {n} of the candidate: {st}");
            }
        }
        apis.push(api);
        let url = format!("http://{}", s.api.listen);
        wait_ready(&http, &url).await?;
        urls.push(url);
    }
    let targets = [
        Arc::new(Target::http(&settings, &urls[0])?),
        Arc::new(Target::http(&settings, &urls[1])?),
    ];
    let readers: Vec<_> = urls
        .iter()
        .map(|url| super::harness::Client {
            http: reqwest::Client::new(),
            url: url.clone(),
            signer: Arc::new(likes::api::auth::Signer::new(
                settings.api.session_key.as_bytes(),
            )),
            expires: likes::runtime::clock::now_ms() / 1000 + 86_400,
        })
        .collect();
    let mut mix = Mix::new(MixArgs {
        items: args.items,
        viral_share: args.viral_share,
        unlike_share: 0.1,
        retry_share: 0.05,
        relike_share: 0.0,
        relike_after_ms: 0,
        read_share: 0.0,
        seed: 45,
        run_id: format!("ab{stamp}"),
    });
    let phase = |seconds: f64| Phase {
        name: "ab".into(),
        seconds,
        rate: args.rate,
        viral_share: args.viral_share,
    };
    // Warm-up of both, not reported: prepared statements, connections, the JVMs' JIT.
    for t in &targets {
        loadgen::drive(
            t.clone(),
            &mut mix,
            &[phase(5.0)],
            Arc::new(Live::default()),
        )
        .await;
    }
    let mut segments = Vec::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [0, 1, 1, 0]
        } else {
            [1, 0, 0, 1]
        };
        for which in order {
            let live = Arc::new(Live::default());
            let started = std::time::Instant::now();
            let phases = [phase(args.seconds)];
            let drive = loadgen::drive(targets[which].clone(), &mut mix, &phases, live.clone());
            let mut reads = if args.reads_per_s > 0.0 {
                let (_, reads) = tokio::join!(
                    drive,
                    readers[which].reads_for(args.reads_per_s, args.seconds as u64)
                );
                reads
            } else {
                drive.await;
                Vec::new()
            };
            let s = Summary::of(&live, started.elapsed());
            let shed_p99_ms = live.shed_p99_ms();
            let seg = Segment {
                round,
                build: ["baseline", "candidate"][which],
                sent: s.sent,
                ok: s.ok,
                p50_ms: s.p50_ms,
                p99_ms: s.p99_ms,
                shed: live.shed_us.lock().unwrap().len(),
                shed_p99_ms,
                reads_p99_ms: super::harness::p99(&mut reads),
            };
            eprintln!("bench ab: {seg:?}");
            segments.push(seg);
        }
    }
    let costs = vec![
        ("baseline", kind_costs(19600)),
        ("candidate", kind_costs(19601)),
    ];
    for mut api in apis {
        stop(&mut api);
    }
    let _ = std::fs::remove_dir_all(&dir);
    likes_testkit::namespace::drop(&session, &settings, topology)
        .await
        .map_err(|e| anyhow!(format!("dropping the run's namespace: {e}")))?;
    Ok(Report {
        args: args.clone(),
        segments,
        costs,
    })
}

impl Report {
    fn of(&self, build: &str) -> impl Iterator<Item = &Segment> + '_ {
        let build = build.to_string();
        self.segments.iter().filter(move |s| s.build == build)
    }

    /// Per round, the candidate's mean of `f` over the baseline's.
    fn ratios(&self, f: fn(&Segment) -> f64) -> Vec<f64> {
        (0..self.args.rounds)
            .map(|r| {
                let mean = |b: &str| {
                    let v: Vec<f64> = self.of(b).filter(|s| s.round == r).map(f).collect();
                    v.iter().sum::<f64>() / v.len().max(1) as f64
                };
                mean("candidate") / mean("baseline")
            })
            .collect()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = &self.args;
        writeln!(
            f,
            "bench ab: {:.0} writes/s, {} s segments, {} rounds (ABBA, then BAAB), {} items, {:.0} % viral; admission {}; count reads {:.0}/s beside",
            a.rate,
            a.seconds,
            a.rounds,
            a.items,
            a.viral_share * 100.0,
            if a.no_admission { "off" } else { "as deployed" },
            a.reads_per_s
        )?;
        if let Some(n) = a.candidate_nice {
            writeln!(f, "candidate at niceness {n}")?;
        }
        writeln!(f, "baseline:  {}", a.baseline.display())?;
        if !a.candidate_env.is_empty() {
            writeln!(f, "candidate's environment: {}", a.candidate_env.join(" "))?;
        }
        writeln!(
            f,
            "candidate: {}",
            a.candidate
                .as_ref()
                .map_or("the likes beside likes-tools".into(), |p| p
                    .display()
                    .to_string())
        )?;
        writeln!(
            f,
            "\n| build | answered 2xx | p50 ms | p99 ms | shed | shed p99 ms | reads p99 ms |\n|---|---|---|---|---|---|---|"
        )?;
        for b in ["baseline", "candidate"] {
            let (sent, ok) = self.of(b).fold((0, 0), |(s, o), x| (s + x.sent, o + x.ok));
            writeln!(
                f,
                "| {b} | {:.3} % | {} | {} | {} | {} | {} |",
                ok as f64 / sent.max(1) as f64 * 100.0,
                fig(mmm(self.of(b).map(|s| s.p50_ms)), 1),
                fig(mmm(self.of(b).map(|s| s.p99_ms)), 1),
                self.of(b).map(|s| s.shed).sum::<u64>(),
                fig(mmm(self.of(b).map(|s| s.shed_p99_ms)), 1),
                fig(mmm(self.of(b).map(|s| s.reads_p99_ms)), 1)
            )?;
        }
        write!(
            f,
            "\ncandidate / baseline, per round: p50 {}, p99 {}, shed p99 {}, reads p99 {}",
            fig(mmm(self.ratios(|s| s.p50_ms).into_iter()), 2),
            fig(mmm(self.ratios(|s| s.p99_ms).into_iter()), 2),
            fig(mmm(self.ratios(|s| s.shed_p99_ms).into_iter()), 2),
            fig(mmm(self.ratios(|s| s.reads_p99_ms).into_iter()), 2)
        )?;
        for (build, costs) in &self.costs {
            if costs.is_empty() {
                write!(
                    f,
                    "\n\n{build}: no per-kind costs exported (a build before issue 57)"
                )?;
                continue;
            }
            write!(
                f,
                "\n\n{build}, per answered write, by kind (the whole run, warm-up included):\n| kind | writes | CQL requests | sequential waits | Paxos rounds |\n|---|---|---|---|---|"
            )?;
            for c in costs {
                let per = |x: f64| x / c.writes.max(1.0);
                write!(
                    f,
                    "\n| {} | {:.0} | {:.2} | {:.2} | {:.3} |",
                    c.kind,
                    c.writes,
                    per(c.requests),
                    per(c.waits),
                    per(c.paxos)
                )?;
            }
        }
        Ok(())
    }
}
