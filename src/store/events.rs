//! The events topic as the API and the relay write it: one LikeEvent per flip, keyed
//! `item#bucket`, through an idempotent producer that waits for the broker's ack.

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::kafka;
use crate::records::{Flip, Home};
use crate::schema::v1::Source;
use crate::store::edges::Edge;
use crate::topology::Topology;

#[derive(Clone)]
pub struct Events {
    producer: FutureProducer,
    topic: String,
    buckets: u32,
    timeout: Duration,
}

impl Events {
    pub fn connect(settings: &Settings, topology: &Topology) -> Result<Self> {
        // Each write waits for its event's acknowledgement, so a batch lingers 1 ms, not the
        // stages' 5: at 1,000 writes/s that still batches, and the median write is 4 ms faster.
        let producer: FutureProducer = kafka::producer_config(&settings.kafka)
            .set("linger.ms", "1")
            .create()?;
        Ok(Self {
            producer,
            topic: settings.topic(&topology.topics.events.name),
            buckets: topology.buckets,
            timeout: settings.kafka.request_timeout,
        })
    }

    /// Publishes the edge's current flip, written under `home` (its range's epoch and since
    /// when it is homed here; zero without home regions), and waits for the broker's
    /// acknowledgement.
    pub async fn publish(
        &self,
        item: &str,
        user: &str,
        edge: &Edge,
        source: Source,
        home: Home,
    ) -> Result<()> {
        let (key, payload) = Flip {
            item,
            user,
            op_id: edge.op_id as u64,
            liked: edge.liked,
            event_time_ms: edge.updated_at_ms,
            prev_event_time_ms: edge.prev_at_ms,
            earlier_event_times_ms: edge.earlier(),
            source,
            platform: edge.platform(),
        }
        .record_at_home(self.buckets, home);
        self.producer
            .send(
                FutureRecord::to(&self.topic).key(&key).payload(&payload),
                self.timeout,
            )
            .await
            .map_err(|(e, _)| Error::Kafka(e))?;
        Ok(())
    }

    /// Whether the broker answers for the events topic (within 2 s).
    pub async fn reachable(&self) -> std::result::Result<(), String> {
        let (producer, topic) = (self.producer.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || {
            use rdkafka::producer::Producer;
            producer
                .client()
                .fetch_metadata(Some(&topic), Duration::from_secs(2))
                .map(|_| ())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    }
}
