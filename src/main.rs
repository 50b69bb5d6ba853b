//! The `likes` binary: one subcommand per process (see `likes --help`). A dispatch table:
//! each command's flags, help and work live with its job (src/cmd/, src/ops/, src/import/).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use likes::ops::{Ctx, Done};
use likes::runtime::{out, Boot};
use likes::{cmd, import, ops};

// jemalloc for every allocation in the process, librdkafka's and RocksDB's included (the
// unprefixed symbols replace malloc): stage 1 churns millions of small records a minute,
// and under jemalloc it ran 15% faster than under glibc's malloc (bench topology, 3M events).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// An exact like counter: a Kafka-native stream application.
///
/// Configuration: embedded defaults, then --config FILE, then LIKES__SECTION__KEY environment
/// variables (for example LIKES__CQL__KEYSPACE=likes_dev). See docs/configuration.md.
#[derive(Parser)]
#[command(name = "likes", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    boot: Boot,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Migrate(cmd::migrate::Args),
    /// Create the Kafka topics of the topology (idempotent; never changes partition counts).
    Topics,
    /// Print the effective configuration and topology, after all overrides, and exit
    /// (secrets shown as "***").
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
    Token(cmd::token::Args),
    Erase(ops::erase::Args),
    Drift(ops::drift::Args),
    Reconcile(ops::reconcile::Args),
    Rebuild(ops::rebuild::Args),
    Region(ops::region::Args),
    Import(import::Flags),
    Compare(ops::compare::Args),
    Replay(ops::replay::Args),
}

fn main() -> ExitCode {
    // `--version` also names the RocksDB the binary runs: a shared library found at run time
    // (docs/building.md), so the build alone cannot say which.
    if let [_, flag] = std::env::args().collect::<Vec<_>>().as_slice() {
        if flag == "--version" || flag == "-V" {
            println!("likes {}", env!("CARGO_PKG_VERSION"));
            println!("{}", likes::dedupe::engine::describe());
            return ExitCode::SUCCESS;
        }
    }
    let cli = Cli::parse();
    // Fail points (FAILPOINTS=name=action;...) exist only in builds with `--features failpoints`.
    let _failpoints = fail::FailScenario::setup();
    likes::runtime::exit("likes", run(cli))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let (settings, topology) = cli.boot.load()?;
    let ctx = Ctx { settings, topology };
    let done = Boot::tokio()?.block_on(dispatch(cli.command, &ctx))?;
    if !done.report.is_empty() {
        out(&done.report);
    }
    match done.failure {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}

async fn dispatch(command: Command, ctx: &Ctx) -> likes::error::Result<Done> {
    let (s, t) = (&ctx.settings, &ctx.topology);
    let ran = |_: ()| Done::default();
    Ok(match command {
        Command::Migrate(a) => cmd::migrate::command(a, ctx).await?,
        Command::Topics => Done::report(cmd::topics::run(s, t).await?),
        Command::Config => Done::report(cmd::config::show(ctx)?),
        Command::Dedupe => cmd::stages::run_dedupe(s, t).await.map(ran)?,
        Command::Count => cmd::stages::run_count(s, t).await.map(ran)?,
        Command::Topology => cmd::stages::run_topology(s, t).await.map(ran)?,
        Command::Api => cmd::stages::run_api(s, t).await.map(ran)?,
        Command::Relay => cmd::stages::run_relay(s, t).await.map(ran)?,
        Command::Token(a) => cmd::token::command(a, ctx)?,
        Command::Erase(a) => ops::erase::command(a, ctx).await?,
        Command::Drift(a) => ops::drift::command(a, ctx).await?,
        Command::Reconcile(a) => ops::reconcile::command(a, ctx).await?,
        Command::Rebuild(a) => ops::rebuild::command(a, ctx).await?,
        Command::Region(a) => ops::region::command(a, ctx).await?,
        Command::Import(a) => import::command(a, ctx).await?,
        Command::Compare(a) => ops::compare::command(a, ctx).await?,
        Command::Replay(a) => ops::replay::command(a, ctx).await?,
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The doc comment once sat above the allocator static and `--help` lost it (issue 24).
    #[test]
    fn the_help_says_how_configuration_is_layered() {
        let help = super::Cli::command().render_long_help().to_string();
        assert!(help.contains("LIKES__SECTION__KEY"), "{help}");
    }

    /// Each job's help lives on its Args; the dispatch table must not lose it.
    #[test]
    fn every_command_has_its_help() {
        let cli = super::Cli::command();
        for sub in cli.get_subcommands() {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(!about.is_empty(), "`likes {}` has no help", sub.get_name());
        }
    }
}
