//! The topology benchmark's peers, in Java (`tools/peers`, built by its `build.sh` with the
//! broker's Kafka version): the Kafka Streams exactly-once (v2) implementation of the same
//! topology, and the fastest plain consumer of the topic (batched polls of 5000 records).
//!
//! The peer runs as its own JVM (ParallelGC, 512 MB heap, 2 stream threads) on the same
//! input topic as `likes`; its drain ends when its committed offsets cover the whole input
//! and its repartition topic (read from the broker, not from its output), and its output is
//! then checked item by item against the ground truth.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use serde::Serialize;

use likes::config::Settings;
use likes::kafka;

/// Stream threads of the peer: one per core of this box.
const THREADS: usize = 2;

/// What the Kafka Streams peer did on the backlog.
#[derive(Debug, Default, Clone, Serialize)]
pub struct PeerRun {
    /// Records of the backlog over the seconds from process start to drained.
    pub events_per_s: f64,
    pub seconds: f64,
    /// Seconds until the JVM had started its streams (its log line).
    pub started_after_s: f64,
    /// Output records (one per item and window per commit).
    pub output_records: u64,
}

/// The script that builds the peers; `LIKES_PEERS_BUILD` overrides it.
fn build_script() -> PathBuf {
    std::env::var_os("LIKES_PEERS_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| likes_testkit::repo::root().join("tools/peers/build.sh"))
}

/// Builds the peers if their sources changed (once, cached) and returns their classpath.
pub fn classpath() -> Result<String> {
    let script = build_script();
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        return Err(anyhow!("{} failed (see above)", script.display()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn java(cp: &str, main: &str) -> Command {
    let mut c = Command::new("java");
    c.args([
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-XX:+UseParallelGC",
        "-Xms512m",
        "-Xmx512m",
        "-cp",
        cp,
        &format!("likes.peer.{main}"),
    ]);
    c
}

/// The plain Java consumer's rate over the whole topic (from its first poll).
pub fn raw_consume(
    cp: &str,
    settings: &Settings,
    topic: &str,
    partitions: i32,
    n: u64,
) -> Result<f64> {
    let out = java(cp, "RawConsumer")
        .args([
            settings.kafka.brokers.as_str(),
            topic,
            &partitions.to_string(),
            &n.to_string(),
        ])
        .stderr(Stdio::piped())
        .output()
        .context("starting java RawConsumer")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let (Some(records), Some(seconds)) = (parts.next(), parts.next()) else {
        return Err(anyhow!(
            "RawConsumer printed {text:?} (exit {})",
            out.status
        ));
    };
    let records: f64 = records.parse()?;
    let seconds: f64 = seconds.parse()?;
    Ok(records / seconds)
}

/// Runs the Kafka Streams peer on `input` (holding `n` records) until drained, stops it,
/// and checks its output against `truth` item by item.
#[allow(clippy::too_many_arguments)]
pub async fn run_streams(
    cp: &str,
    settings: &Settings,
    dir: &Path,
    input: &str,
    n: u64,
    repartitions: i32,
    window_ms: u64,
    truth: &HashMap<String, i64>,
) -> Result<PeerRun> {
    let app = format!("{}peer", settings.kafka.topic_prefix.replace('.', "-"));
    let output = format!("{}peer-out", settings.kafka.topic_prefix);
    let dlq = format!("{}peer-dlq", settings.kafka.topic_prefix);
    create_topics(settings, &[(&output, repartitions), (&dlq, 1)]).await?;
    let log = std::fs::File::create(dir.join("peer.log"))?;
    let started = Instant::now();
    let started_ms = likes::runtime::clock::now_ms();
    let mut child = java(cp, "StreamsPeer")
        .args([
            settings.kafka.brokers.as_str(),
            &app,
            input,
            &output,
            &dlq,
            &repartitions.to_string(),
            &window_ms.to_string(),
            &dir.join("peer-state").display().to_string(),
            &THREADS.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting java StreamsPeer")?;
    let repartition = format!("{app}-deltas-repartition");
    let watch = {
        let settings = settings.clone();
        let (app, input) = (app.clone(), input.to_string());
        tokio::task::spawn_blocking(move || wait_drained(&settings, &app, &input, &repartition, n))
    };
    let drained = watch.await?;
    let seconds = started.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    drained?;
    let peer_log = std::fs::read_to_string(dir.join("peer.log")).unwrap_or_default();
    let started_after_s = peer_log
        .lines()
        .find_map(|l| {
            l.split("peer: started ")
                .nth(1)?
                .rsplit(" at ")
                .next()?
                .parse::<i64>()
                .ok()
        })
        .map(|at| (at - started_ms) as f64 / 1000.0)
        .unwrap_or(f64::NAN);
    let (sums, output_records) = {
        let settings = settings.clone();
        tokio::task::spawn_blocking(move || read_output(&settings, &output)).await??
    };
    let mut wrong = Vec::new();
    let items: std::collections::BTreeSet<&String> = sums.keys().chain(truth.keys()).collect();
    for item in items {
        let (have, want) = (
            sums.get(item).copied().unwrap_or(0),
            truth.get(item).copied().unwrap_or(0),
        );
        if have != want {
            wrong.push(format!("{item}: {have} (truth {want})"));
        }
    }
    if !wrong.is_empty() {
        return Err(anyhow!(
            "the Kafka Streams peer's output differs from the truth on {} items, e.g. {}",
            wrong.len(),
            wrong[..wrong.len().min(5)].join(", ")
        ));
    }
    Ok(PeerRun {
        events_per_s: n as f64 / seconds,
        seconds,
        started_after_s,
        output_records,
    })
}

async fn create_topics(settings: &Settings, topics: &[(&str, i32)]) -> Result<()> {
    let admin = kafka::admin(&settings.kafka)?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    for r in admin.create_topics(&new, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// Blocks until the peer's committed offsets cover every record of `input` and every record
/// of its repartition topic (whose last entry in each partition is a transaction marker,
/// which a committed offset may or may not have passed).
fn wait_drained(
    settings: &Settings,
    app: &str,
    input: &str,
    repartition: &str,
    n: u64,
) -> Result<()> {
    let c: BaseConsumer = kafka::client_config(&settings.kafka)
        .set("group.id", app)
        .set("enable.auto.commit", "false")
        .create()?;
    let timeout = Duration::from_secs(10);
    let deadline = Instant::now() + Duration::from_secs(1800);
    let partitions = |topic: &str| -> Result<Vec<i32>> {
        let md = c.fetch_metadata(Some(topic), timeout)?;
        Ok(md
            .topics()
            .first()
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default())
    };
    loop {
        std::thread::sleep(Duration::from_millis(250));
        if Instant::now() > deadline {
            return Err(anyhow!(
                "the Kafka Streams peer did not drain within 1800 s"
            ));
        }
        let (ins, reps) = (partitions(input)?, partitions(repartition)?);
        if reps.is_empty() {
            continue; // not created yet
        }
        let mut tpl = TopicPartitionList::new();
        for &p in &ins {
            tpl.add_partition(input, p);
        }
        for &p in &reps {
            tpl.add_partition(repartition, p);
        }
        let committed = c.committed_offsets(tpl, timeout)?;
        let at = |topic: &str, p: i32| match committed.find_partition(topic, p).map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => o,
            _ => 0,
        };
        let read: i64 = ins.iter().map(|&p| at(input, p)).sum();
        if read < n as i64 {
            continue;
        }
        let mut behind = false;
        for &p in &reps {
            let (_, high) = c.fetch_watermarks(repartition, p, timeout)?;
            behind |= high > 0 && at(repartition, p) < high - 1;
        }
        if !behind {
            return Ok(());
        }
    }
}

/// The peer's output, summed per item: the last value of each (item, window) (an update per
/// commit replaces the one before), then the windows of an item added up.
fn read_output(settings: &Settings, topic: &str) -> Result<(BTreeMap<String, i64>, u64)> {
    let c: BaseConsumer = kafka::client_config(&settings.kafka)
        .set("group.id", format!("{topic}-check"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let partitions =
        likes_testkit::topics::partitions(&c, topic, likes_testkit::topics::METADATA_BOUND)
            .map_err(anyhow::Error::msg)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        ends.insert(p, high);
    }
    c.assign(&tpl)?;
    let mut windows: HashMap<(String, i64), i64> = HashMap::new();
    let mut records = 0u64;
    let mut idle = Instant::now();
    let done = |c: &BaseConsumer| {
        let Ok(pos) = c.position() else { return false };
        ends.iter().all(|(&p, &high)| {
            matches!(pos.find_partition(topic, p).map(|e| e.offset()), Some(Offset::Offset(o)) if o >= high)
                || high == 0
        })
    };
    while idle.elapsed() < Duration::from_secs(5) {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            if done(&c) {
                break;
            }
            continue;
        };
        let m = m?;
        idle = Instant::now();
        let (Some(k), Some(v)) = (m.key(), m.payload()) else {
            continue;
        };
        if v.len() != 16 {
            return Err(anyhow!(
                "peer output record of {} bytes, expected 16",
                v.len()
            ));
        }
        let start = i64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
        let sum = i64::from_be_bytes(v[8..].try_into().expect("8 bytes"));
        windows.insert((String::from_utf8_lossy(k).into_owned(), start), sum);
        records += 1;
    }
    let mut sums = BTreeMap::new();
    for ((item, _), sum) in windows {
        *sums.entry(item).or_insert(0) += sum;
    }
    sums.retain(|_, v| *v != 0);
    Ok((sums, records))
}
