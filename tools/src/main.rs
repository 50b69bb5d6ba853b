//! `likes-tools`: the demo, chaos runs, benchmarks and the load generator around the
//! product. They run the product's processes from the `likes` binary built beside this one
//! (or `LIKES_BIN`), and share its configuration: the same `--config` file and `LIKES__*`
//! variables.

mod bench;
mod chaos;
mod demo;
mod hostile;
mod loadgen;
mod prune;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use likes::runtime::{out, Boot};

/// Tooling for `likes`: the demo, fault runs, benchmarks and load generation.
///
/// Configuration is the product's: embedded defaults, then --config FILE, then
/// LIKES__SECTION__KEY environment variables. See docs/configuration.md.
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
    Loadgen(loadgen::LoadgenArgs),
    /// The 60-second scenario of `make demo`: api, relay and both stages as processes, steady
    /// load, a viral burst, kill -9 of the count stage and its restart, a live view, and the
    /// verdict (counted vs the edges, and the design's SLOs at the demo's load). The processes stay up for a look; `make down` stops all.
    Demo {
        /// Seconds of load.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Steady requests a second (the burst doubles it). The default is what a 2-core box
        /// running Kafka, Cassandra and every stage besides sustains within the design's SLOs
        /// (docs/performance.md, "The demo's load"); raise it on a bigger one.
        #[arg(long, default_value_t = 30.0)]
        rate: f64,
    },
    /// Fault runs (`make chaos`): api, relay and both stages as processes under load through
    /// the API while faults drawn from the seed strike (kill -9 of each process, of dedupe with
    /// its state, of the Kafka broker and of Cassandra); then every count is checked against
    /// the edges. Exits non-zero on any drift. A seed replays its fault schedule.
    ///
    /// Examples: `likes-tools chaos --seed 7` (one run); `likes-tools chaos --seed 1 --runs 100`.
    Chaos(chaos::ChaosArgs),
    /// What hostile clients cost a real user (`make hostile`): `likes api` with its defaults,
    /// a legitimate user writing alone, then beside unauthenticated and forged floods, one
    /// user at full speed, 10,000 invented methods and slowloris connections; prints its
    /// success rate and p99 per phase and the API's RSS and metric series.
    Hostile(hostile::HostileArgs),
    /// Deletes the topics and keyspaces that failed or killed test runs left on the local stack
    /// (namespaces `<base>_<pid>_<millis>_<n>` whose process has exited; `make test` runs it
    /// first). Anything else, and a run still alive beside this one, is left alone.
    Prune,
    /// Benchmarks (run on their own topics and keyspace; see docs/performance.md).
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Two builds of `likes api` side by side against one stack, ABBA per round: the same
    /// open-loop mix to each in turn; p50/p99 and 2xx per build, candidate / baseline.
    Ab(bench::ab::AbArgs),
    /// Like/unlike load on `likes api` over loopback, open loop, next to the write path in
    /// process and a bare LWT loop against the same Cassandra.
    Api(bench::api::ApiBenchArgs),
    /// Every benchmark plus a sweep of offered load through the whole system, written to
    /// <out>/report.md with PNG plots (`make bench`).
    Report(bench::report::ReportArgs),
    /// Offered load through the whole system as deployed (admission on), ¼× to 4× the API's
    /// capacity, each level until the pipeline has applied it; rows and goals per level,
    /// written to <out>/sweep.md with plots (`make bench-sweep`).
    Sweep(bench::sweep::SweepArgs),
    /// Events through dedupe + count + sink vs a plain consumer; staleness; peak RSS.
    Topology(bench::topology::BenchArgs),
    /// The API past its capacity: 2× and 4× offered open loop under the adaptive limit;
    /// goodput, accepted and shed latency, reads beside them.
    Overload(bench::overload::OverloadArgs),
    /// Stage 1's restore of a changelog of --records (10M) vs a bare read of it.
    Restore(bench::restore::RestoreArgs),
    /// `likes import` of a --rows (10M) file vs bare unconditional inserts; peak memory.
    Import(bench::import::ImportArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    likes::runtime::exit("likes-tools", run(cli))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (settings, topology) = cli.boot.load()?;
    Boot::tokio()?.block_on(async move {
        match cli.command {
            Command::Loadgen(args) => {
                out(&loadgen::run(&settings, &topology, &args).await?.to_string());
            }
            Command::Demo { seconds, rate } => {
                let verdict = demo::run(&settings, &topology, seconds, rate).await?;
                if !verdict {
                    anyhow::bail!("demo: the verdict failed (the counts or an SLO: see above)");
                }
            }
            Command::Hostile(args) => {
                out(&hostile::run(&settings, &topology, &args).await?.to_string());
            }
            Command::Prune => {
                let pruned = prune::run(&settings).await?;
                out(&format!(
                    "prune: deleted {} topics and {} keyspaces left by exited test runs",
                    pruned.topics, pruned.keyspaces
                ));
            }
            Command::Chaos(args) => {
                if !chaos::run(&settings, &topology, &args).await? {
                    anyhow::bail!("chaos: a run drifted (see the report)");
                }
            }
            Command::Bench {
                what: BenchCommand::Topology(args),
            } => {
                args.check()?;
                let topology = match args.window {
                    Some(w) => topology.with_window(w)?,
                    None => topology,
                };
                out(&bench::topology::topology(&settings, &topology, &args)
                    .await?
                    .to_string());
            }
            Command::Bench {
                what: BenchCommand::Api(args),
            } => {
                args.check()?;
                out(&bench::api::run(&settings, &topology, &args)
                    .await?
                    .to_string());
            }
            Command::Bench {
                what: BenchCommand::Ab(args),
            } => {
                out(&bench::ab::run(&settings, &topology, &args)
                    .await?
                    .to_string());
            }
            Command::Bench {
                what: BenchCommand::Overload(args),
            } => {
                let report = bench::overload::run(&settings, &topology, &args).await?;
                bench::plot_overload(&report);
                out(&report.to_string());
            }
            Command::Bench {
                what: BenchCommand::Restore(args),
            } => {
                out(&bench::restore::run(&settings, &topology, &args)
                    .await?
                    .to_string());
            }
            Command::Bench {
                what: BenchCommand::Import(args),
            } => {
                out(&bench::import::run(&settings, &topology, &args)
                    .await?
                    .to_string());
            }
            Command::Bench {
                what: BenchCommand::Sweep(args),
            } => {
                let report = bench::sweep::run(&settings, &topology, &args).await?;
                let path = bench::write_sweep(&report, &args.out)?;
                out(&format!(
                    "{}\nbench sweep: written to {}",
                    report.table(),
                    path.display()
                ));
            }
            Command::Bench {
                what: BenchCommand::Report(args),
            } => {
                args.check()?;
                let path = bench::report::run(&settings, &topology, &args).await?;
                out(&format!("bench report: written to {}", path.display()));
            }
        }
        Ok(())
    })
}
