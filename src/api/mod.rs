//! `likes api`: the HTTP front door (axum). Writes go through the three layers of
//! idempotency of docs/design.md and publish a LikeEvent; reads serve counts and button states.
//!
//! - [`write`]: like / unlike: request-key claim, outbox, the edge's compare-and-set flip,
//!   the event, the stored answer.
//! - [`read`]: the public count `{count, asOf}` and the actor's own button state.
//! - [`auth`]: signed session tokens; the acting user never comes from the request body.

pub mod admin;
pub mod admission;
pub mod auth;
pub mod error;
pub mod observe;
pub mod read;
pub mod request_keys;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use scylla::client::session::Session;
use serde_json::json;
use tracing::info;

use crate::config::Settings;
use crate::cql;
use crate::error::{Error, Result};
use crate::relay::{self, Relay};
use crate::runtime::supervise::connect_patiently;
use crate::store::events::Events;
use crate::store::Stores;
use crate::topology::Topology;
use error::ApiError;

/// The API document, checked in as `api/openapi.yaml`.
pub const OPENAPI: &str = include_str!("../../api/openapi.yaml");

/// How long a stopping API waits for the relay's pass in flight.
const RELAY_DRAIN: Duration = Duration::from_secs(10);

/// Largest request body accepted (writes are empty or `{}`; a full batchGet is ~13 KB).
const BODY_LIMIT: usize = 16 * 1024;

/// What every handler shares.
pub struct App {
    pub settings: Settings,
    pub topology: Topology,
    pub session: Arc<Session>,
    pub store: Stores,
    pub events: Events,
    pub signer: auth::Signer,
}

impl App {
    /// Connects to CQL and Kafka and prepares the statements.
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<Arc<Self>> {
        let signer = auth::Signer::from_session_key(&settings.api.session_key)?;
        let session = cql::connect(&settings.cql).await?;
        cql::recorded::check_buckets(&session, &settings.cql.keyspace, topology).await?;
        cql::check_clock(&session).await?;
        let store = Stores::prepare(&session, &settings.cql.keyspace).await?;
        store.outbox.init_floors().await?;
        Ok(Arc::new(Self {
            settings: settings.clone(),
            topology: topology.clone(),
            session,
            store,
            events: Events::connect(settings, topology)?,
            signer,
        }))
    }
}

/// Every route.
impl App {
    /// The write path for a job (erase): it serves no requests, so its token signer holds a
    /// random key no token was ever signed with, and api.session_key is not needed.
    pub async fn connect_job(settings: &Settings, topology: &Topology) -> Result<Arc<Self>> {
        let mut settings = settings.clone();
        settings.api.session_key = hex::encode(rand::random::<[u8; 32]>());
        Self::connect(&settings, topology).await
    }
}

pub fn router(app: Arc<App>) -> Router {
    let admission = Arc::new(admission::Admission::new(
        app.settings.api.max_writes_in_flight,
        app.settings.api.max_writes_per_s,
    ));
    let writes = Router::new()
        .route("/v1/items/{item_id}/likes", post(write::like))
        .route("/v1/items/{item_id}/likes/{user_id}", delete(write::unlike))
        .route("/v1/admin/retractions", post(admin::retract))
        .route("/v1/admin/erasures", post(admin::request_erasure))
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
        .route("/v1/admin/erasures/{id}", get(admin::erasure))
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
        .layer(axum::middleware::from_fn(observe::record))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

/// Serves until SIGTERM or Ctrl-C; with `api.relay`, runs the relay beside, on the same CQL
/// session, and waits for its pass in flight before returning.
pub async fn serve(settings: &Settings, topology: &Topology) -> Result<()> {
    let (app, relay) = connect_patiently("api", || async {
        let app = App::connect(settings, topology).await?;
        let relay = if settings.api.relay {
            let (session, events) = (app.session.clone(), app.events.clone());
            Some(Relay::prepare(session, events, settings, topology).await?)
        } else {
            None
        };
        Ok((app, relay))
    })
    .await?;
    let stop = crate::runtime::shutdown::CancellationToken::new();
    tokio::spawn(crate::ops::erase::export_pending(
        app.clone(),
        Duration::from_secs(30),
        stop.clone(),
    ));
    let relay = relay.map(|relay| {
        tokio::spawn(relay::run(
            Arc::new(relay),
            settings.api.relay_interval,
            settings.api.relay_min_age,
            stop.clone(),
        ))
    });
    let listener = tokio::net::TcpListener::bind(&settings.api.listen)
        .await
        .map_err(Error::io(format!(
            "binding api.listen {}",
            settings.api.listen
        )))?;
    info!(listen = %settings.api.listen, "api serving");
    let served = axum::serve(listener, router(app))
        .with_graceful_shutdown(crate::runtime::shutdown::signal())
        .await
        .map_err(Error::io(format!(
            "serving api.listen {}",
            settings.api.listen
        )));
    stop.cancel();
    if let Some(relay) = relay {
        // A pass in flight finishes (its entries are deleted only after their events are
        // published); one that outlasts the wait is dropped: its entries stay for the next.
        if tokio::time::timeout(RELAY_DRAIN, relay).await.is_err() {
            tracing::warn!(wait = ?RELAY_DRAIN, "relay pass still running at shutdown; its entries stay for the next pass");
        }
    }
    served
}

/// Ready only when CQL and Kafka both answer.
async fn ready(
    State(app): State<Arc<App>>,
) -> std::result::Result<Json<serde_json::Value>, ApiError> {
    app.session
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await
        .map_err(|e| ApiError::Unavailable(format!("CQL: {e}")))?;
    app.events
        .reachable()
        .await
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
