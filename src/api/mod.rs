//! `likes api`: the HTTP front door (axum). Writes go through the three layers of
//! idempotency of DESIGN.md and publish a LikeEvent; reads serve counts and button states.
//!
//! - [`write`]: like / unlike: request-key claim, outbox, the edge's compare-and-set flip,
//!   the event, the stored answer.
//! - [`read`]: the public count `{count, asOf}` and the actor's own button state.
//! - [`auth`]: signed session tokens; the acting user never comes from the request body.

pub mod admin;
pub mod admission;
pub mod auth;
pub mod error;
pub mod read;
pub mod relay;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use rdkafka::producer::FutureProducer;
use scylla::client::session::Session;
use serde_json::json;
use tracing::info;

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::{cql, kafka};
use error::ApiError;

/// The API document, checked in as `api/openapi.yaml`.
pub const OPENAPI: &str = include_str!("../../api/openapi.yaml");

/// Largest request body accepted (writes are empty or `{}`; a full batchGet is ~13 KB).
const BODY_LIMIT: usize = 16 * 1024;

/// What every handler shares.
pub struct App {
    pub settings: Settings,
    pub topology: Topology,
    pub session: Arc<Session>,
    pub producer: FutureProducer,
    pub signer: auth::Signer,
    pub stmts: write::Statements,
    pub events_topic: String,
}

impl App {
    /// Connects to CQL and Kafka and prepares the statements.
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<Arc<Self>> {
        let signer = auth::Signer::from_session_key(&settings.api.session_key)?;
        let session = cql::connect(&settings.cql).await?;
        cql::recorded::check(&session, &settings.cql.keyspace, topology).await?;
        let stmts = write::Statements::prepare(&session, &settings.cql.keyspace).await?;
        write::init_outbox_floors(&session, &stmts).await?;
        // Each write waits for its event's acknowledgement, so a batch lingers 1 ms, not the
        // stages' 5: at 1,000 writes/s that still batches, and the median write is 4 ms faster.
        let producer: FutureProducer = kafka::producer_config(&settings.kafka)
            .set("linger.ms", "1")
            .create()?;
        Ok(Arc::new(Self {
            settings: settings.clone(),
            topology: topology.clone(),
            session,
            producer,
            signer,
            stmts,
            events_topic: settings.topic(&topology.topics.events.name),
        }))
    }
}

/// Every route.
pub fn router(app: Arc<App>) -> Router {
    let admission = Arc::new(admission::Admission::new(
        app.settings.api.max_writes_in_flight,
        app.settings.api.max_writes_per_s,
    ));
    let writes = Router::new()
        .route("/v1/items/{item_id}/likes", post(write::like))
        .route("/v1/items/{item_id}/likes/{user_id}", delete(write::unlike))
        .route("/v1/admin/retractions", post(admin::retract))
        .route_layer(axum::middleware::from_fn_with_state(
            admission,
            admission::admit,
        ));
    Router::new()
        .merge(writes)
        .route("/v1/items/{item_id}/likes/{user_id}", get(read::liked))
        .route("/v1/items/{item_id}/count", get(read::count))
        .route("/v1/items/{item_id}/likes", get(read::likers))
        .route("/v1/likes:batchGet", post(read::batch_get))
        .route(
            "/healthz",
            get(|| async { Json(json!({ "status": "ok" })) }),
        )
        .route("/readyz", get(ready))
        .route(
            "/openapi.yaml",
            get(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/yaml")],
                    OPENAPI,
                )
            }),
        )
        .fallback(|| async { ApiError::NotFound("no such endpoint (see the API document)".into()) })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

/// Connects, waiting out a store or broker that is restarting (1 s doubling to 10 s, a warn
/// line each) instead of exiting into a crash loop; what no wait can fix (configuration,
/// schema, topology) ends the process.
async fn connect_patiently(settings: &Settings, topology: &Topology) -> Result<Arc<App>> {
    let mut backoff = crate::runtime::supervise::Backoff::default();
    loop {
        match App::connect(settings, topology).await {
            Ok(app) => return Ok(app),
            Err(e) if e.is_retryable() => {
                let wait = backoff.wait();
                tracing::warn!(error = %e, retry_in = ?wait, "api: a dependency is not answering yet");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Serves until SIGTERM or Ctrl-C.
pub async fn serve(settings: &Settings, topology: &Topology) -> Result<()> {
    let app = connect_patiently(settings, topology).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if settings.api.relay {
        tokio::spawn(relay::run(
            app.clone(),
            settings.api.relay_interval,
            settings.api.relay_min_age,
            stop.clone(),
        ));
    }
    let listener = tokio::net::TcpListener::bind(&settings.api.listen)
        .await
        .map_err(|e| Error::Config(format!("api.listen {}: {e}", settings.api.listen)))?;
    info!(listen = %settings.api.listen, "api serving");
    let served = axum::serve(listener, router(app))
        .with_graceful_shutdown(crate::runtime::shutdown::signal())
        .await
        .map_err(|e| Error::State(format!("api: {e}")));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    served
}

/// `likes relay` on its own: passes until SIGTERM.
pub async fn relay_alone(settings: &Settings, topology: &Topology) -> Result<()> {
    let app = connect_patiently(settings, topology).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        crate::runtime::shutdown::signal().await;
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    relay::run(
        app,
        settings.api.relay_interval,
        settings.api.relay_min_age,
        stop,
    )
    .await;
    Ok(())
}

/// Ready only when CQL and Kafka both answer.
async fn ready(
    State(app): State<Arc<App>>,
) -> std::result::Result<Json<serde_json::Value>, ApiError> {
    app.session
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await
        .map_err(|e| ApiError::Unavailable(format!("CQL: {e}")))?;
    let producer = app.producer.clone();
    let topic = app.events_topic.clone();
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::Producer;
        producer
            .client()
            .fetch_metadata(Some(&topic), Duration::from_secs(2))
    })
    .await
    .map_err(|e| ApiError::Unavailable(format!("Kafka: {e}")))?
    .map_err(|e| ApiError::Unavailable(format!("Kafka: {e}")))?;
    Ok(Json(json!({ "status": "ready" })))
}

/// The acting user, from `Authorization: Bearer <session token>`.
pub struct Actor(pub String);

impl FromRequestParts<Arc<App>> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App>,
    ) -> std::result::Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| {
                ApiError::Unauthenticated("missing Authorization: Bearer <session token>".into())
            })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::Unauthenticated("Authorization must be Bearer <session token>".into())
            })?;
        let now_s = crate::runtime::clock::now_ms() / 1000;
        app.signer
            .verify(token.trim(), now_s)
            .map(Actor)
            .map_err(|r| ApiError::Unauthenticated(r.to_string()))
    }
}

/// Item and user ids: 1-128 of `[A-Za-z0-9_-:]`. `#` and `.` stay out: `#` separates the
/// bucket in event keys and `.` the fields of session tokens.
pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':'))
}

/// Checks a path id, naming it in the error.
pub fn check_id(what: &str, id: &str) -> std::result::Result<(), ApiError> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "{what} must be 1-128 characters of A-Z a-z 0-9 _ - :"
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids() {
        assert!(super::valid_id("item-42"));
        assert!(super::valid_id("u:7_x"));
        assert!(!super::valid_id(""));
        assert!(!super::valid_id("a#1"));
        assert!(!super::valid_id("a.b"));
        assert!(!super::valid_id(&"x".repeat(129)));
    }
}
