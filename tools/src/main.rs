//! `likes-tools`: the demo, chaos runs, benchmarks and the load generator around the
//! product. They run the product's processes from the `likes` binary built beside this one
//! (or `LIKES_BIN`), and share its configuration: the same `--config` file and `LIKES__*`
//! variables.

mod bench;
mod bench_api;
mod bench_report;
mod chaos;
mod demo;
mod loadgen;
mod procs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use likes::runtime::{out, Boot};

/// Tooling for `likes`: the demo, fault runs, benchmarks and load generation.
///
/// Configuration is the product's: embedded defaults, then --config FILE, then
/// LIKES__SECTION__KEY environment variables. See README.md.
#[derive(Parser)]
#[command(name = "likes-tools", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    boot: Boot,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open-loop like/unlike load on `likes api` (or, with --kafka, LikeEvents straight to
    /// the events topic): zipf items, a viral item, unlikes and retries; prints the achieved
    /// rate and latency percentiles.
    Loadgen {
        /// Requests a second, held whatever the latency (open loop).
        #[arg(long, default_value_t = 200.0)]
        rate: f64,
        /// How long to run.
        #[arg(long, default_value_t = 30.0)]
        seconds: f64,
        /// Distinct items, drawn by zipf (s = 1).
        #[arg(long, default_value_t = 1000)]
        items: u32,
        /// Share of likes that go to the one viral item.
        #[arg(long, default_value_t = 0.05)]
        viral_share: f64,
        /// Share of requests that unlike an earlier like.
        #[arg(long, default_value_t = 0.1)]
        unlike_share: f64,
        /// Share of requests that resend an earlier request with its own key.
        #[arg(long, default_value_t = 0.05)]
        retry_share: f64,
        /// The API's base URL (default: http:// + api.listen).
        #[arg(long)]
        url: Option<String>,
        /// Produce LikeEvents to the events topic instead of calling the API.
        #[arg(long)]
        kafka: bool,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// The 60-second scenario of `make demo`: api, relay and both stages as processes, steady
    /// load, a viral burst, kill -9 of the count stage and its restart, a live view, and the
    /// verdict (counted vs the edges). The processes stay up for a look; `make down` stops all.
    Demo {
        /// Seconds of load.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Steady requests a second (the burst doubles it).
        #[arg(long, default_value_t = 150.0)]
        rate: f64,
    },
    /// Fault runs (`make chaos`): api, relay and both stages as processes under load through
    /// the API while faults drawn from the seed strike (kill -9 of each process, of dedupe with
    /// its state, of the Kafka broker and of Cassandra); then every count is checked against
    /// the edges. Exits non-zero on any drift. A seed replays its fault schedule.
    ///
    /// Examples: `likes-tools chaos --seed 7` (one run); `likes-tools chaos --seed 1 --runs 100`.
    Chaos(chaos::ChaosArgs),
    /// Benchmarks (run on their own topics and keyspace; see README "Performance").
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Like/unlike load on `likes api` over loopback, open loop, next to the write path in
    /// process and a bare LWT loop against the same Cassandra.
    Api {
        /// Offered writes a second.
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
        /// Seconds per loop.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Rounds of all four loops, interleaved; the report gives medians and min–max.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Where the JSON report goes.
        #[arg(long, default_value = "bench/out")]
        out: PathBuf,
    },
    /// Every benchmark plus a sweep of offered load through the whole system, written to
    /// <out>/report.md with PNG plots (`make bench`).
    Report {
        /// Where report.md and the plots go.
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// Repeats of every figure (the report gives medians and min–max).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Events of each topology run.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Writes/s taken as 100% in the sweep, and the API benchmark's rate.
        #[arg(long, default_value_t = 1000.0)]
        peak: f64,
        /// Seconds per level of the sweep.
        #[arg(long, default_value_t = 15.0)]
        level_seconds: f64,
    },
    /// Events through dedupe + count + sink vs a plain consumer; staleness; peak RSS.
    Topology {
        /// Events in the backlog.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Items of the zipf mix (plus one viral item).
        #[arg(long, default_value_t = 100_000)]
        items: u32,
        /// Share of events that go to the viral item.
        #[arg(long, default_value_t = 0.3)]
        viral_share: f64,
        /// Seconds of the measured live phase at half the drained rate (after a 5 s warm-up).
        #[arg(long, default_value_t = 20)]
        live_seconds: u64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Window length for this run instead of the topology's (e.g. 250ms): staleness
        /// can only fall below one window.
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<std::time::Duration>,
        /// Where the JSON report goes.
        #[arg(long, default_value = "bench/out")]
        out: PathBuf,
    },
}

/// The folder of `make up`'s data, logs and pid files, found as stack/stack.sh finds it.
fn stack_dir() -> Option<PathBuf> {
    std::env::var_os("LIKES_STACK_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("LIKES_CACHE").map(|c| PathBuf::from(c).join("stack")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/likes/stack")))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("likes-tools: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (settings, topology) = cli.boot.load()?;
    Boot::tokio()?.block_on(async move {
        match cli.command {
            Command::Loadgen {
                rate,
                seconds,
                items,
                viral_share,
                unlike_share,
                retry_share,
                url,
                kafka,
                seed,
            } => {
                let shares = [viral_share, unlike_share, retry_share];
                if !(rate > 0.0 && seconds > 0.0 && items > 0)
                    || shares.iter().any(|s| !(0.0..=1.0).contains(s))
                {
                    anyhow::bail!(
                        "--rate, --seconds and --items must be above 0 and every share in 0..=1"
                    );
                }
                let target = if kafka {
                    loadgen::Target::kafka(&settings, &topology)?
                } else {
                    let url = url.unwrap_or_else(|| format!("http://{}", settings.api.listen));
                    loadgen::Target::http(&settings, &url)?
                };
                let mut mix = loadgen::Mix::new(loadgen::MixArgs {
                    items,
                    viral_share,
                    unlike_share,
                    retry_share,
                    seed,
                    run_id: format!("lg{}", likes::runtime::clock::now_ms()),
                });
                let phases = [loadgen::Phase {
                    name: "steady".into(),
                    seconds,
                    rate,
                    viral_share,
                }];
                let live = std::sync::Arc::new(loadgen::Live::default());
                let started = std::time::Instant::now();
                loadgen::drive(std::sync::Arc::new(target), &mut mix, &phases, live.clone()).await;
                out(&loadgen::Summary::of(&live, started.elapsed()).to_string());
            }
            Command::Demo { seconds, rate } => {
                let verdict = demo::run(&settings, &topology, seconds, rate).await?;
                if !verdict {
                    anyhow::bail!("demo: the counts did not match the edges (see the table above)");
                }
            }
            Command::Chaos(args) => {
                if !chaos::run(&settings, &topology, &args).await? {
                    anyhow::bail!("chaos: a run drifted (see the report)");
                }
            }
            Command::Bench {
                what:
                    BenchCommand::Topology {
                        events,
                        items,
                        viral_share,
                        live_seconds,
                        seed,
                        window,
                        out: out_dir,
                    },
            } => {
                if !(0.0..1.0).contains(&viral_share) || items == 0 || events == 0 {
                    anyhow::bail!("--viral-share must be in [0, 1), --items and --events above 0");
                }
                let args = bench::BenchArgs {
                    events,
                    items,
                    viral_share,
                    live_seconds,
                    seed,
                    out: out_dir,
                };
                let mut topology = topology;
                if let Some(w) = window {
                    topology = topology.with_window(w)?;
                }
                let report = bench::topology(&settings, &topology, &args).await?;
                out(&report.to_string());
            }
            Command::Bench {
                what:
                    BenchCommand::Api {
                        rate,
                        seconds,
                        rounds,
                        seed,
                        out: out_dir,
                    },
            } => {
                if rate.is_nan() || rate <= 0.0 || seconds == 0 || rounds == 0 {
                    anyhow::bail!("--rate, --seconds and --rounds must be above 0");
                }
                let args = bench_api::ApiBenchArgs {
                    rate,
                    seconds,
                    rounds,
                    seed,
                    out: out_dir,
                };
                let report = bench_api::run(&settings, &topology, &args).await?;
                out(&report.to_string());
            }
            Command::Bench {
                what:
                    BenchCommand::Report {
                        out: out_dir,
                        repeats,
                        events,
                        peak,
                        level_seconds,
                    },
            } => {
                if repeats == 0
                    || events == 0
                    || peak.is_nan()
                    || peak <= 0.0
                    || level_seconds.is_nan()
                    || level_seconds <= 0.0
                {
                    anyhow::bail!(
                        "--repeats, --events, --peak and --level-seconds must be above 0"
                    );
                }
                let args = bench_report::ReportArgs {
                    out: out_dir,
                    repeats,
                    events,
                    peak,
                    level_seconds,
                };
                let path = bench_report::run(&settings, &topology, &args).await?;
                out(&format!("bench report: written to {}", path.display()));
            }
        }
        Ok(())
    })
}
