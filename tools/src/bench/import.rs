//! `likes import`'s rate (issue 27): a generated file of `--rows` edges (10M), sorted by item
//! as an export of a table keyed by item is, imported by the `likes import` binary for
//! `--seconds` per round into a fresh keyspace, against the bare rate of unconditional
//! single-row inserts of the same rows into the same table, at the same concurrency, in the
//! same round. Memory: the import's peak RSS while writing, and `likes import --dry-run`
//! (every row read, parsed and checked, nothing written) through the whole file and through a
//! tenth of it: flat in the file's size means the two peaks are alike.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Args;
use futures::StreamExt;
use rand::{Rng, SeedableRng};

use super::scrape::peak_rss_mb;
use super::stats::{fig, mmm, Goal};
use likes::config::Settings;
use likes::import::row::Shape;
use likes::import::source::{Format, Mapping, Source};
use likes::store::imported::Imported;
use likes::topology::Topology;

#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    /// Rows of the generated file.
    #[arg(long, default_value_t = 10_000_000)]
    pub rows: u64,
    /// Likes per item (rows of one item are together, as in an export keyed by item).
    #[arg(long, default_value_t = 500)]
    pub per_item: u64,
    /// Seconds of each measurement.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Rounds (the report gives median and min–max).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Statements in flight, for both the import and the bare loop.
    #[arg(long, default_value_t = 96)]
    pub concurrency: usize,
}

#[derive(Debug, Default)]
pub struct ImportBenchReport {
    pub rows: u64,
    pub file_mb: f64,
    pub import_per_s: Vec<f64>,
    pub bare_per_s: Vec<f64>,
    pub import_rss_mb: Vec<f64>,
    /// Dry run through the whole file: (seconds, peak RSS MB).
    pub dry_all: (f64, f64),
    /// Dry run through a tenth of it.
    pub dry_tenth: (f64, f64),
}

/// The goal: at least half the bare insert rate.
pub const IMPORT_GOAL: f64 = 0.5;

impl ImportBenchReport {
    pub fn ratio(&self) -> (f64, f64, f64) {
        mmm(self
            .import_per_s
            .iter()
            .zip(&self.bare_per_s)
            .map(|(i, b)| i / b))
    }
}

impl std::fmt::Display for ImportBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ratio = self.ratio();
        writeln!(
            f,
            "import: a {}-row CSV ({:.0} MB), {} rounds",
            self.rows,
            self.file_mb,
            self.import_per_s.len()
        )?;
        writeln!(
            f,
            "  likes import:                 {} edges/s",
            fig(mmm(self.import_per_s.iter().copied()), 0)
        )?;
        writeln!(
            f,
            "  bare unconditional inserts:   {} rows/s",
            fig(mmm(self.bare_per_s.iter().copied()), 0)
        )?;
        writeln!(
            f,
            "  import / bare:                {}  goal >= {IMPORT_GOAL}: {}",
            fig(ratio, 2),
            Goal::at_least(IMPORT_GOAL).verdict(ratio.0)
        )?;
        writeln!(
            f,
            "  peak RSS while importing:     {} MB",
            fig(mmm(self.import_rss_mb.iter().copied()), 0)
        )?;
        write!(
            f,
            "  dry run, whole file / a tenth: {:.0} / {:.0} MB peak RSS ({:.1} / {:.1} s)",
            self.dry_all.1, self.dry_tenth.1, self.dry_all.0, self.dry_tenth.0
        )
    }
}

/// The generated file: `per_item` users per item, 90 % liked, times over two years.
fn generate(path: &Path, rows: u64, per_item: u64) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    let now = likes::runtime::clock::now_ms();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    writeln!(w, "item_id,user_id,liked,liked_at")?;
    for n in 0..rows {
        let item = n / per_item.max(1);
        let user = rng.random_range(0..5_000_000u64);
        let liked = rng.random_bool(0.9);
        let at = now - rng.random_range(0..(730 * 86_400_000i64));
        writeln!(w, "it-{item},u-{user},{},{at}", u8::from(liked))?;
    }
    w.flush()?;
    Ok(())
}

pub async fn run(
    base: &Settings,
    topology: &Topology,
    args: &ImportArgs,
) -> Result<ImportBenchReport> {
    let dir = std::env::temp_dir().join(format!("likes-bench-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(base, topology, args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(
    base: &Settings,
    topology: &Topology,
    args: &ImportArgs,
    dir: &Path,
) -> Result<ImportBenchReport> {
    let file = dir.join("edges.csv");
    let tenth = dir.join("edges-tenth.csv");
    let t = Instant::now();
    generate(&file, args.rows, args.per_item)?;
    generate(&tenth, args.rows / 10, args.per_item)?;
    let file_mb = std::fs::metadata(&file)?.len() as f64 / 1e6;
    eprintln!(
        "import bench: {} rows ({file_mb:.0} MB) generated in {:.1} s",
        args.rows,
        t.elapsed().as_secs_f64()
    );
    let mut report = ImportBenchReport {
        rows: args.rows,
        file_mb,
        ..Default::default()
    };
    let env =
        |s: &Settings| likes_testkit::names::namespace_env(&s.cql.keyspace, &s.kafka.topic_prefix);
    report.dry_all = dry_run(&file, &dir.join("dry-all"), &env(base))?;
    report.dry_tenth = dry_run(&tenth, &dir.join("dry-tenth"), &env(base))?;
    eprintln!(
        "import bench: dry runs {:?} / {:?} (s, MB)",
        report.dry_all, report.dry_tenth
    );
    for round in 0..args.rounds {
        let stamp = likes::runtime::clock::now_ms() / 1000 % 1_000_000;
        let mut bare_s = base.clone();
        bare_s.cql.keyspace = format!("bench_import_bare_{stamp}");
        bare_s.kafka.topic_prefix = format!("bench_import_bare_{stamp}.");
        let (session, _) = likes_testkit::namespace::create(&bare_s, topology, false).await?;
        let bare = bare_rate(&bare_s, topology, &file, args).await;
        let _ = likes_testkit::namespace::drop(&session, &bare_s, topology).await;
        let bare = bare?;
        let mut imp_s = base.clone();
        imp_s.cql.keyspace = format!("bench_import_{stamp}");
        imp_s.kafka.topic_prefix = format!("bench_import_{stamp}.");
        let (session, _) = likes_testkit::namespace::create(&imp_s, topology, false).await?;
        let imported = import_rate(
            &file,
            &dir.join(format!("state-{round}")),
            &env(&imp_s),
            args,
        );
        let _ = likes_testkit::namespace::drop(&session, &imp_s, topology).await;
        let (rate, rss) = imported?;
        eprintln!(
            "import bench: round {}/{}: import {rate:.0}/s, bare {bare:.0}/s ({:.2}), peak RSS {rss:.0} MB",
            round + 1,
            args.rounds,
            rate / bare
        );
        report.import_per_s.push(rate);
        report.bare_per_s.push(bare);
        report.import_rss_mb.push(rss);
    }
    Ok(report)
}

/// `likes import FILE --state-dir STATE` and `extra`, its output dropped.
fn spawn_import(
    file: &Path,
    state: &Path,
    env: &[(&'static str, String)],
    extra: &[&str],
) -> Result<std::process::Child> {
    std::process::Command::new(likes_testkit::procs::likes_bin()?)
        .arg("import")
        .arg(file)
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting likes import")
}

/// `likes import --dry-run` through a file: (seconds, peak RSS MB).
fn dry_run(file: &Path, state: &Path, env: &[(&'static str, String)]) -> Result<(f64, f64)> {
    let started = Instant::now();
    let mut child = spawn_import(file, state, env, &["--dry-run"])?;
    let mut rss = 0.0f64;
    loop {
        rss = rss.max(peak_rss_mb(child.id()));
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                return Err(anyhow!(
                    "likes import --dry-run {}: {status}",
                    file.display()
                ));
            }
            return Ok((started.elapsed().as_secs_f64(), rss));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `likes import` for `--seconds`, killed: edges per second by its last checkpoint, and its
/// peak RSS.
fn import_rate(
    file: &Path,
    state: &Path,
    env: &[(&'static str, String)],
    args: &ImportArgs,
) -> Result<(f64, f64)> {
    let started = Instant::now();
    let concurrency = args.concurrency.to_string();
    let mut child = spawn_import(file, state, env, &["--concurrency", &concurrency])?;
    let mut rss = 0.0f64;
    let deadline = started + Duration::from_secs(args.seconds);
    // (rows settled, when) at each new checkpoint, timed from the start.
    let mut last: Option<(u64, f64)> = None;
    let ck = state.join("checkpoint.json");
    while Instant::now() < deadline {
        rss = rss.max(peak_rss_mb(child.id()));
        if let Some(status) = child.try_wait()? {
            return Err(anyhow!(
                "likes import exited early: {status} (is --rows large enough?)"
            ));
        }
        if let Some(done) = std::fs::read(&ck)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["rows_done"].as_u64())
        {
            if last.is_none_or(|(n, _)| n != done) {
                last = Some((done, started.elapsed().as_secs_f64()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let (rows, at) =
        last.ok_or_else(|| anyhow!("likes import never checkpointed in {} s", args.seconds))?;
    Ok((rows as f64 / at, rss))
}

/// Unconditional single-row inserts of the file's rows, `--concurrency` in flight, for
/// `--seconds`: rows per second.
async fn bare_rate(
    settings: &Settings,
    topology: &Topology,
    file: &Path,
    args: &ImportArgs,
) -> Result<f64> {
    let session = likes::cql::connect(&settings.cql).await?;
    let store = Arc::new(Imported::prepare(session, &settings.cql.keyspace).await?);
    let shape = Shape::new(
        topology.buckets,
        topology.dedupe_ttl.as_millis() as i64,
        likes::runtime::clock::now_ms(),
        false,
    );
    let mut source = Source::open(file, Format::Csv, &Mapping::default())?;
    let rows = std::iter::from_fn(move || source.next_row())
        .filter_map(|r| r.ok()?.values.ok())
        .filter_map(move |v| shape.edge(&v).ok());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut done = 0u64;
    let mut writes = futures::stream::iter(rows)
        .take_while(|_| futures::future::ready(Instant::now() < deadline))
        .map(|e| {
            let store = store.clone();
            async move { store.insert_bare(&e).await }
        })
        .buffer_unordered(args.concurrency);
    while let Some(r) = writes.next().await {
        r?;
        done += 1;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}
