//! The `likes` binary: one subcommand per process (see `likes --help`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use likes::config::Settings;
use likes::topology::Topology;
use likes::{cmd, cql, telemetry};

/// An exact like counter: a Kafka-native stream application.
///
/// Configuration: embedded defaults, then --config FILE, then LIKES__SECTION__KEY environment
/// variables (for example LIKES__CQL__KEYSPACE=likes_dev). See README.md.

// jemalloc for every allocation in the process, librdkafka's and RocksDB's included (the
// unprefixed symbols replace malloc): stage 1 churns millions of small records a minute,
// and under jemalloc it ran 15% faster than under glibc's malloc (bench topology, 3M events).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "likes", version, about, long_about)]
struct Cli {
    /// A TOML config file layered over the embedded defaults.
    #[arg(long, env = "LIKES_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// A topology spec to use instead of the embedded `topology/topology.toml`.
    #[arg(long, global = true)]
    topology: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the CQL keyspace and tables, and record the topology's bucket count and window
    /// in it (idempotent; never alters or drops a table).
    ///
    /// Example: after changing `window` in topology/, `likes migrate --accept-window-change`.
    Migrate {
        /// Record a new window length (safe: the counter fence compares window end times).
        /// Without it, a window other than the recorded one is refused.
        #[arg(long)]
        accept_window_change: bool,
    },
    /// Create the Kafka topics of the topology (idempotent; never changes partition counts).
    Topics,
    /// Print the effective configuration and topology, after all overrides, and exit.
    Config,
    /// Stage 1: events -> deduplicated per-item deltas, exactly once (runs until SIGTERM).
    Dedupe,
    /// Stage 2: deltas -> one (item, window, +N) -> the fenced counter rows (runs until SIGTERM).
    Count,
    /// Both stages in one process, for development (runs until SIGTERM).
    Topology,
    /// The HTTP API on api.listen (runs until SIGTERM); needs api.session_key.
    Api,
    /// Publish the events of flips whose produce failed, from the outbox (until SIGTERM).
    Relay,
    /// Print a session token for a user, signed with api.session_key (for development and
    /// tests; production tokens come from the identity service).
    Token {
        /// The user the token acts for.
        #[arg(long)]
        user: String,
        /// How long the token is valid, e.g. 1h.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
    },
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
    /// Examples: `likes chaos --seed 7` (one run); `likes chaos --seed 1 --runs 100`.
    Chaos(cmd::chaos::ChaosArgs),
    /// Benchmarks (run on their own topics and keyspace; see README "Performance").
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Reset a stage's consumer group to replay its input; counts do not move.
    Replay {
        /// The group, as on the cluster (with the topic prefix), e.g. likes-count.
        #[arg(long)]
        group: String,
        /// Replay the whole retained input.
        #[arg(long, conflicts_with = "to_time", required_unless_present = "to_time")]
        to_earliest: bool,
        /// Replay from the first record at or after this time (Unix ms or RFC 3339).
        #[arg(long)]
        to_time: Option<String>,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Fail points (FAILPOINTS=name=action;...) exist only in builds with `--features failpoints`.
    let _failpoints = fail::FailScenario::setup();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Our errors already carry their cause in their message; print it once.
            eprintln!("likes: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = Settings::load(cli.config.as_deref())?;
    telemetry::init(&settings.log);
    let topology_path = cli.topology.clone().or_else(|| settings.topology_path());
    let topology = Topology::load(topology_path.as_deref())?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Migrate {
                accept_window_change,
            } => {
                let session = cql::connect(&settings.cql).await?;
                let report = cmd::migrate::run(&session, &settings.cql).await?;
                out(&report.to_string());
                for line in cql::recorded::record(
                    &session,
                    &settings.cql.keyspace,
                    &topology,
                    accept_window_change,
                )
                .await?
                {
                    out(&line);
                }
            }
            Command::Topics => {
                let report = cmd::topics::run(&settings, &topology).await?;
                out(&report.to_string());
            }
            Command::Dedupe => cmd::stages::run_dedupe(&settings, &topology).await?,
            Command::Count => cmd::stages::run_count(&settings, &topology).await?,
            Command::Topology => cmd::stages::run_topology(&settings, &topology).await?,
            Command::Api => cmd::stages::run_api(&settings, &topology).await?,
            Command::Relay => likes::api::relay_alone(&settings, &topology).await?,
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
                    cmd::loadgen::Target::kafka(&settings, &topology)?
                } else {
                    let url = url.unwrap_or_else(|| format!("http://{}", settings.api.listen));
                    cmd::loadgen::Target::http(&settings, &url)?
                };
                let mut mix = cmd::loadgen::Mix::new(cmd::loadgen::MixArgs {
                    items,
                    viral_share,
                    unlike_share,
                    retry_share,
                    seed,
                    run_id: format!("lg{}", likes::dedupe::state::now_ms()),
                });
                let phases = [cmd::loadgen::Phase {
                    name: "steady".into(),
                    seconds,
                    rate,
                    viral_share,
                }];
                let live = std::sync::Arc::new(cmd::loadgen::Live::default());
                let started = std::time::Instant::now();
                cmd::loadgen::drive(std::sync::Arc::new(target), &mut mix, &phases, live.clone())
                    .await;
                out(&cmd::loadgen::Summary::of(&live, started.elapsed()).to_string());
            }
            Command::Demo { seconds, rate } => {
                let verdict = cmd::demo::run(&settings, &topology, seconds, rate).await?;
                if !verdict {
                    anyhow::bail!("demo: the counts did not match the edges (see the table above)");
                }
            }
            Command::Chaos(args) => {
                if !cmd::chaos::run(&settings, &topology, &args).await? {
                    anyhow::bail!("chaos: a run drifted (see the report)");
                }
            }
            Command::Token { user, ttl } => {
                let signer = likes::api::auth::Signer::from_session_key(&settings.api.session_key)?;
                if !likes::api::valid_id(&user) {
                    anyhow::bail!("--user must be 1-128 characters of A-Z a-z 0-9 _ - :");
                }
                let expires = likes::dedupe::state::now_ms() / 1000 + ttl.as_secs() as i64;
                out(&signer.sign(&user, expires));
            }
            Command::Replay {
                group,
                to_earliest: _,
                to_time,
            } => {
                let target = match to_time {
                    Some(t) => cmd::replay::Target::Time(cmd::replay::parse_time(&t)?),
                    None => cmd::replay::Target::Earliest,
                };
                let report = cmd::replay::run_checked(&settings, &topology, &group, target).await?;
                out(&report.to_string());
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
                let args = cmd::bench::BenchArgs {
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
                let report = cmd::bench::topology(&settings, &topology, &args).await?;
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
                let args = cmd::bench_api::ApiBenchArgs {
                    rate,
                    seconds,
                    rounds,
                    seed,
                    out: out_dir,
                };
                let report = cmd::bench_api::run(&settings, &topology, &args).await?;
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
                let args = cmd::bench_report::ReportArgs {
                    out: out_dir,
                    repeats,
                    events,
                    peak,
                    level_seconds,
                };
                let path = cmd::bench_report::run(&settings, &topology, &args).await?;
                out(&format!("bench report: written to {}", path.display()));
            }
            Command::Config => {
                out(&format!(
                    "# effective configuration\n{}\n# effective topology\n{}",
                    toml::to_string(&settings)?,
                    toml::to_string(&topology)?
                ));
            }
        }
        Ok(())
    })
}

/// Prints a result to stdout; a closed pipe (`likes config | head`) is not an error.
fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}
