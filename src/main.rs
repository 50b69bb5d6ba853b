//! The `likes` binary: one subcommand per process (see `likes --help`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use likes::runtime::{out, Boot};
use likes::{cmd, cql};

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
    /// Create the CQL keyspace and tables, and record the topology's bucket count and window
    /// in it (idempotent; adds columns a newer version needs, never drops or rewrites a table).
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
    /// Erase accounts: unlike each of the user's likes through the write path (rate-limited,
    /// checkpointed), then, ops.erase_purge_after later, delete the user's rows.
    ///
    /// Without --user it works every erasure requested by POST /v1/admin/erasures. Safe to
    /// run twice and to kill: it resumes at its checkpoint, and its request keys replay.
    ///
    /// Examples:
    ///   likes erase                       # the queue (a CronJob)
    ///   likes erase --user u-123          # one user, by hand (requests the erasure too)
    ///   LIKES__OPS__ERASE_RATE=50 likes erase
    #[command(verbatim_doc_comment)]
    Erase {
        /// Erase this user (requesting the erasure if none is open) instead of the queue.
        #[arg(long)]
        user: Option<String>,
    },
    /// Compare counter rows with LIKED edges at a cut, while traffic goes on; print a table.
    ///
    /// Exit status 0 whatever the drift; the gauges likes_drift_items and likes_drift_abs say
    /// it. Items with an edge flipped twice since the cut are reported "in flight".
    ///
    /// Examples:
    ///   likes drift --sample 100          # the 50 hottest items and 50 at random
    ///   likes drift --item i-42 --item i-7
    ///   likes drift --all --metrics-file /var/lib/node_exporter/likes_drift.prom
    ///   likes drift --sample 1000 --push http://pushgateway:9091
    #[command(verbatim_doc_comment)]
    Drift {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Write the gauges here (Prometheus text format, for a textfile collector).
        #[arg(long)]
        metrics_file: Option<std::path::PathBuf>,
        /// PUT the gauges to this Prometheus Pushgateway (http://host:port).
        #[arg(long)]
        push: Option<String>,
    },
    /// Correct drift through the pipeline: each item's difference at a cut goes to
    /// likes.deltas as a Correction that stage 2 applies once, through the fence.
    ///
    /// Safe to re-run and to kill after sending: a correction is applied at most once.
    ///
    /// Examples:
    ///   likes reconcile --item i-42 --dry-run
    ///   likes reconcile --all --reason "after incident 123"
    #[command(verbatim_doc_comment)]
    Reconcile {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Print the corrections without sending them.
        #[arg(long)]
        dry_run: bool,
        /// Recorded on each correction and logged by stage 2.
        #[arg(long, default_value = "reconcile")]
        reason: String,
        /// With --dead-letters: write the run's gauges here (Prometheus text format).
        #[arg(long, requires = "dead_letters")]
        metrics_file: Option<std::path::PathBuf>,
        /// With --dead-letters: PUT the run's gauges to this Pushgateway (http://host:port).
        #[arg(long, requires = "dead_letters")]
        push: Option<String>,
    },
    /// Re-derive the counter table from the edges at a cut and set stage 2 to replay the
    /// deltas tail on top. Stage 2 must be stopped; start it again afterwards.
    ///
    /// Example (counter table lost):
    ///   kubectl -n likes scale statefulset/likes-count --replicas=0
    ///   likes migrate && likes rebuild
    ///   kubectl -n likes scale statefulset/likes-count --replicas=N
    #[command(verbatim_doc_comment)]
    Rebuild,
    /// Home regions: give every item range a home, show the range table, move ranges
    /// (docs/multi-region.md).
    ///
    /// Example: likes region init --home region-a
    ///          likes region move --from region-a --to region-b
    #[command(verbatim_doc_comment)]
    Region {
        #[command(subcommand)]
        action: RegionAction,
    },
    /// Load the likes a team already has from a file (CSV with a header, JSON Lines,
    /// Parquet), or a directory of part files, into the edges, as the write path would have
    /// left them (docs/adoption.md).
    ///
    /// Every write is conditional: an edge the live write path has touched is left as it is,
    /// and a re-run or a resumed run changes nothing. Killed, it resumes at its checkpoint
    /// in --state-dir. It writes no counts: afterwards run
    /// `likes reconcile --items-from <state dir>/items.txt`.
    ///
    /// Examples:
    ///   likes import likes.csv
    ///   likes import export.parquet --item-column post_id --user-column member_id \
    ///       --time-column created_at --all-liked
    ///   likes import likes.jsonl --dry-run            # check the file and the mapping
    ///   likes import export/                          # every part file, in name order
    #[command(verbatim_doc_comment)]
    Import {
        /// Files of edges, one row per (item, user), or directories of part files (names
        /// starting with _ or . are skipped: _SUCCESS, .crc files).
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
        /// csv, jsonl or parquet (default: from each file name's extension).
        #[arg(long)]
        format: Option<String>,
        #[arg(long, default_value = "item_id")]
        item_column: String,
        #[arg(long, default_value = "user_id")]
        user_column: String,
        /// true/false, 1/0, liked/unliked; the latest row (by time) of an edge wins.
        #[arg(long, default_value = "liked", conflicts_with = "all_liked")]
        liked_column: String,
        /// The file has no liked column: every row is a like.
        #[arg(long)]
        all_liked: bool,
        /// When the edge took its state: Unix ms or RFC 3339 (Parquet: a timestamp).
        #[arg(long, default_value = "liked_at")]
        time_column: String,
        /// Checkpoint, rejects.jsonl and items.txt (default: PATH.import/ beside the one path;
        /// required for several).
        #[arg(long)]
        state_dir: Option<std::path::PathBuf>,
        /// Rows in flight at once (memory stays flat in the file's size).
        #[arg(long, default_value_t = 4096)]
        window: usize,
        /// CQL statements in flight at once.
        #[arg(long, default_value_t = 96)]
        concurrency: usize,
        /// Read and check every row, write the rejects; write nothing to the database.
        #[arg(long)]
        dry_run: bool,
    },
    /// Compare the old counter's counts (a file of item,count) with this one's at a cut:
    /// a table of the items that differ, largest first, and gauges.
    ///
    /// Examples:
    ///   likes compare --old old-counts.csv
    ///   likes compare --old old-counts.csv --metrics-file /var/lib/node_exporter/likes_compare.prom
    #[command(verbatim_doc_comment)]
    Compare {
        /// item,count per line (comma or tab; a header line allowed).
        #[arg(long)]
        old: std::path::PathBuf,
        /// Items shown in the table (the largest differences).
        #[arg(long, default_value_t = 20)]
        show: usize,
        /// Write the gauges here (Prometheus text format, for a textfile collector).
        #[arg(long)]
        metrics_file: Option<std::path::PathBuf>,
        /// Exit 1 when any item differs.
        #[arg(long)]
        fail_on_diff: bool,
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
enum RegionAction {
    /// Give every range without a home to REGION at epoch 1 (region.ranges of them; once,
    /// idempotent: never moves a range).
    Init {
        #[arg(long)]
        home: String,
    },
    /// The ranges by home, their epochs, and moves under way.
    Status,
    /// Move ranges to another region: bump (the old home's writes fail closed), fence (wait
    /// out its lease and writes in flight), settle (the new home writes). Safe to rerun.
    Move {
        /// A range to move (repeat for more).
        #[arg(
            long = "range",
            required_unless_present = "from",
            conflicts_with = "from"
        )]
        ranges: Vec<i32>,
        /// Every range this region is home to.
        #[arg(long)]
        from: Option<String>,
        /// The new home. With the recount, run this with its configuration (region.name).
        #[arg(long)]
        to: String,
        /// Skip the recount of the moved items (the old home's tail as corrections through
        /// the new home's pipeline): only for ranges with nothing counted yet; otherwise run
        /// `likes reconcile --all` in the new home afterwards.
        #[arg(long)]
        no_recount: bool,
    },
}

/// Which items drift and reconcile look at.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct ScopeArgs {
    /// One item (repeat for more).
    #[arg(long = "item")]
    items: Vec<String>,
    /// N items: the hottest half by count, the rest at random.
    #[arg(long)]
    sample: Option<usize>,
    /// Every item with an edge or a counter row.
    #[arg(long)]
    all: bool,
    /// The items listed in a file, one per line (an import's items.txt).
    #[arg(long)]
    items_from: Option<std::path::PathBuf>,
    /// Every item the recount queue names (likes.dlq: flips stage 1 dead-lettered or counted
    /// on a guess) and this region homes. `reconcile` puts back the items it could not
    /// settle, then marks the queue drained.
    #[arg(long)]
    dead_letters: bool,
}

impl ScopeArgs {
    fn scope(self) -> anyhow::Result<likes::ops::drift::Scope> {
        if let Some(path) = &self.items_from {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--items-from {}: {e}", path.display()))?;
            let items: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            return Ok(likes::ops::drift::Scope::Items(items));
        }
        Ok(
            match (self.items.is_empty(), self.sample, self.dead_letters) {
                (false, _, _) => likes::ops::drift::Scope::Items(self.items),
                (true, Some(n), _) => likes::ops::drift::Scope::Sample(n),
                (true, None, true) => likes::ops::drift::Scope::DeadLetters,
                (true, None, false) => likes::ops::drift::Scope::All,
            },
        )
    }
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
    Boot::tokio()?.block_on(async move {
        match cli.command {
            Command::Migrate {
                accept_window_change,
            } => {
                let session = cql::connect(&settings.cql).await?;
                let report = cmd::migrate::run(&session, &settings.cql).await?;
                out(&report.to_string());
                for line in likes::store::recorded::record(
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
            Command::Relay => cmd::stages::run_relay(&settings, &topology).await?,
            Command::Token { user, ttl } => {
                let signer = likes::api::auth::Signer::from_session_key(&settings.api.session_key)?;
                if !likes::write::valid_id(&user) {
                    anyhow::bail!("--user must be 1-128 characters of A-Z a-z 0-9 _ - :");
                }
                let expires = likes::runtime::clock::now_ms() / 1000 + ttl.as_secs() as i64;
                out(&signer.sign(&user, expires));
            }
            Command::Replay {
                group,
                to_earliest: _,
                to_time,
            } => {
                let target = match to_time {
                    Some(t) => {
                        likes::ops::replay::Target::Time(likes::ops::replay::parse_time(&t)?)
                    }
                    None => likes::ops::replay::Target::Earliest,
                };
                let report =
                    likes::ops::replay::run_checked(&settings, &topology, &group, target).await?;
                out(&report.to_string());
            }
            Command::Region { action } => match action {
                RegionAction::Init { home } => out(&likes::ops::region::init(&settings, &home)
                    .await?
                    .to_string()),
                RegionAction::Status => {
                    out(&likes::ops::region::status(&settings).await?.to_string())
                }
                RegionAction::Move {
                    ranges,
                    from,
                    to,
                    no_recount,
                } => {
                    let which = match from {
                        Some(from) => likes::ops::region::Which::From(from),
                        None => likes::ops::region::Which::Ranges(ranges),
                    };
                    let report =
                        likes::ops::region::r#move(&settings, &topology, which, &to, !no_recount)
                            .await?;
                    out(&report.to_string());
                    // As `likes reconcile`: items left unsettled fail the run (the ranges stay
                    // owed, `likes region status` lists them).
                    if !report.settled() {
                        anyhow::bail!(
                            "the move's recount left items in flight (see above); run the same command again"
                        );
                    }
                }
            },
            Command::Erase { user } => {
                if let Some(u) = &user {
                    if !likes::write::valid_id(u) {
                        anyhow::bail!("--user must be 1-128 characters of A-Z a-z 0-9 _ - :");
                    }
                }
                // Resumes at its checkpoint each time (chaos: an erase died on a Cassandra
                // kill mid-walk and left the user's likes standing).
                let report = likes::ops::retrying("erase", settings.ops.wait_timeout, || async {
                    let job = likes::ops::erase::Eraser::connect(&settings, &topology).await?;
                    likes::ops::erase::run(&job, user.as_deref()).await
                })
                .await?;
                out(&report.to_string());
            }
            Command::Drift {
                scope,
                metrics_file,
                push,
            } => {
                let scope = scope.scope()?;
                let report = likes::ops::retrying("drift", settings.ops.wait_timeout, || async {
                    let p = likes::ops::cut::Pipeline::connect(&settings, &topology).await?;
                    likes::ops::drift::run(&p, &scope).await
                })
                .await?;
                out(&report.to_string());
                if let Some(path) = metrics_file {
                    likes::ops::drift::write_metrics_file(&path, &report.gauges())?;
                }
                if let Some(gateway) = push {
                    likes::ops::drift::push(&gateway, "likes_drift", &report.gauges()).await?;
                }
            }
            Command::Reconcile {
                scope,
                dry_run,
                reason,
                metrics_file,
                push,
            } => {
                let scope = scope.scope()?;
                if let likes::ops::drift::Scope::DeadLetters = scope {
                    let run =
                        likes::ops::retrying("reconcile", settings.ops.wait_timeout, || async {
                            let p =
                                likes::ops::cut::Pipeline::connect(&settings, &topology).await?;
                            likes::ops::dead_letters::recount(&p, dry_run, &reason).await
                        })
                        .await?;
                    out(&run.to_string());
                    if !dry_run {
                        if let Some(path) = metrics_file {
                            likes::ops::drift::write_metrics_file(&path, &run.gauges())?;
                        }
                        if let Some(gateway) = push {
                            likes::ops::drift::push(&gateway, "likes_recount", &run.gauges())
                                .await?;
                        }
                    }
                    return Ok(());
                }
                let report =
                    likes::ops::retrying("reconcile", settings.ops.wait_timeout, || async {
                        let p = likes::ops::cut::Pipeline::connect(&settings, &topology).await?;
                        let items = likes::ops::drift::items_of(&p, &scope).await?;
                        likes::ops::reconcile::run(&p, items, dry_run, &reason).await
                    })
                    .await?;
                out(&report.to_string());
                // A refused correction was retried at a later cut; what is left unsettled
                // after every attempt is in in_flight.
                if !report.in_flight.is_empty() {
                    anyhow::bail!(
                        "some items are not reconciled (see above); run the same command again"
                    );
                }
            }
            Command::Rebuild => {
                let report = likes::ops::retrying("rebuild", settings.ops.wait_timeout, || async {
                    let p = likes::ops::cut::Pipeline::connect(&settings, &topology).await?;
                    likes::ops::rebuild::run(&p).await
                })
                .await?;
                out(&report.to_string());
            }
            Command::Import {
                paths,
                format,
                item_column,
                user_column,
                liked_column,
                all_liked,
                time_column,
                state_dir,
                window,
                concurrency,
                dry_run,
            } => {
                let args = likes::import::Args {
                    paths,
                    format: format
                        .as_deref()
                        .map(likes::import::source::Format::parse)
                        .transpose()?,
                    mapping: likes::import::source::Mapping {
                        item: item_column,
                        user: user_column,
                        liked: (!all_liked).then_some(liked_column),
                        time: time_column,
                    },
                    state_dir,
                    window,
                    concurrency,
                    dry_run,
                };
                // A dependency's restart fails a run; the next resumes at the checkpoint.
                let report = likes::ops::retrying("import", settings.ops.wait_timeout, || {
                    likes::import::run(&settings, &topology, &args)
                })
                .await?;
                out(&report.to_string());
            }
            Command::Compare {
                old,
                show,
                metrics_file,
                fail_on_diff,
            } => {
                let counts = likes::ops::compare::read_counts(&old)?;
                let report = likes::ops::retrying("compare", settings.ops.wait_timeout, || async {
                    let p = likes::ops::cut::Pipeline::connect(&settings, &topology).await?;
                    likes::ops::compare::run(&p, counts.clone(), show).await
                })
                .await?;
                out(&report.to_string());
                if let Some(path) = metrics_file {
                    likes::ops::drift::write_metrics_file(&path, &report.gauges())?;
                }
                if fail_on_diff && !report.differ.is_empty() {
                    anyhow::bail!("{} items differ from the old counter", report.differ.len());
                }
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The doc comment once sat above the allocator static and `--help` lost it (issue 24).
    #[test]
    fn the_help_says_how_configuration_is_layered() {
        let help = super::Cli::command().render_long_help().to_string();
        assert!(help.contains("LIKES__SECTION__KEY"), "{help}");
    }
}
