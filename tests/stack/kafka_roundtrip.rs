//! A LikeEvent encoded with prost goes through the real broker and comes back equal, on the
//! partition the Java client's murmur2 picks for its key.

use std::time::Duration;

use prost::Message;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message as _, Offset, TopicPartitionList};

use likes::schema::v1::{EdgeState, LikeEvent, Source};
use likes::{hash, kafka};

const PARTITIONS: i32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn like_events_round_trip_on_the_murmur2_partition() {
    let settings = crate::common::settings("roundtrip");
    let topic = settings.topic("likes.events");
    let admin = kafka::admin(&settings.kafka).unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let created = admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &opts,
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");

    let producer: FutureProducer = kafka::producer_config(&settings.kafka).create().unwrap();
    let events: Vec<LikeEvent> = (0..20)
        .map(|i| {
            let user = format!("user-{i}");
            LikeEvent {
                item_id: format!("item-{}", i % 3),
                bucket: hash::bucket_of(&user, 64),
                user_id: user,
                op_id: i as u64 + 1,
                state: if i % 2 == 0 {
                    EdgeState::Liked
                } else {
                    EdgeState::Unliked
                } as i32,
                event_time_ms: 1_700_000_000_000 + i as i64,
                epoch: 1,
                source: Source::Test as i32,
                prev_event_time_ms: 0,
                earlier_event_times_ms: vec![],
                client_platform: likes::schema::v1::ClientPlatform::Ios as i32,
                home_since_ms: 0,
            }
        })
        .collect();

    let mut sent = Vec::new(); // (partition, offset, key, event)
    for e in &events {
        let key = hash::event_key(&e.item_id, e.bucket);
        let payload = e.encode_to_vec();
        let delivery = producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&payload),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(err, _)| err)
            .unwrap();
        let (partition, offset) = (delivery.partition, delivery.offset);
        assert_eq!(
            partition as u32,
            hash::partition_for(key.as_bytes(), PARTITIONS as u32),
            "key {key} landed off the murmur2 partition"
        );
        sent.push((partition, offset, key, e.clone()));
    }

    let consumer: StreamConsumer = kafka::client_config(&settings.kafka)
        .set("group.id", crate::common::unique("roundtrip"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();

    let mut received = Vec::new();
    while received.len() < sent.len() {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("timed out waiting for records")
            .unwrap();
        let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
        let event = LikeEvent::decode(m.payload().unwrap()).unwrap();
        received.push((m.partition(), m.offset(), key, event));
    }
    sent.sort_by_key(|(p, o, ..)| (*p, *o));
    received.sort_by_key(|(p, o, ..)| (*p, *o));
    assert_eq!(received, sent);

    admin.delete_topics(&[&topic], &opts).await.unwrap();
}
