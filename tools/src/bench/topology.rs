//! `likes-tools bench topology`: the topology's throughput, staleness and memory on this machine,
//! next to the physical limit measured in the same run.
//!
//! 1. Produce N records shaped like production ([`super::gen`]): a zipf mix over `items` items
//!    plus one viral item taking `viral_share`; 90% likes of new edges, 10% unlikes of
//!    earlier likes; 3% duplicates (some arriving after a newer version of their edge);
//!    0.1% records that are not LikeEvents; event times from the clock at each send.
//! 2. The physical limit: the fastest plain consumer reads and decodes the whole topic (the
//!    higher of librdkafka's, one message per poll, and the Java client's, 5000 per poll).
//! 3. The peer ([`super::peer`]): Kafka Streams, exactly-once v2, the same topology on the
//!    same topic, timed from process start until its committed offsets cover the input and
//!    its repartition topic; its output is checked item by item.
//! 4. `likes dedupe` and `likes count` as child processes on the backlog, timed from process
//!    start until stage 1 has committed every record and stage 2 has applied every delta
//!    stage 1 wrote (both from their own /metrics, never from the counter table, so the
//!    measurement does not compete with the sink); then every count is checked item by item.
//! 5. Live phases: produce at half, then three quarters of the drained rate, open loop, and
//!    after a 5 s warm-up read staleness at the sink (sink time - event time) and where it
//!    goes, stage by stage, from both stages' histograms ([`Breakdown`]).
//! 6. Recovery: kill -9, then a graceful restart, of each stage under the half-rate load.
//!
//! Figures come from the stages' own /metrics; peak RSS from /proc (VmHWM).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use prost::Message as _;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use serde::Serialize;
use tracing::info;

use super::gen::Generator;
use super::harness::{spawn_stage, COUNT_PORT, DEDUPE_PORT};
use super::peer::{self, PeerRun};
use super::recovery::{self, Recovery, Restart};
use super::scrape::{buckets, diff, peak_rss_mb, quantile, scrape};
use anyhow::{anyhow, Result};
use likes::config::Settings;
use likes::kafka;
use likes::runtime::metrics as m;
use likes::schema::v1::LikeEvent;
use likes::store::counts::Counts;
use likes::topology::Topology;
use likes_testkit::procs::stop;

/// The start of the live phase that is not measured.
const LIVE_WARMUP: Duration = Duration::from_secs(5);

/// Knobs of one run (`likes-tools bench topology`).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Events in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// Items of the zipf mix (plus one viral item).
    #[arg(long, default_value_t = 100_000)]
    pub items: u32,
    /// Share of events that go to the viral item.
    #[arg(long, default_value_t = 0.3)]
    pub viral_share: f64,
    /// Seconds of each measured live phase (after a 5 s warm-up).
    #[arg(long, default_value_t = 20)]
    pub live_seconds: u64,
    /// The live phases' rates, as fractions of the drained rate; the first also carries the
    /// recovery measurements.
    #[arg(long, value_delimiter = ',', default_values_t = [0.5, 0.75])]
    pub live_fractions: Vec<f64>,
    /// One live phase at this many events/s instead of the fractions (runs side by side
    /// at one rate: a fraction of each run's own drained rate differs run to run).
    #[arg(long)]
    pub live_rate: Option<f64>,
    /// Skip the kill -9 and graceful restarts (a quicker run for staleness work).
    #[arg(long)]
    pub no_recovery: bool,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Window length for this run instead of the topology's (e.g. 250ms): staleness can
    /// only fall below one window.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub window: Option<Duration>,
    /// Skip the Kafka Streams peer (and the Java plain consumer): likes's figures only.
    #[arg(long)]
    pub no_peer: bool,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

impl BenchArgs {
    pub fn check(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.viral_share) || self.items == 0 || self.events == 0 {
            anyhow::bail!("--viral-share must be in [0, 1), --items and --events above 0");
        }
        if self.live_fractions.is_empty()
            || self.live_fractions.iter().any(|f| !(*f > 0.0 && *f <= 1.0))
        {
            anyhow::bail!("--live-fractions: one or more fractions in (0, 1]");
        }
        if self.live_rate.is_some_and(|r| r.is_nan() || r < 1.0) {
            anyhow::bail!("--live-rate: events/s, at least 1");
        }
        Ok(())
    }
}

/// What one run measured.
#[derive(Debug, Default, Serialize)]
pub struct BenchReport {
    pub events: u64,
    pub items: u32,
    pub viral_share: f64,
    pub window_ms: u64,
    /// Of the records: duplicates and records that are not LikeEvents.
    pub duplicates: u64,
    pub invalid: u64,
    pub produce_events_per_s: f64,
    /// The physical limit: the faster of the two plain consumers.
    pub raw_consume_events_per_s: f64,
    pub raw_librdkafka_events_per_s: f64,
    pub raw_java_events_per_s: f64,
    pub topology_events_per_s: f64,
    pub ratio_to_raw: f64,
    /// The Kafka Streams exactly-once peer on the same backlog.
    pub peer: PeerRun,
    /// likes drained events/s over the peer's.
    pub ratio_to_peer: f64,
    /// Stage 1 alone: when it had read the whole backlog.
    pub dedupe_events_per_s: f64,
    /// Stage 1's time on the backlog by loop phase (poll, process, commit, state), seconds.
    pub dedupe_phase_seconds: [f64; 4],
    pub drain_seconds: f64,
    pub windows_applied: f64,
    pub lwts: f64,
    pub lwts_per_applied_window: f64,
    pub live_rate_events_per_s: f64,
    pub live_staleness_p50_s: f64,
    pub live_staleness_p99_s: f64,
    /// The part before stage 2: delta log-append time minus event time.
    pub live_input_delay_p50_s: f64,
    pub live_input_delay_p99_s: f64,
    /// Events reaching stage 1's processing: wall clock minus event time.
    pub live_stage1_arrival_p50_s: f64,
    pub live_stage1_arrival_p99_s: f64,
    /// Each live phase's staleness, stage by stage (the first is the one above).
    pub live: Vec<Breakdown>,
    /// After kill -9 of each stage under the live load (the stage started again at once).
    pub recovery: Vec<Recovery>,
    pub dedupe_peak_rss_mb: f64,
    /// Stage 1's RocksDB memory at the end: memtables, block cache, table readers (MB).
    pub dedupe_state_memory_mb: [f64; 3],
    pub count_peak_rss_mb: f64,
}

fn producer(settings: &Settings) -> Result<ThreadedProducer<DefaultProducerContext>> {
    Ok(kafka::producer_config(&settings.kafka)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "500000")
        .create()?)
}

fn send(
    p: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    key: &str,
    value: &[u8],
) -> Result<()> {
    let mut record = BaseRecord::to(topic).key(key).payload(value);
    loop {
        match p.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                record = r;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Reads the whole topic once with a plain consumer, decoding every record: the raw rate.
fn raw_consume(settings: &Settings, topic: &str, partitions: i32, expected: u64) -> Result<f64> {
    let c: BaseConsumer = kafka::client_config(&settings.kafka)
        .set(
            "group.id",
            format!("bench-raw-{}", likes::runtime::clock::now_ms()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let started = Instant::now();
    let mut n = 0u64;
    let mut bytes = 0usize;
    while n < expected {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(anyhow!("raw consume: timed out after 600 s"));
        }
        if let Some(m) = c.poll(Duration::from_millis(500)) {
            let m = m?;
            // Records that are not LikeEvents are read and decoded like any other.
            if let Ok(e) = LikeEvent::decode(m.payload().unwrap_or_default()) {
                bytes += e.item_id.len();
            }
            n += 1;
        }
    }
    std::hint::black_box(bytes);
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Waits until stage 1 has committed `records` records and stage 2 has applied every delta
/// stage 1 wrote, read from their /metrics every 100 ms; returns when stage 1 had committed
/// them all. A drain that stops moving for 60 s is an error with the figures.
async fn wait_drained(records: f64) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut dedupe_done = None;
    let (mut last, mut moved) = (-1.0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let d = scrape(DEDUPE_PORT);
        let read = d.get(m::EVENTS_IN).copied().unwrap_or(0.0);
        if read >= records {
            let done = *dedupe_done.get_or_insert_with(Instant::now);
            let written = d.get(m::DELTAS_OUT).copied().unwrap_or(0.0);
            let applied = scrape(COUNT_PORT)
                .get(m::DELTAS_APPLIED)
                .copied()
                .unwrap_or(0.0);
            if applied >= written {
                return Ok(done);
            }
            if applied != last {
                (last, moved) = (applied, Instant::now());
            } else if moved.elapsed() > Duration::from_secs(60) {
                return Err(anyhow!(
                    "drain: stage 2 applied {applied} of the {written} deltas stage 1 wrote and \
                     has not moved for 60 s (an aborted transaction's deltas are counted as \
                     written; see the stages' logs)"
                ));
            }
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "drain: timed out after 3600 s with {read} of {records} records read"
            ));
        }
    }
}

/// Polls the counter rows (once a second: nothing is being timed) until every one equals
/// the truth; an error after 300 s.
async fn wait_for_counts(counts: &Counts, truth: &HashMap<String, i64>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let r = check_counts(counts, truth).await;
        if r.is_ok() || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every counter row against the ground truth, item by item.
async fn check_counts(counts: &Counts, truth: &HashMap<String, i64>) -> Result<()> {
    let have = counts.all().await?;
    let mut wrong = Vec::new();
    let items: std::collections::BTreeSet<&String> = have.keys().chain(truth.keys()).collect();
    for item in items {
        let (h, t) = (
            have.get(item).map(|c| c.0).unwrap_or(0),
            truth.get(item).copied().unwrap_or(0),
        );
        if h != t {
            wrong.push(format!("{item}: {h} (truth {t})"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(
            "{} items differ from the ground truth, e.g. {}",
            wrong.len(),
            wrong[..wrong.len().min(5)].join(", ")
        ))
    }
}

/// Runs the benchmark on its own topics and keyspace; returns the report.
pub async fn topology(
    base: &Settings,
    topology: &Topology,
    args: &BenchArgs,
) -> Result<BenchReport> {
    let stamp = likes::runtime::clock::now_ms();
    let mut settings = base.clone();
    settings.kafka.topic_prefix = format!("bench{stamp}.");
    settings.cql.keyspace = format!("bench_{stamp}");
    settings.dedupe.instance_id = format!("bench{stamp}");
    let dir = std::env::temp_dir().join(format!("likes-bench-{stamp}"));
    settings.dedupe.state_dir = dir.join("state");
    std::fs::create_dir_all(&dir)?;
    // The stages run exactly this run's topology (which may differ from the file's window).
    likes_testkit::namespace::write_topology(&dir, topology)?;
    let (session, _) = likes_testkit::namespace::create(&settings, topology, true).await?;
    let counts = Counts::prepare(session.clone(), &settings.cql.keyspace).await?;
    let events_topic = settings.topic(&topology.topics.events.name);
    info!(dir = %dir.display(), keyspace = %settings.cql.keyspace, "bench set up");

    let cp = if args.no_peer {
        None
    } else {
        Some(peer::classpath()?)
    };
    let mut g = Generator::new(
        StdRng::seed_from_u64(args.seed),
        args.items,
        args.viral_share,
        topology.buckets,
    );
    let mut report = BenchReport {
        events: args.events,
        items: args.items,
        viral_share: args.viral_share,
        window_ms: topology.window.as_millis() as u64,
        ..Default::default()
    };

    // 1. The backlog.
    let p = producer(&settings)?;
    report.produce_events_per_s = produce_backlog(&p, &mut g, &events_topic, args.events)?;
    eprintln!(
        "bench: produced {} events at {:.0}/s",
        args.events, report.produce_events_per_s
    );

    report.duplicates = g.duplicates;
    report.invalid = g.invalid;

    // 2. The physical limit: the faster plain consumer.
    let partitions = topology.topics.events.partitions;
    report.raw_librdkafka_events_per_s = tokio::task::block_in_place(|| {
        raw_consume(&settings, &events_topic, partitions, args.events)
    })?;
    report.raw_java_events_per_s = match &cp {
        Some(cp) => peer::raw_consume(cp, &settings, &events_topic, partitions, args.events)?,
        None => f64::NAN,
    };
    report.raw_consume_events_per_s = report
        .raw_librdkafka_events_per_s
        .max(report.raw_java_events_per_s);
    eprintln!(
        "bench: raw consume+decode {:.0}/s (librdkafka {:.0}/s, Java {:.0}/s)",
        report.raw_consume_events_per_s,
        report.raw_librdkafka_events_per_s,
        report.raw_java_events_per_s
    );

    // 3. The Kafka Streams peer on the same backlog.
    let backlog_truth = g.truth.clone();
    if let Some(cp) = &cp {
        eprintln!("bench: the Kafka Streams peer on the same backlog");
        report.peer = peer::run_streams(
            cp,
            &settings,
            &dir,
            &events_topic,
            args.events,
            topology.topics.deltas.partitions,
            report.window_ms,
            &backlog_truth,
        )
        .await?;
        eprintln!(
            "bench: Kafka Streams peer drained {} records in {:.1} s: {:.0}/s (its streams started after {:.1} s)",
            args.events, report.peer.seconds, report.peer.events_per_s, report.peer.started_after_s
        );
    }

    // 4. likes on the backlog.
    let started = Instant::now();
    let mut dedupe = spawn_stage("dedupe", &settings, DEDUPE_PORT, &dir)?;
    let mut count = spawn_stage("count", &settings, COUNT_PORT, &dir)?;
    let dedupe_done = wait_drained(args.events as f64).await?;
    report.drain_seconds = started.elapsed().as_secs_f64();
    report.dedupe_events_per_s =
        args.events as f64 / dedupe_done.duration_since(started).as_secs_f64();
    report.dedupe_phase_seconds = turn_phases(&scrape(DEDUPE_PORT));
    report.topology_events_per_s = args.events as f64 / report.drain_seconds;
    report.ratio_to_raw = report.topology_events_per_s / report.raw_consume_events_per_s;
    report.ratio_to_peer = if args.no_peer {
        f64::NAN
    } else {
        report.topology_events_per_s / report.peer.events_per_s
    };
    check_counts(&counts, &backlog_truth).await?;
    eprintln!(
        "bench: topology drained {} records in {:.1} s: {:.0}/s ({:.2} x the peer); every count equals the truth",
        args.events, report.drain_seconds, report.topology_events_per_s, report.ratio_to_peer
    );

    // 5. Live: fractions of the drained rate, open loop. The first seconds of each are a
    //    warm-up, not measured: the stages are still settling the backlog's (or the last
    //    phase's) aftermath (RocksDB compactions, the sink's last rounds).
    let mut produced = args.events;
    let drained = report.topology_events_per_s;
    let phases: Vec<(f64, f64)> = match args.live_rate {
        Some(rate) => vec![(rate / drained, rate)],
        None => args
            .live_fractions
            .iter()
            .map(|&f| (f, (drained * f).max(1.0)))
            .collect(),
    };
    for (fraction, rate) in phases {
        let warmup_events = (rate * LIVE_WARMUP.as_secs_f64()) as u64;
        let live_events = warmup_events + (rate * args.live_seconds as f64) as u64;
        let (before, before_dedupe) =
            produce_live(&p, &mut g, &events_topic, rate, live_events, warmup_events).await?;
        p.flush(Duration::from_secs(60))?;
        produced += live_events;
        wait_drained(produced as f64).await?;
        let b = Breakdown::since(fraction, rate, &before, &before_dedupe);
        eprintln!("bench: live at {fraction} of the drained rate: {b:?}");
        report.live.push(b);
    }
    let half = &report.live[0];
    report.live_rate_events_per_s = half.rate_events_per_s;
    [
        report.live_stage1_arrival_p50_s,
        report.live_stage1_arrival_p99_s,
    ] = half.stage1_read_s;
    [report.live_input_delay_p50_s, report.live_input_delay_p99_s] = half.delta_on_log_s;
    [report.live_staleness_p50_s, report.live_staleness_p99_s] = half.row_written_s;
    let rate = half.rate_events_per_s;
    let sink = scrape(COUNT_PORT);
    report.windows_applied = sink.get(m::WINDOWS_APPLIED).copied().unwrap_or(0.0);
    report.lwts = sink.get(m::SINK_LWTS).copied().unwrap_or(0.0);
    report.lwts_per_applied_window = report.lwts / report.windows_applied.max(1.0);
    memory_figures(&mut report, dedupe.child.id(), count.child.id());

    // 6. Recovery: kill -9 of each stage, then a graceful restart of each, while the live
    //    load goes on.
    let n = (rate * (recovery::GIVE_UP.as_secs_f64() + 10.0)) as u64;
    let restarts: &[Restart] = if args.no_recovery {
        &[]
    } else {
        &[Restart::Kill9, Restart::Graceful]
    };
    for &how in restarts {
        for (stage, proc) in [("dedupe", &mut dedupe), ("count", &mut count)] {
            let p99 = report.live_staleness_p99_s;
            let (produced, r) = tokio::join!(
                produce_live(&p, &mut g, &events_topic, rate, n, 0),
                recovery::measure(stage, how, proc, &settings, &dir, p99)
            );
            produced?;
            report.recovery.push(r?);
        }
    }
    p.flush(Duration::from_secs(60))?;
    // The restarted stages' counters start from zero: the end is judged on the counts.
    wait_for_counts(&counts, &g.truth).await?;
    stop(&mut dedupe);
    stop(&mut count);

    // Exactness, item by item, after the kills.
    check_counts(&counts, &g.truth).await?;

    // Leave nothing behind but the report.
    likes_testkit::namespace::drop(&session, &settings, topology).await?;
    let _ = std::fs::remove_dir_all(&dir);

    std::fs::create_dir_all(&args.out)?;
    let json = serde_json::to_string_pretty(&report)?;
    let path = args.out.join(format!("topology-{stamp}.json"));
    std::fs::write(&path, json)?;
    eprintln!("bench: report written to {}", path.display());
    Ok(report)
}

/// Produces `n` records of the backlog, each stamped with the clock at its send; returns the
/// produce rate.
fn produce_backlog(
    p: &ThreadedProducer<DefaultProducerContext>,
    g: &mut Generator,
    topic: &str,
    n: u64,
) -> Result<f64> {
    let started = Instant::now();
    for i in 0..n {
        let (k, v) = g.next(likes::runtime::clock::now_ms());
        send(p, topic, &k, &v)?;
        if i % 500_000 == 0 && i > 0 {
            eprintln!("bench: produced {i} events");
        }
    }
    p.flush(Duration::from_secs(120))?;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Produces `n` live events at `rate`, open loop; returns both stages' metrics as they
/// were when the first `warmup` events were out (the measured part starts there).
async fn produce_live(
    p: &ThreadedProducer<DefaultProducerContext>,
    g: &mut Generator,
    topic: &str,
    rate: f64,
    n: u64,
    warmup: u64,
) -> Result<(HashMap<String, f64>, HashMap<String, f64>)> {
    let (mut before, mut before_dedupe) = (HashMap::new(), HashMap::new());
    let started = Instant::now();
    for i in 0..n {
        if i == warmup {
            before = scrape(COUNT_PORT);
            before_dedupe = scrape(DEDUPE_PORT);
        }
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let (k, v) = g.next(likes::runtime::clock::now_ms());
        send(p, topic, &k, &v)?;
    }
    Ok((before, before_dedupe))
}

/// Stage 1's seconds in each phase of its turns.
fn turn_phases(d: &HashMap<String, f64>) -> [f64; 4] {
    ["poll", "process", "commit", "state"].map(|p| {
        d.get(&format!("{}_sum{{phase=\"{p}\"}}", m::TURN_SECONDS))
            .copied()
            .unwrap_or(0.0)
    })
}

/// Where one live phase's staleness goes: each figure is [p50, p99] seconds since the event
/// time, at four points of the path (issue 26, item 2). Each stage's histogram has its own
/// weighting (stage 1 per event, the delta per record from its earliest event, the last two
/// per flip from the mean event time of what a delta combines), so the quantiles add up
/// only roughly.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Breakdown {
    /// Of the drained rate.
    pub fraction: f64,
    pub rate_events_per_s: f64,
    /// Stage 1 processes the event.
    pub stage1_read_s: [f64; 2],
    /// Its delta is on the log (the delta's log-append time; stage 1's transaction).
    pub delta_on_log_s: [f64; 2],
    /// Its window has closed and is handed to the sink (stage 2's round).
    pub window_closed_s: [f64; 2],
    /// Its counter row is written: the staleness readers see.
    pub row_written_s: [f64; 2],
}

impl Breakdown {
    /// The histograms' growth since `before` (stage 2) and `before_dedupe` (stage 1).
    fn since(
        fraction: f64,
        rate: f64,
        before: &HashMap<String, f64>,
        before_dedupe: &HashMap<String, f64>,
    ) -> Self {
        let (after, after_dedupe) = (scrape(COUNT_PORT), scrape(DEDUPE_PORT));
        let q = |after: &HashMap<String, f64>, before: &HashMap<String, f64>, name: &str| {
            let d = diff(&buckets(after, name), &buckets(before, name));
            [quantile(&d, 0.5), quantile(&d, 0.99)]
        };
        Self {
            fraction,
            rate_events_per_s: rate,
            stage1_read_s: q(&after_dedupe, before_dedupe, m::EVENT_DELAY_SECONDS),
            delta_on_log_s: q(&after, before, m::INPUT_DELAY_SECONDS),
            window_closed_s: q(&after, before, m::WINDOW_CLOSED_SECONDS),
            row_written_s: q(&after, before, m::STALENESS_SECONDS),
        }
    }
}

/// Peak RSS of both stages, and stage 1's RocksDB memory by kind.
fn memory_figures(report: &mut BenchReport, dedupe_pid: u32, count_pid: u32) {
    report.dedupe_peak_rss_mb = peak_rss_mb(dedupe_pid);
    let d = scrape(DEDUPE_PORT);
    report.dedupe_state_memory_mb = ["memtables", "block_cache", "table_readers"].map(|k| {
        d.get(&format!("{}{{kind=\"{k}\"}}", m::STATE_MEMORY))
            .copied()
            .unwrap_or(0.0)
            / 1048576.0
    });
    report.count_peak_rss_mb = peak_rss_mb(count_pid);
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "| figure | value |\n|---|---|")?;
        writeln!(
            f,
            "| events (items, viral share); window | {} ({}, {:.0}%); {} ms |",
            self.events,
            self.items,
            self.viral_share * 100.0,
            self.window_ms
        )?;
        writeln!(
            f,
            "| of which duplicates / not LikeEvents | {} / {} |",
            self.duplicates, self.invalid
        )?;
        writeln!(
            f,
            "| produce rate | {:.0} events/s |",
            self.produce_events_per_s
        )?;
        writeln!(
            f,
            "| raw consume + decode (physical limit): librdkafka / Java | {:.0} / {:.0} events/s |",
            self.raw_librdkafka_events_per_s, self.raw_java_events_per_s
        )?;
        writeln!(
            f,
            "| Kafka Streams EOS v2 peer, drained from process start | {:.0} events/s in {:.1} s |",
            self.peer.events_per_s, self.peer.seconds
        )?;
        writeln!(
            f,
            "| topology, dedupe + count + sink, drained from process start | {:.0} events/s in {:.1} s |",
            self.topology_events_per_s, self.drain_seconds
        )?;
        writeln!(
            f,
            "| ratio to the peer / to the physical limit | {:.2} / {:.2} |",
            self.ratio_to_peer, self.ratio_to_raw
        )?;
        writeln!(
            f,
            "| stage 1 alone (backlog read and committed) | {:.0} events/s |",
            self.dedupe_events_per_s
        )?;
        let [poll, process, commit, state] = self.dedupe_phase_seconds;
        writeln!(
            f,
            "| stage 1 time: poll / process / commit / state | {poll:.1} / {process:.1} / {commit:.1} / {state:.1} s |"
        )?;
        writeln!(
            f,
            "| (item, window) applied / LWTs | {:.0} / {:.0} ({:.3} LWT per window) |",
            self.windows_applied, self.lwts, self.lwts_per_applied_window
        )?;
        writeln!(
            f,
            "| live staleness p50 / p99 at {:.0} events/s | {:.3} s / {:.3} s |",
            self.live_rate_events_per_s, self.live_staleness_p50_s, self.live_staleness_p99_s
        )?;
        writeln!(
            f,
            "| of which before stage 2 (delta log time - event time) p50 / p99 | {:.3} s / {:.3} s |",
            self.live_input_delay_p50_s, self.live_input_delay_p99_s
        )?;
        writeln!(
            f,
            "| of which before stage 1 processes the event p50 / p99 | {:.3} s / {:.3} s |",
            self.live_stage1_arrival_p50_s, self.live_stage1_arrival_p99_s
        )?;
        for b in &self.live {
            let s = |[p50, p99]: [f64; 2]| format!("{p50:.2} / {p99:.2}");
            writeln!(
                f,
                "| live at {:.2} of the drained rate ({:.0}/s), p50 / p99 s since the event: stage 1 reads / delta on the log / window closed / row written | {} · {} · {} · {} |",
                b.fraction,
                b.rate_events_per_s,
                s(b.stage1_read_s),
                s(b.delta_on_log_s),
                s(b.window_closed_s),
                s(b.row_written_s)
            )?;
        }
        for r in &self.recovery {
            writeln!(
                f,
                "| {} of {}: processing again / staleness back under p99 | {:.1} s / {:.1} s |",
                r.how.label(),
                r.stage,
                r.processing_again_s,
                r.staleness_back_s
            )?;
        }
        writeln!(
            f,
            "| peak RSS dedupe / count | {:.0} MB / {:.0} MB |",
            self.dedupe_peak_rss_mb, self.count_peak_rss_mb
        )?;
        let [mem, cache, readers] = self.dedupe_state_memory_mb;
        write!(
            f,
            "| stage 1 RocksDB memtables / block cache / table readers | {mem:.0} / {cache:.0} / {readers:.0} MB |"
        )
    }
}
