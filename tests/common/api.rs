//! Helpers for API tests: a client speaking the API with signed tokens, an in-process
//! server on the real stack, and the events on the log.

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message as _;
use reqwest::StatusCode;
use serde_json::Value;

use likes::api::{self, auth::Signer};
use likes::config::Settings;
use likes::schema::v1::LikeEvent;
use likes::topology::Topology;

/// The admin credential of test servers.
pub const ADMIN: &str = "test-admin-token-0123456789abcdef";

pub const KEY: &str = "test-session-key-0123456789abcdef";

pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
    pub signer: Signer,
}

impl Client {
    pub fn token(&self, user: &str) -> String {
        self.signer
            .sign(user, likes::runtime::clock::now_ms() / 1000 + 600)
    }

    pub async fn like(&self, user: &str, item: &str, key: &str) -> (StatusCode, Value) {
        let url = format!("{}/v1/items/{item}/likes", self.base);
        self.write(self.http.post(url), user, key).await
    }

    /// A like whose request names its client (the X-Client-Platform header).
    pub async fn like_from(
        &self,
        platform: &str,
        user: &str,
        item: &str,
        key: &str,
    ) -> (StatusCode, Value) {
        let url = format!("{}/v1/items/{item}/likes", self.base);
        let req = self.http.post(url).header("X-Client-Platform", platform);
        self.write(req, user, key).await
    }

    pub async fn unlike(&self, user: &str, item: &str, key: &str) -> (StatusCode, Value) {
        let url = format!("{}/v1/items/{item}/likes/{user}", self.base);
        self.write(self.http.delete(url), user, key).await
    }

    /// A like or an unlike sent again with the same key while it is answered 503, as the API
    /// asks a client to ("retry with the same key"): a test that checks what the writes did,
    /// not how fast the box answers them, must not fail when a slow or loaded box lets a write
    /// pass its 2 s deadline. The key makes a retry replay, never flip twice.
    pub async fn until_answered(
        &self,
        like: bool,
        user: &str,
        item: &str,
        key: &str,
    ) -> (StatusCode, Value) {
        let mut tries = 0;
        loop {
            let (s, b) = if like {
                self.like(user, item, key).await
            } else {
                self.unlike(user, item, key).await
            };
            tries += 1;
            if s != StatusCode::SERVICE_UNAVAILABLE || tries == 30 {
                return (s, b);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    async fn write(
        &self,
        req: reqwest::RequestBuilder,
        user: &str,
        key: &str,
    ) -> (StatusCode, Value) {
        let r = req
            .bearer_auth(self.token(user))
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, user: &str, path: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(self.token(user))
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }
}

/// Every LikeEvent on the events topic, as (item, user, op_id, liked).
pub fn all_events(
    settings: &likes::config::Settings,
    topic: &str,
) -> Vec<(String, String, u64, bool)> {
    let mut out: Vec<_> = all_like_events(settings, topic)
        .into_iter()
        .map(|e| {
            let liked = e.state == likes::schema::v1::EdgeState::Liked as i32;
            (e.item_id, e.user_id, e.op_id, liked)
        })
        .collect();
    out.sort();
    out
}

/// Every LikeEvent on the events topic, whole, in the order read: each partition read from
/// its start to the end it had when asked, so the answer does not depend on how fast a group
/// joins or a fetch returns (an idle-time cut-off returned nothing on a slow box).
pub fn all_like_events(settings: &likes::config::Settings, topic: &str) -> Vec<LikeEvent> {
    use rdkafka::{Offset, TopicPartitionList};
    let c: BaseConsumer = likes::kafka::client_config(&settings.kafka)
        .set("group.id", super::unique("api-events"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let t = Duration::from_secs(10);
    // Waited for (issue 60): a topic not yet listed would read as holding no event.
    let partitions =
        likes_testkit::topics::partitions(&c, topic, likes_testkit::topics::METADATA_BOUND)
            .unwrap_or_else(|e| panic!("{e}"));
    let mut todo = std::collections::BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for id in partitions {
        // A partition whose leader is still being elected (a topic just made, a loaded
        // broker) answers NotLeaderForPartition for a moment: asked again, not failed.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (low, high) = loop {
            match c.fetch_watermarks(topic, id, t) {
                Ok(w) => break w,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("{topic} partition {}: {e}; asking again", id);
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{topic} partition {}: {e}", id),
            }
        };
        if high > low {
            todo.insert(id, high);
            tpl.add_partition_offset(topic, id, Offset::Offset(low))
                .unwrap();
        }
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !todo.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{topic}: partitions not read to their end in 60 s: {todo:?}"
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            out.push(LikeEvent::decode(m.payload().unwrap()).unwrap());
            if todo
                .get(&m.partition())
                .is_some_and(|&high| m.offset() + 1 >= high)
            {
                todo.remove(&m.partition());
            }
        }
    }
    out
}

pub fn of(events: &[(String, String, u64, bool)], item: &str, user: &str) -> Vec<(u64, bool)> {
    events
        .iter()
        .filter(|e| e.0 == item && e.1 == user)
        .map(|e| (e.2, e.3))
        .collect()
}

/// A fresh namespace on the real stack and the API serving it in this process.
pub async fn serve(base: &str) -> (Settings, Topology, Arc<api::App>, Arc<Client>) {
    serve_with(base, |_| {}).await
}

/// [`serve`] with settings adjusted by `adjust`.
pub async fn serve_with(
    base: &str,
    adjust: impl FnOnce(&mut Settings),
) -> (Settings, Topology, Arc<api::App>, Arc<Client>) {
    let mut settings = super::topology::settings(base);
    settings.api.session_key = KEY.into();
    settings.api.admin_token = ADMIN.into();
    adjust(&mut settings);
    let topology = Topology::load(None).unwrap();
    super::topology::setup(&settings, &topology).await;
    let app = api::App::connect(&settings, &topology).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = api::router(app.clone());
    // The server `likes api` runs, with its bounds (src/api/serve.rs).
    let bounds = api::serve::Bounds::of(&settings).unwrap();
    let stop = likes::runtime::shutdown::CancellationToken::new();
    tokio::spawn(api::serve::serve(listener, router, bounds, stop));
    let client = Arc::new(Client {
        http: reqwest::Client::new(),
        base: url,
        signer: Signer::new(KEY.as_bytes()),
    });
    (settings, topology, app, client)
}
