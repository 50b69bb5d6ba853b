//! `likes import`: the likes a team already has, loaded from a file into `edges` and
//! `edges_by_user` in the shape the write path leaves them (docs/adoption.md).
//!
//! A reader thread parses and shapes rows into chunks; chunks are written concurrently, a
//! bounded number at a time, and settled in file order, so "every row before N is settled"
//! is one number: the checkpoint. Killed, the import resumes there; rows after it are
//! written again, and every write is conditional, so nothing is written twice. Counts are not
//! written here: `likes reconcile --items-from <state dir>/items.txt` corrects them at a cut,
//! through the pipeline, once the import is done (docs/adoption.md, "Counts"). A directory of
//! part files is imported part by part (`parts`), each as a file of its own.

pub mod checkpoint;
/// Parquet files written as a warehouse would: for this crate's tests only.
#[cfg(test)]
pub mod parquet_file;
pub mod parts;
pub mod row;
pub mod source;
pub mod write;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Semaphore;
use tracing::info;

use self::checkpoint::{Checkpoint, FileId, StateDir, Tally};
use self::source::{Format, Mapping, Source};
use self::write::{ChunkWriter, Outcome, Shaped};
use crate::config::Settings;
use crate::error::{Error, Result};
use crate::runtime::clock::now_ms;
use crate::topology::Topology;

/// Rows per chunk: the unit written together and settled together.
pub const CHUNK: usize = 512;

/// How often the checkpoint is saved.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Args {
    /// Files, or directories of part files (`parts`).
    pub paths: Vec<PathBuf>,
    pub format: Option<Format>,
    pub mapping: Mapping,
    /// The checkpoint, reject file and items list (default: `<path>.import/` for one path).
    pub state_dir: Option<PathBuf>,
    /// Rows in flight (rounded up to whole chunks).
    pub window: usize,
    /// CQL statements in flight.
    pub concurrency: usize,
    /// Read and check every row; write nothing to the database.
    pub dry_run: bool,
}

impl Args {
    pub fn state_dir(&self) -> Result<PathBuf> {
        if let Some(d) = &self.state_dir {
            return Ok(d.clone());
        }
        match self.paths.as_slice() {
            [one] => {
                let one = one.components().as_path(); // without a trailing slash
                let mut s = one.as_os_str().to_owned();
                s.push(".import");
                Ok(PathBuf::from(s))
            }
            _ => Err(Error::Input(
                "several paths to import: say where their checkpoint goes (--state-dir)".into(),
            )),
        }
    }
}

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
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Flags {
    /// Files of edges, one row per (item, user), or directories of part files (names
    /// starting with _ or . are skipped: _SUCCESS, .crc files).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// csv, jsonl or parquet (default: from each file name's extension).
    #[arg(long, value_parser = |s: &str| Format::parse(s).map_err(|e| e.to_string()))]
    pub format: Option<Format>,
    #[arg(long, default_value = "item_id")]
    pub item_column: String,
    #[arg(long, default_value = "user_id")]
    pub user_column: String,
    /// true/false, 1/0, liked/unliked; the latest row (by time) of an edge wins.
    #[arg(long, default_value = "liked", conflicts_with = "all_liked")]
    pub liked_column: String,
    /// The file has no liked column: every row is a like.
    #[arg(long)]
    pub all_liked: bool,
    /// When the edge took its state: Unix ms or RFC 3339 (Parquet: a timestamp).
    #[arg(long, default_value = "liked_at")]
    pub time_column: String,
    /// Checkpoint, rejects.jsonl and items.txt (default: PATH.import/ beside the one path;
    /// required for several).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Rows in flight at once (memory stays flat in the file's size).
    #[arg(long, default_value_t = 4096)]
    pub window: usize,
    /// CQL statements in flight at once.
    #[arg(long, default_value_t = 96)]
    pub concurrency: usize,
    /// Read and check every row, write the rejects; write nothing to the database.
    #[arg(long)]
    pub dry_run: bool,
}

impl From<Flags> for Args {
    fn from(f: Flags) -> Self {
        Args {
            paths: f.paths,
            format: f.format,
            mapping: Mapping {
                item: f.item_column,
                user: f.user_column,
                liked: (!f.all_liked).then_some(f.liked_column),
                time: f.time_column,
            },
            state_dir: f.state_dir,
            window: f.window,
            concurrency: f.concurrency,
            dry_run: f.dry_run,
        }
    }
}

/// `likes import`. A dependency's restart fails a run; the next resumes at the checkpoint.
pub async fn command(flags: Flags, ctx: &crate::ops::Ctx) -> Result<crate::ops::Done> {
    let args = Args::from(flags);
    let report = crate::ops::retrying("import", ctx.settings.ops.wait_timeout, || {
        run(&ctx.settings, &ctx.topology, &args)
    })
    .await?;
    Ok(crate::ops::Done::report(report))
}

#[derive(Debug, Clone)]
pub struct ImportReport {
    pub tally: Tally,
    pub state_dir: PathBuf,
    /// Rows settled by earlier runs of this import (a resume starts after them).
    pub resumed_at: u64,
    /// The import had finished before this run: nothing was read.
    pub was_finished: bool,
    pub elapsed: Duration,
    pub dry_run: bool,
    /// An export in parts: (parts, parts finished before this run).
    pub parts: Option<(usize, usize)>,
}

impl std::fmt::Display for ImportReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.tally;
        if self.was_finished {
            writeln!(
                f,
                "this import finished before: nothing to do (its summary below; delete {} to import the file again, which would change nothing)",
                self.state_dir.display()
            )?;
        } else if self.resumed_at > 0 {
            writeln!(f, "resumed after row {}", self.resumed_at)?;
        }
        if let Some((n, before)) = self.parts {
            writeln!(
                f,
                "parts: {n} files ({before} finished before this run; each part's checkpoint under {})",
                self.state_dir.join("parts").display()
            )?;
        }
        let secs = self.elapsed.as_secs_f64().max(1e-3);
        let this_run = t.rows().saturating_sub(self.resumed_at);
        writeln!(
            f,
            "rows: {} ({} this run in {:.1} s, {:.0}/s){}",
            t.rows(),
            this_run,
            secs,
            this_run as f64 / secs,
            if self.dry_run {
                " (dry run: nothing written)"
            } else {
                ""
            }
        )?;
        writeln!(f, "  loaded    {:>10}  new edges", t.loaded)?;
        writeln!(
            f,
            "  updated   {:>10}  edges the import wrote, replaced by a later row of the same edge",
            t.updated
        )?;
        for (why, n) in &t.skipped {
            let what = match why.as_str() {
                write::ALREADY => "imported before (a re-run or a resumed run)",
                write::SUPERSEDED => "a later row of the same edge is in",
                write::LIVE => "the live write path has the edge (left as it is)",
                _ => "",
            };
            writeln!(f, "  skipped   {n:>10}  {why}: {what}")?;
        }
        write!(
            f,
            "  rejected  {:>10}  each with its reason in {}\nitems written: {} (next: likes reconcile --items-from {})",
            t.rejected,
            self.state_dir.join("rejects.jsonl").display(),
            self.state_dir.join("items.txt").display(),
            self.state_dir.join("items.txt").display(),
        )
    }
}

pub async fn run(settings: &Settings, topology: &Topology, args: &Args) -> Result<ImportReport> {
    let started = Instant::now();
    let state = StateDir::open(&args.state_dir()?)?;
    let files = parts::expand(&args.paths, &state.dir)?;
    let formats = parts::formats(&files, args.format)?;
    let writer = Writer {
        settings,
        topology,
        concurrency: args.concurrency,
        dry_run: args.dry_run,
        cell: tokio::sync::OnceCell::new(),
    };
    if let [one] = args.paths.as_slice() {
        if !one.is_dir() {
            return run_file(&writer, args, &files[0], formats[0], &state, started).await;
        }
    }
    if !args.dry_run {
        parts::fix_manifest(&state, &files)?;
    }
    let mut all = ImportReport {
        tally: Tally::default(),
        state_dir: state.dir.clone(),
        resumed_at: 0,
        was_finished: true,
        elapsed: Duration::ZERO,
        dry_run: args.dry_run,
        parts: Some((files.len(), 0)),
    };
    let mut dirs = Vec::with_capacity(files.len());
    for (i, (file, format)) in files.iter().zip(&formats).enumerate() {
        let dir = StateDir::open(&parts::part_dir(&state, i, file))?;
        info!(part = i + 1, of = files.len(), file = %file.display(), "import: part");
        let r = run_file(&writer, args, file, *format, &dir, Instant::now()).await?;
        all.tally.add(&r.tally);
        all.resumed_at += r.resumed_at;
        all.was_finished &= r.was_finished;
        if r.was_finished {
            all.parts = all.parts.map(|(n, before)| (n, before + 1));
        }
        dirs.push(dir.dir);
        // A kill between parts, at a moment a signal cannot pick (tests/stack/import.rs).
        fail::fail_point!("import-after-part", |_| Err(Error::Injected(
            "import-after-part"
        )));
    }
    parts::join_side_files(&state, &dirs)?;
    all.elapsed = started.elapsed();
    Ok(all)
}

/// The writer, connected on first use: a run whose parts are all done, or a dry run, never
/// needs the database.
struct Writer<'a> {
    settings: &'a Settings,
    topology: &'a Topology,
    concurrency: usize,
    dry_run: bool,
    cell: tokio::sync::OnceCell<Arc<ChunkWriter>>,
}

impl Writer<'_> {
    async fn get(&self) -> Result<Option<Arc<ChunkWriter>>> {
        if self.dry_run {
            return Ok(None);
        }
        let w = self
            .cell
            .get_or_try_init(|| async {
                connect(self.settings, self.topology, self.concurrency)
                    .await
                    .map(Arc::new)
            })
            .await?;
        Ok(Some(w.clone()))
    }
}

/// One file into the store, resuming at the checkpoint in `state`.
async fn run_file(
    writer: &Writer<'_>,
    args: &Args,
    path: &std::path::Path,
    format: Format,
    state: &StateDir,
    started: Instant,
) -> Result<ImportReport> {
    let (settings, topology) = (writer.settings, writer.topology);
    let file = FileId::of(path)?;
    let fresh = Checkpoint {
        file: file.clone(),
        format,
        mapping: args.mapping.clone(),
        keyspace: settings.cql.keyspace.clone(),
        started_ms: now_ms(),
        rows_done: 0,
        tally: Tally::default(),
        rejects_len: 0,
        items_len: 0,
        finished: false,
    };
    let mut ck = match state.load()? {
        None => fresh,
        // Its side files would be cut to nothing under the real import's checkpoint.
        Some(_) if args.dry_run => {
            return Err(Error::Precondition(format!(
                "{} holds a real import's checkpoint: a dry run there would overwrite its \
                 rejects; give the dry run another --state-dir",
                state.dir.display()
            )))
        }
        Some(c)
            if c.file != file
                || c.format != format
                || c.mapping != args.mapping
                || c.keyspace != fresh.keyspace =>
        {
            return Err(Error::Precondition(format!(
                "{} holds the checkpoint of another import ({}, {} bytes, {:?}, keyspace {}); \
                 use another --state-dir, or delete that one to start this file over",
                state.dir.display(),
                c.file.path,
                c.file.size,
                c.mapping,
                c.keyspace
            )))
        }
        Some(c) => c,
    };
    let report = |ck: &Checkpoint, resumed_at, was_finished| ImportReport {
        tally: ck.tally.clone(),
        state_dir: state.dir.clone(),
        resumed_at,
        was_finished,
        elapsed: started.elapsed(),
        dry_run: args.dry_run,
        parts: None,
    };
    if ck.finished {
        return Ok(report(&ck, ck.rows_done, true));
    }
    let resumed_at = ck.rows_done;
    let writer = writer.get().await?;
    let shape = row::Shape::new(
        topology.buckets,
        topology.dedupe_ttl.as_millis() as i64,
        ck.started_ms,
        args.mapping.liked.is_none(),
    );
    let mut rejects = state.side_file(&state.rejects_path(), ck.rejects_len)?;
    let mut items = state.side_file(&state.items_path(), ck.items_len)?;
    let source = Source::open(path, format, &args.mapping)?;
    info!(file = %path.display(), ?format, resume_after = resumed_at, state = %state.dir.display(), "import: starting");
    let total = source.rows;
    let size = source.size_bytes;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<(Vec<Shaped>, Vec<String>, u64)>>(
        args.window.div_ceil(CHUNK).max(1),
    );
    let reader = tokio::task::spawn_blocking(move || read(source, shape, resumed_at, tx));
    let in_flight = args.window.div_ceil(CHUNK).max(1);
    let mut chunks = tokio_stream_of(rx)
        .map(|chunk| {
            let writer = writer.clone();
            async move {
                let (rows, raw, bytes) = chunk?;
                let outcomes = match &writer {
                    Some(w) => w.write(&rows).await?,
                    None => rows
                        .iter()
                        .map(|(_, r)| match r {
                            Ok(_) => Outcome::Loaded,
                            Err(why) => Outcome::Rejected(why.clone()),
                        })
                        .collect(),
                };
                Ok::<_, Error>((rows, raw, bytes, outcomes))
            }
        })
        .buffered(in_flight);
    let mut progress =
        crate::ops::progress::Progress::new("import: rows", total.map(|t| t - resumed_at.min(t)));
    let mut saved = Instant::now();
    let mut last_item = String::new();
    while let Some(settled) = chunks.next().await {
        let (rows, raw, bytes, outcomes) = settled?;
        let mut rej = String::new();
        let mut its = String::new();
        for (((seq, r), raw), o) in rows.iter().zip(&raw).zip(&outcomes) {
            // Every item with a row the import accepted, whatever the row's outcome: a row
            // found already imported may be one a killed run wrote after its last checkpoint,
            // whose item the side file, cut back to that checkpoint, no longer lists. A
            // recount of an item with nothing to fix sends nothing.
            if let (Ok(e), false) = (r, matches!(o, Outcome::Rejected(_) | Outcome::Erased(_))) {
                if e.item != last_item {
                    its.push_str(&e.item);
                    its.push('\n');
                    last_item.clone_from(&e.item);
                }
            }
            match o {
                Outcome::Loaded => ck.tally.loaded += 1,
                Outcome::Updated => ck.tally.updated += 1,
                Outcome::Skipped(why) => *ck.tally.skipped.entry(why.to_string()).or_default() += 1,
                Outcome::Rejected(why) => {
                    ck.tally.rejected += 1;
                    rej.push_str(
                        &serde_json::json!({"file": file.path, "row": seq + 1, "reason": why, "raw": raw})
                            .to_string(),
                    );
                    rej.push('\n');
                }
                Outcome::Erased(erasure) => {
                    ck.tally.rejected += 1;
                    let why = format!(
                        "an erased account's row (erasure {erasure}): not imported, and not kept here"
                    );
                    rej.push_str(
                        &serde_json::json!({"file": file.path, "row": seq + 1, "reason": why})
                            .to_string(),
                    );
                    rej.push('\n');
                }
            }
        }
        let io = |p: PathBuf| Error::io(format!("writing {}", p.display()));
        rejects
            .write_all(rej.as_bytes())
            .map_err(io(state.rejects_path()))?;
        items
            .write_all(its.as_bytes())
            .map_err(io(state.items_path()))?;
        ck.rejects_len += rej.len() as u64;
        ck.items_len += its.len() as u64;
        if let Some(&(seq, _)) = rows.last() {
            ck.rows_done = seq + 1;
        }
        if total.is_none() && bytes > 0 {
            let estimate = ck.rows_done as f64 * size as f64 / bytes as f64;
            progress.set_total(Some((estimate as u64).saturating_sub(resumed_at)));
        }
        progress.add(rows.len() as u64);
        if (saved.elapsed() >= CHECKPOINT_EVERY || checkpoint_each_chunk()) && !args.dry_run {
            save(state, &ck, &rejects, &items)?;
            saved = Instant::now();
        }
    }
    reader
        .await
        .map_err(|e| Error::State(format!("the import's reader: {e}")))??;
    progress.finish();
    ck.finished = true;
    if !args.dry_run {
        save(state, &ck, &rejects, &items)?;
    }
    info!(
        rows = ck.rows_done,
        loaded = ck.tally.loaded,
        rejected = ck.tally.rejected,
        "import: done"
    );
    Ok(report(&ck, resumed_at, false))
}

/// The side files on disk before the checkpoint that counts them.
fn save(
    state: &StateDir,
    ck: &Checkpoint,
    rejects: &std::fs::File,
    items: &std::fs::File,
) -> Result<()> {
    rejects
        .sync_data()
        .and_then(|_| items.sync_data())
        .map_err(Error::io(format!("syncing {}", state.dir.display())))?;
    // A test holds the import here, its rows written and listed but not yet counted as
    // done: the moment a kill -9 leaves rows that a resumed run finds already imported.
    fail::fail_point!("import-before-checkpoint", !ck.finished, |_| Ok(()));
    state.save(ck)?;
    // A test holds the import here, once part of the file is checkpointed, to kill it halfway
    // on any box (a fast one otherwise finished the file before the kill).
    fail::fail_point!(
        "import-after-checkpoint",
        ck.rows_done > 0 && !ck.finished,
        |_| Ok(())
    );
    Ok(())
}

/// Tests checkpoint after every chunk, to place a kill between two saves exactly.
fn checkpoint_each_chunk() -> bool {
    fail::fail_point!("import-checkpoint-each-chunk", |_| true);
    false
}

async fn connect(
    settings: &Settings,
    topology: &Topology,
    concurrency: usize,
) -> Result<ChunkWriter> {
    let session = crate::cql::connect(&settings.cql).await?;
    // Rows are shaped against this host's clock (the dedupe horizon's floor, `row::Shape`).
    crate::cql::clock::check(&session, settings.cql.max_clock_skew).await?;
    let ks = &settings.cql.keyspace;
    // Buckets as the keyspace records them: an edge in the wrong bucket is a lost edge.
    crate::store::recorded::check_buckets(&session, ks, topology).await?;
    Ok(ChunkWriter {
        imported: crate::store::imported::Imported::prepare(session.clone(), ks).await?,
        erasures: crate::store::erasures::Erasures::prepare(session.clone(), ks).await?,
        routes: crate::region::Routes::for_process(&session, settings).await?,
        permits: Arc::new(Semaphore::new(concurrency.max(1))),
    })
}

type Chunk = Result<(Vec<Shaped>, Vec<String>, u64)>;

/// The reader thread: rows after `skip`, shaped, in chunks, each with its raw text and the
/// bytes read so far.
fn read(
    mut source: Source,
    shape: row::Shape,
    skip: u64,
    tx: tokio::sync::mpsc::Sender<Chunk>,
) -> Result<()> {
    let mut rows = Vec::with_capacity(CHUNK);
    let mut raw = Vec::with_capacity(CHUNK);
    while let Some(r) = source.next_row() {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                let msg = e.to_string();
                let _ = tx.blocking_send(Err(e));
                return Err(Error::Input(msg));
            }
        };
        if r.seq < skip {
            continue;
        }
        let edge = match r.values {
            Ok(v) => shape.edge(&v),
            Err(why) => Err(why),
        };
        rows.push((r.seq, edge));
        raw.push(r.raw);
        if rows.len() == CHUNK {
            let chunk = (
                std::mem::take(&mut rows),
                std::mem::take(&mut raw),
                source.bytes_read(),
            );
            if tx.blocking_send(Ok(chunk)).is_err() {
                return Ok(()); // the writer stopped; its error is the one to report
            }
        }
    }
    if !rows.is_empty() {
        let _ = tx.blocking_send(Ok((rows, raw, source.bytes_read())));
    }
    Ok(())
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
