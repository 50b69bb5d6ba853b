//! Kafka client configuration shared by every producer, consumer and admin client, so that
//! all of them agree on the things that must agree (the partitioner above all).

use std::sync::{Arc, Mutex};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use sha2::Digest as _;
use tracing::{info, warn};

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

/// One rebalance event: partitions assigned or revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Assign(Vec<i32>),
    Revoke(Vec<i32>),
}

/// Rebalance events, in the order they happened, for the stage loop to act on between
/// batches (callbacks run inside `poll`, when no batch is in flight). Order matters: two
/// generations completing inside one poll (revoke all, assign A, revoke A, assign B) must
/// leave the stage owning B, not A and B.
#[derive(Default)]
pub struct Assignments {
    changes: Mutex<Vec<Change>>,
}

impl Assignments {
    /// Takes the events since the last take, oldest first.
    pub fn take(&self) -> Vec<Change> {
        std::mem::take(&mut *self.changes.lock().unwrap())
    }

    /// True when no rebalance happened since the last take.
    pub fn is_empty(&self) -> bool {
        self.changes.lock().unwrap().is_empty()
    }

    fn push(&self, change: Change) {
        self.changes.lock().unwrap().push(change);
    }
}

/// Applies rebalance events in order: `revoke` is called for every revoked partition, and
/// the partitions assigned and not revoked again afterwards are returned, to be taken up.
pub fn newly_assigned(changes: Vec<Change>, mut revoke: impl FnMut(i32)) -> Vec<i32> {
    let mut assigned: Vec<i32> = Vec::new();
    for c in changes {
        match c {
            Change::Assign(ps) => {
                for p in ps {
                    if !assigned.contains(&p) {
                        assigned.push(p);
                    }
                }
            }
            Change::Revoke(ps) => {
                for p in ps {
                    revoke(p);
                    assigned.retain(|&q| q != p);
                }
            }
        }
    }
    assigned
}

/// The consumer context of a stage: records rebalances and publishes consumer lag.
pub struct StageContext {
    pub stage: &'static str,
    pub assignments: Arc<Assignments>,
    /// Fetch positions librdkafka reset because the committed offset was out of range.
    pub offset_resets: Arc<std::sync::atomic::AtomicU64>,
}

impl ClientContext for StageContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        record_lag(self.stage, &statistics);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        // librdkafka resets a fetch position that is out of range (records deleted by
        // retention before the stage read them, or a recreated topic) to the earliest
        // record, and says so only in a warning. Records were skipped: make it loud, and
        // count it for an alert.
        let serious = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        if fac == "OFFSET" && message.contains("offset reset") && serious {
            metrics::counter!(crate::runtime::metrics::OFFSET_RESETS, "stage" => self.stage)
                .increment(1);
            self.offset_resets
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(stage = self.stage, detail = message,
                "committed offset out of range: the stage jumped to the earliest record, and the records in between were never read (counts may be short; reconcile the affected items)");
            return;
        }
        librdkafka_log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(error, reason);
    }
}

/// librdkafka's own lines page nobody: it logs a broker's restart (refused connections,
/// transport failures) at its error level and a fenced client as FATAL, and the stages ride
/// through both (a fatal client ends the stage's incarnation, which starts over and says so
/// at warn). What the stage cannot handle reaches it as an error, and it is the stage that
/// logs at ERROR, once, when it exits. So librdkafka is at most warn.
fn librdkafka_log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
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
fn client_error(error: rdkafka::error::KafkaError, reason: &str) {
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

impl ConsumerContext for StageContext {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let parts = |tpl: &TopicPartitionList| -> Vec<i32> {
            tpl.elements().iter().map(|e| e.partition()).collect()
        };
        match rebalance {
            Rebalance::Assign(tpl) => {
                info!(stage = self.stage, partitions = ?parts(tpl), "assigned");
                self.assignments.push(Change::Assign(parts(tpl)));
            }
            Rebalance::Revoke(tpl) => {
                info!(stage = self.stage, partitions = ?parts(tpl), "revoked");
                self.assignments.push(Change::Revoke(parts(tpl)));
            }
            Rebalance::Error(e) => warn!(stage = self.stage, error = %e, "rebalance error"),
        }
    }
}

/// The most of a record's key and value a dead letter carries verbatim. A record the broker
/// took can still be too large to send again with headers added (the producer's
/// `message.max.bytes` counts uncompressed bytes); such a dead letter would fail, the stage
/// would stop, restart, read it again, forever.
pub const DLQ_MAX_ORIGINAL_BYTES: usize = 256 * 1024;

/// What a dead letter keeps of an oversized original: its first bytes, to look at.
pub const DLQ_PREFIX_BYTES: usize = 1024;

/// A record for `likes.dlq`: the original key and value untouched, the reason and the
/// source position in headers (`likes.error`, `likes.source.topic|partition|offset`).
/// When key and value together exceed [`DLQ_MAX_ORIGINAL_BYTES`], only the first
/// [`DLQ_PREFIX_BYTES`] of each are kept, with each one's size and SHA-256 in headers
/// (`likes.payload.bytes|sha256`, `likes.key.bytes|sha256`), so a dead letter always fits.
pub fn dead_letter<'a>(
    dlq_topic: &'a str,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
    reason: &str,
    source: (&str, i32, i64),
) -> BaseRecord<'a, [u8], [u8]> {
    let (topic, partition, offset) = source;
    let size = key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len);
    let oversized = size > DLQ_MAX_ORIGINAL_BYTES;
    let mut headers = OwnedHeaders::new();
    let (mut key, mut payload) = (key, payload);
    if oversized {
        for (name, part) in [("key", &mut key), ("payload", &mut payload)] {
            if let Some(bytes) = *part {
                let digest: String = sha2::Sha256::digest(bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                headers = headers
                    .insert(Header {
                        key: &format!("likes.{name}.bytes"),
                        value: Some(&bytes.len().to_string()),
                    })
                    .insert(Header {
                        key: &format!("likes.{name}.sha256"),
                        value: Some(&digest),
                    });
                *part = Some(&bytes[..bytes.len().min(DLQ_PREFIX_BYTES)]);
            }
        }
    }
    let headers = headers
        .insert(Header {
            key: "likes.error",
            value: Some(reason),
        })
        .insert(Header {
            key: "likes.source.topic",
            value: Some(topic),
        })
        .insert(Header {
            key: "likes.source.partition",
            value: Some(&partition.to_string()),
        })
        .insert(Header {
            key: "likes.source.offset",
            value: Some(&offset.to_string()),
        });
    let mut r = BaseRecord::to(dlq_topic).headers(headers);
    if let Some(k) = key {
        r = r.key(k);
    }
    if let Some(v) = payload {
        r = r.payload(v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Headers;

    #[test]
    fn rebalance_events_apply_in_order() {
        // Two generations inside one poll: the stage ends owning the second's partitions,
        // and every partition it held is revoked first.
        let mut revoked = Vec::new();
        let take = newly_assigned(
            vec![
                Change::Revoke(vec![0, 1]),
                Change::Assign(vec![0, 1, 2]),
                Change::Revoke(vec![0, 1, 2]),
                Change::Assign(vec![2, 3]),
            ],
            |p| revoked.push(p),
        );
        assert_eq!(take, vec![2, 3]);
        assert_eq!(revoked, vec![0, 1, 0, 1, 2]);
        // Unordered lists (revokes, then assigns) would have taken up 0 and 1 as well.
    }

    #[test]
    fn an_oversized_dead_letter_keeps_a_prefix_its_size_and_hash() {
        let big = vec![7u8; DLQ_MAX_ORIGINAL_BYTES + 1];
        let r = dead_letter("dlq", Some(b"k"), Some(&big), "why", ("t", 1, 2));
        assert_eq!(r.payload.map(<[u8]>::len), Some(DLQ_PREFIX_BYTES));
        let h = r.headers.as_ref().unwrap();
        let get = |k: &str| {
            h.iter()
                .find(|x| x.key == k)
                .map(|x| String::from_utf8_lossy(x.value.unwrap()).into_owned())
        };
        assert_eq!(get("likes.payload.bytes"), Some(big.len().to_string()));
        assert_eq!(get("likes.payload.sha256").map(|d| d.len()), Some(64));
        assert_eq!(get("likes.error").as_deref(), Some("why"));
        let small = dead_letter("dlq", None, Some(b"abc"), "why", ("t", 1, 2));
        assert_eq!(small.payload, Some(&b"abc"[..]));
    }
}
