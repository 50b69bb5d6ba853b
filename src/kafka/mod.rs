//! Kafka client configuration shared by every producer, consumer and admin client, so that
//! all of them agree on the things that must agree (the partitioner above all), and the
//! levels librdkafka's own log lines get.
//!
//! - [`stage`]: what both stages' consumers share: rebalance events in order, committed
//!   offsets of newly assigned partitions, lag.
//! - [`dlq`]: the dead-letter record.
//! - [`group`]: committed positions and their metadata formats, waiting for an empty group.
//! - [`offsets`]: every other offset read: extents, offsets of a time, positions, range reads.

pub mod dlq;
pub mod group;
pub mod offsets;
pub mod stage;

pub use dlq::{dead_letter, DLQ_MAX_ORIGINAL_BYTES, DLQ_PREFIX_BYTES};
pub use stage::{newly_assigned, Assignments, Change, StageConsumer, StageContext};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::ConsumerContext;
use rdkafka::{ClientConfig, ClientContext};

use crate::config::KafkaSettings;
use crate::error::Result;

/// The partitioner of every producer of a keyed topic: the Java client's murmur2, so a tool
/// in another language lands a key on the same partition (see [`crate::hash`]).
pub const PARTITIONER: &str = "murmur2_random";

/// Base client config: brokers and timeouts.
pub fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &settings.brokers)
        .set(
            "socket.timeout.ms",
            settings.request_timeout.as_millis().to_string(),
        )
        .set("log_level", "4");
    c
}

/// A stage's group consumer: manual offsets, read_committed, static membership.
pub fn stage_consumer_config(settings: &KafkaSettings, group: &str, member: &str) -> ClientConfig {
    let mut c = client_config(settings);
    c.set("group.id", group)
        .set("group.instance.id", member)
        .set(
            "session.timeout.ms",
            settings.session_timeout.as_millis().to_string(),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "range")
        // Bound the prefetched records held in memory. The byte bound counts payloads only,
        // and each small record also costs librdkafka a ~0.5 KiB op: with 16 MiB of 100-byte
        // events the prefetch alone held ~80 MiB (a heap profile). 20K records per
        // partition still keeps a full turn's batch buffered.
        .set("queued.max.messages.kbytes", "4096")
        .set("queued.min.messages", "20000")
        // Statistics feed the consumer-lag gauge (see `record_lag`).
        .set("statistics.interval.ms", "1000");
    // rdkafka derives librdkafka's log level from the `log` crate's logger, which this
    // program does not install: without this, warnings (an offset reset among them) never
    // reach `StageContext::log`.
    c.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
    c
}

/// A producer config: idempotent (no duplicates or reordering from retries), acks=all,
/// the shared partitioner.
pub fn producer_config(settings: &KafkaSettings) -> ClientConfig {
    let mut c = client_config(settings);
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", PARTITIONER)
        .set("linger.ms", "5")
        .set("compression.type", "lz4");
    c
}

/// An admin client.
pub fn admin(settings: &KafkaSettings) -> Result<AdminClient<DefaultClientContext>> {
    Ok(client_config(settings).create()?)
}

/// Publishes a consumer's total lag (records behind the log end, over its assigned
/// partitions) from librdkafka's statistics, which stage contexts receive every second.
pub fn record_lag(stage: &'static str, stats: &rdkafka::Statistics) {
    let lag: i64 = stats
        .topics
        .values()
        .flat_map(|t| t.partitions.values())
        .filter(|p| p.partition >= 0 && p.consumer_lag >= 0)
        .map(|p| p.consumer_lag)
        .sum();
    metrics::gauge!(crate::runtime::metrics::CONSUMER_LAG, "stage" => stage).set(lag as f64);
}

/// librdkafka's own lines page nobody: it logs a broker's restart (refused connections,
/// transport failures) at its error level and a fenced client as FATAL, and the stages ride
/// through both (a fatal client ends the stage's incarnation, which starts over and says so
/// at warn). What the stage cannot handle reaches it as an error, and it is the stage that
/// logs at ERROR, once, when it exits. So librdkafka is at most warn.
pub(crate) fn librdkafka_log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
            tracing::warn!(target: "librdkafka", "{fac} {message}")
        }
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac} {message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "{fac} {message}"),
    }
}

/// A client's global errors (see [`librdkafka_log`]): all brokers down at warn; a single
/// connection's failure is in librdkafka's own log line already.
pub(crate) fn client_error(error: rdkafka::error::KafkaError, reason: &str) {
    use rdkafka::types::RDKafkaErrorCode as C;
    if error.rdkafka_error_code() == Some(C::BrokerTransportFailure) {
        tracing::debug!(target: "librdkafka", error = %error, reason, "client error");
    } else {
        tracing::warn!(target: "librdkafka", error = %error, reason, "client error");
    }
}

/// Whether a consumer's error ends this incarnation: a fatal one does (the static member
/// fenced by a newer one, say); the rest (brokers down, a partition's end) the client
/// rides through.
pub fn consumer_error(e: rdkafka::error::KafkaError) -> crate::error::Result<()> {
    use rdkafka::error::KafkaError;
    match e {
        KafkaError::PartitionEOF(_) => Ok(()),
        KafkaError::MessageConsumptionFatal(_) => Err(e.into()),
        e => {
            // Transport errors reach the client's error callback too, which logs them.
            tracing::debug!(error = %e, "consumer error; polling on");
            Ok(())
        }
    }
}

/// The context of the stages' other clients (producers, restore consumers): librdkafka's
/// logs and errors at the levels of [`StageContext`], instead of rdkafka's default, which
/// logs a broker's restart at ERROR.
#[derive(Clone, Copy, Default)]
pub struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        librdkafka_log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(error, reason);
    }
}

impl rdkafka::producer::ProducerContext for LogContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

impl ConsumerContext for LogContext {}
