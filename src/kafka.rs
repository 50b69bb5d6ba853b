//! Kafka client configuration shared by every producer, consumer and admin client, so that
//! all of them agree on the things that must agree (the partitioner above all).

use std::sync::{Arc, Mutex};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
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
    metrics::gauge!(crate::metrics::CONSUMER_LAG, "stage" => stage).set(lag as f64);
}

/// Partitions a rebalance assigned or revoked, for the stage loop to act on between batches
/// (callbacks run inside `poll`, when no batch is in flight).
#[derive(Default)]
pub struct Assignments {
    assigned: Mutex<Vec<i32>>,
    revoked: Mutex<Vec<i32>>,
}

impl Assignments {
    pub fn take_assigned(&self) -> Vec<i32> {
        std::mem::take(&mut *self.assigned.lock().unwrap())
    }

    pub fn take_revoked(&self) -> Vec<i32> {
        std::mem::take(&mut *self.revoked.lock().unwrap())
    }

    /// True when no rebalance happened since the last takes.
    pub fn is_empty(&self) -> bool {
        self.assigned.lock().unwrap().is_empty() && self.revoked.lock().unwrap().is_empty()
    }
}

/// The consumer context of a stage: records rebalances and publishes consumer lag.
pub struct StageContext {
    pub stage: &'static str,
    pub assignments: Arc<Assignments>,
}

impl ClientContext for StageContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        record_lag(self.stage, &statistics);
    }
}

impl ConsumerContext for StageContext {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let parts = |tpl: &TopicPartitionList| -> Vec<i32> {
            tpl.elements().iter().map(|e| e.partition()).collect()
        };
        match rebalance {
            Rebalance::Assign(tpl) => {
                info!(stage = self.stage, partitions = ?parts(tpl), "assigned");
                self.assignments.assigned.lock().unwrap().extend(parts(tpl));
            }
            Rebalance::Revoke(tpl) => {
                info!(stage = self.stage, partitions = ?parts(tpl), "revoked");
                self.assignments.revoked.lock().unwrap().extend(parts(tpl));
            }
            Rebalance::Error(e) => warn!(stage = self.stage, error = %e, "rebalance error"),
        }
    }
}

/// A record for `likes.dlq`: the original key and value untouched, the reason and the
/// source position in headers (`likes.error`, `likes.source.topic|partition|offset`).
pub fn dead_letter<'a>(
    dlq_topic: &'a str,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
    reason: &str,
    source: (&str, i32, i64),
) -> BaseRecord<'a, [u8], [u8]> {
    let (topic, partition, offset) = source;
    let headers = OwnedHeaders::new()
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
