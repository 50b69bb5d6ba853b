//! Stage 1's restore from its changelog (issue 23, item 5): a changelog of `--records`
//! edge versions (10M by default) restored into an empty store, against the bare read of
//! the same records by a read_committed consumer that keeps nothing (the floor any restore
//! stands on), in one run, three times each; then a restore that finds half the partitions
//! restored already (as a killed one leaves them) and reads only the rest.
//!
//! The restore runs in this process, through the stage's own code
//! (`likes::dedupe::recovery::recover_partitions`), so the figure is the stage's.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::stats::{fig, mmm};
use likes::config::Settings;
use likes::dedupe::recovery::{recover_partitions, Recovery};
use likes::dedupe::rule::EdgeVersion;
use likes::dedupe::state::{encode_version, EdgeStore};
use likes::kafka::group::DedupeOffset;
use likes::kafka::{self, LogContext};
use likes::runtime::health::Health;
use likes::topology::Topology;

#[derive(Args, Debug, Clone)]
pub struct RestoreArgs {
    /// Changelog records to restore (edge versions; one edge in ten has two).
    #[arg(long, default_value_t = 10_000_000)]
    pub records: u64,
    /// Repeats of each measurement (the report gives median and min–max).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

/// The figures of one run.
#[derive(Debug)]
pub struct RestoreReport {
    pub records: u64,
    pub produce_s: f64,
    pub bare_read_s: Vec<f64>,
    pub restore_s: Vec<f64>,
    pub peak_rss_mb: f64,
    pub resumed_read: u64,
}

impl std::fmt::Display for RestoreReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = |v: &[f64]| mmm(v.iter().map(|s| self.records as f64 / s / 1000.0));
        let ratio = mmm(self
            .restore_s
            .iter()
            .zip(&self.bare_read_s)
            .map(|(r, b)| b / r));
        writeln!(
            f,
            "changelog restore: {} records (produced in {:.1} s)",
            self.records, self.produce_s
        )?;
        writeln!(
            f,
            "  bare read_committed read:  {} K records/s",
            fig(rate(&self.bare_read_s), 0)
        )?;
        writeln!(
            f,
            "  restore into RocksDB:      {} K records/s, {} s",
            fig(rate(&self.restore_s), 0),
            fig(mmm(self.restore_s.iter().copied()), 1)
        )?;
        writeln!(f, "  restore / bare read rate:  {}", fig(ratio, 2))?;
        writeln!(f, "  peak RSS of this process:  {:.0} MB", self.peak_rss_mb)?;
        write!(
            f,
            "  half the partitions restored before, then all: {} records read (of {})",
            self.resumed_read, self.records
        )
    }
}

pub async fn run(
    base: &Settings,
    topology: &Topology,
    args: &RestoreArgs,
) -> Result<RestoreReport> {
    let mut settings = base.clone();
    let name = format!(
        "bench_restore_{}",
        likes::runtime::clock::now_ms() / 1000 % 1_000_000
    );
    settings.cql.keyspace = name.clone();
    settings.kafka.topic_prefix = format!("{name}.");
    let (session, _) = likes_testkit::namespace::create(&settings, topology, false).await?;
    let topic = settings.topic(&topology.topics.dedupe_changelog.name);
    let partitions = topology.topics.dedupe_changelog.partitions;
    let result = measure(&settings, &topic, partitions, args).await;
    let _ = likes_testkit::namespace::drop(&session, &settings, topology).await;
    result
}

async fn measure(
    settings: &Settings,
    topic: &str,
    partitions: i32,
    args: &RestoreArgs,
) -> Result<RestoreReport> {
    let started = Instant::now();
    produce(settings, topic, args.records)?;
    let produce_s = started.elapsed().as_secs_f64();
    println!(
        "restore bench: {} records produced in {produce_s:.1} s",
        args.records
    );
    let dir = std::env::temp_dir().join(format!("likes-bench-restore-{}", std::process::id()));
    let result = restores(settings, topic, partitions, args, &dir, produce_s);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn restores(
    settings: &Settings,
    topic: &str,
    partitions: i32,
    args: &RestoreArgs,
    dir: &std::path::Path,
    produce_s: f64,
) -> Result<RestoreReport> {
    let mut report = RestoreReport {
        records: args.records,
        produce_s,
        bare_read_s: Vec::new(),
        restore_s: Vec::new(),
        peak_rss_mb: 0.0,
        resumed_read: 0,
    };
    let all: Vec<(i32, DedupeOffset)> = (0..partitions)
        .map(|p| (p, DedupeOffset::default()))
        .collect();
    for i in 0..args.repeats {
        let t = Instant::now();
        let n = tokio::task::block_in_place(|| bare_read(settings, topic, partitions))?;
        report.bare_read_s.push(t.elapsed().as_secs_f64());
        let store_dir = dir.join(format!("full-{i}"));
        let store = EdgeStore::open(&store_dir, 7 * 24 * 3_600_000, 64 << 20)?;
        let t = Instant::now();
        let restored = restore(settings, topic, &store, &all)?;
        report.restore_s.push(t.elapsed().as_secs_f64());
        println!(
            "restore bench: repeat {}: bare read {n} in {:.1} s, restore {restored} in {:.1} s",
            i + 1,
            report.bare_read_s[i],
            report.restore_s[i]
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&store_dir);
    }
    report.peak_rss_mb = super::scrape::peak_rss_mb(std::process::id());

    // Half the partitions restored and flushed, as a restore killed after its last flush
    // leaves them; then the whole restore again on the same store reads only the rest.
    let store = EdgeStore::open(&dir.join("resumed"), 7 * 24 * 3_600_000, 64 << 20)?;
    let half: Vec<(i32, DedupeOffset)> = all.iter().take(all.len() / 2).cloned().collect();
    restore(settings, topic, &store, &half)?;
    store.flush()?;
    report.resumed_read = restore(settings, topic, &store, &all)?;
    Ok(report)
}

/// The stage's restore of `partitions` into `store`; the records it read.
fn restore(
    settings: &Settings,
    topic: &str,
    store: &EdgeStore,
    partitions: &[(i32, DedupeOffset)],
) -> Result<u64> {
    let health = Health::new("dedupe", Duration::MAX);
    let read = tokio::task::block_in_place(|| {
        recover_partitions(settings, topic, store, partitions, &health)
    })?;
    Ok(read
        .iter()
        .map(|(_, r, _)| match r {
            Recovery::Restored(n) => *n,
            Recovery::UpToDate => 0,
        })
        .sum())
}

/// `records` edge versions: distinct edges, one in ten with a second, newer version.
fn produce(settings: &Settings, topic: &str, records: u64) -> Result<()> {
    let producer: ThreadedProducer<_> = kafka::producer_config(&settings.kafka)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let now = likes::runtime::clock::now_ms();
    let mut sent = 0u64;
    let mut edge = 0u64;
    while sent < records {
        edge += 1;
        let versions = if edge.is_multiple_of(10) { 2 } else { 1 };
        for op in 1..=versions {
            if sent >= records {
                break;
            }
            let key = format!("eitem-{}\0user-{edge}", edge % 100_000);
            let v = encode_version(&EdgeVersion {
                op_id: op,
                liked: op % 2 == 1,
                event_time_ms: now - 1000 + op as i64,
            });
            let mut r = BaseRecord::to(topic).key(key.as_bytes()).payload(&v[..]);
            loop {
                match producer.send(r) {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        back,
                    )) => {
                        r = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err((e, _)) => return Err(anyhow!("producing the changelog: {e}")),
                }
            }
            sent += 1;
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

/// Every record of the topic read by a read_committed consumer that keeps nothing.
fn bare_read(settings: &Settings, topic: &str, partitions: i32) -> Result<u64> {
    let consumer: BaseConsumer<LogContext> = kafka::client_config(&settings.kafka)
        .set("group.id", format!("bench-bare-{}", rand::random::<u32>()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10")
        .create_with_context(LogContext)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (mut n, mut at_end) = (0u64, 0);
    let deadline = Instant::now() + Duration::from_secs(1800);
    while at_end < partitions && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => n += 1,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => at_end += 1,
            _ => {}
        }
    }
    Ok(n)
}
