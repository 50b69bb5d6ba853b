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
        // A batch lingers 1 ms, not the stages' 5: the sooner the event is on the log, the
        // sooner it is counted (the write's answer no longer waits for it).
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
        let (key, payload) = self.record(item, user, edge, source, home);
        self.producer
            .send(
                FutureRecord::to(&self.topic).key(&key).payload(&payload),
                self.timeout,
            )
            .await
            .map_err(|(e, _)| Error::Kafka(e))?;
        Ok(())
    }

    /// Hands the edge's current flip to the producer now, without waiting: in the caller's
    /// order, so a user's next write cannot put its event on the log before this one. Returns
    /// the broker's acknowledgement, to wait for or not; a full queue is an error at once.
    pub fn enqueue(
        &self,
        item: &str,
        user: &str,
        edge: &Edge,
        source: Source,
        home: Home,
    ) -> Result<impl std::future::Future<Output = Result<()>> + Send + 'static> {
        let (key, payload) = self.record(item, user, edge, source, home);
        let delivery = self
            .producer
            .send_result(FutureRecord::to(&self.topic).key(&key).payload(&payload))
            .map_err(|(e, _)| Error::Kafka(e))?;
        Ok(async move {
            match delivery.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(Error::Kafka(e)),
                Err(_) => Err(Error::Kafka(rdkafka::error::KafkaError::Canceled)),
            }
        })
    }

    fn record(
        &self,
        item: &str,
        user: &str,
        edge: &Edge,
        source: Source,
        home: Home,
    ) -> (String, Vec<u8>) {
        Flip {
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
        .record_at_home(self.buckets, home)
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
