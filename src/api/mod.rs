//! `likes api`: the HTTP front door (axum), HTTP only: requests are parsed and checked here,
//! writes handed to the write path (`crate::write`: the three layers of idempotency of
//! docs/design.md), and answers or refusals made responses. The process around it (the relay
//! and the erasure gauges beside it) is assembled in `cmd/stages.rs`.
//!
//! - [`write`]: like / unlike as HTTP carries them.
//! - [`read`]: the public count `{count, asOf}` and the actor's own button state.
//! - [`auth`]: signed session tokens; the acting user never comes from the request body.

pub mod admin;
pub mod admission;
pub mod auth;
pub mod error;
pub mod forward;
pub mod gate;
pub mod limit;
pub mod observe;
pub mod read;
pub mod serve;
pub mod tls;
pub mod user_share;
pub mod write;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use scylla::client::session::Session;
use serde_json::json;

use crate::config::Settings;
use crate::error::Result;
use crate::store::events::Events;
use crate::store::Stores;
use crate::topology::Topology;
use crate::write::{valid_id, Writer};
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
    pub store: Arc<Stores>,
    pub events: Events,
    pub writer: Writer,
    pub signer: auth::Signer,
    /// With `region.name` set: where writes of other regions' items go.
    pub forwarder: Option<forward::Forwarder>,
    /// batchGet calls served at once (`api.max_batch_gets_in_flight`): reads are not admitted
    /// with the writes, and one call reads up to 200 rows.
    pub batch_gets: tokio::sync::Semaphore,
}

impl App {
    /// Connects to CQL and Kafka and prepares the statements.
    pub async fn connect(settings: &Settings, topology: &Topology) -> Result<Arc<Self>> {
        let signer = auth::Signer::from_session_key(&settings.api.session_key)?;
        let (writer, session) = Writer::connect(settings, topology).await?;
        let forwarder = forward::Forwarder::new(settings)?;
        Ok(Arc::new(Self {
            settings: settings.clone(),
            topology: topology.clone(),
            store: writer.store().clone(),
            events: writer.events().clone(),
            writer,
            session,
            signer,
            forwarder,
            batch_gets: tokio::sync::Semaphore::new(settings.api.max_batch_gets_in_flight.max(1)),
        }))
    }
}

/// Every route.
pub fn router(app: Arc<App>) -> Router {
    let request_timeout = app.settings.api.request_timeout;
    let admission = Arc::new(admission::Admission::new(
        app.settings.api.max_writes_in_flight,
        app.settings.api.write_latency_target,
        app.settings.api.max_writes_per_s,
        user_share::UserShare::new(
            app.settings.api.max_writes_per_user_per_s,
            app.settings.api.user_write_burst,
        ),
    ));
    let writes = Router::new()
        .route("/v1/items/{item_id}/likes", post(write::like))
        .route("/v1/items/{item_id}/likes/{user_id}", delete(write::unlike))
        .route("/v1/admin/retractions", post(admin::retract))
        .route("/v1/admin/erasures", post(admin::request_erasure))
        .route_layer(axum::middleware::from_fn_with_state(
            admission,
            admission::admit,
        ))
        // Outermost, so first: a request that is not who it says spends no admission, no
        // write budget and no database work (issue 44).
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            gate::authenticate,
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
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                serve::timeout(request_timeout, req, next)
            },
        ))
        .layer(axum::middleware::map_response(name_region(&app)))
        .layer(axum::middleware::from_fn(observe::record))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

/// With `region.name` set, every answer names the region that gave it (`X-Likes-Region`);
/// a forwarded answer keeps the home's.
fn name_region(
    app: &App,
) -> impl Fn(axum::response::Response) -> std::future::Ready<axum::response::Response> + Clone {
    let region = app
        .forwarder
        .as_ref()
        .and_then(|f| axum::http::HeaderValue::from_str(f.region()).ok());
    move |mut r: axum::response::Response| {
        if let Some(v) = &region {
            r.headers_mut()
                .entry(forward::ANSWERED_BY)
                .or_insert(v.clone());
        }
        std::future::ready(r)
    }
}

/// Ready only when CQL and Kafka both answer.
async fn ready(
    State(app): State<Arc<App>>,
) -> std::result::Result<Json<serde_json::Value>, ApiError> {
    // Why, in the log only: the probe's caller needs no hosts or driver text.
    app.session
        .query_unpaged("SELECT release_version FROM system.local", ())
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "not ready: CQL does not answer");
            ApiError::Unavailable("CQL does not answer".into())
        })?;
    app.events.reachable().await.map_err(|e| {
        tracing::warn!(error = %e, "not ready: Kafka does not answer");
        ApiError::Unavailable("Kafka does not answer".into())
    })?;
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
        // A write's token was checked by the gate already.
        if let Some(gate::Caller::User(user)) = parts.extensions.get::<gate::Caller>() {
            return Ok(Actor(user.clone()));
        }
        Self::verify(&parts.headers, app)
    }
}

impl Actor {
    /// The user `Authorization: Bearer <session token>` names, if its token is valid now.
    pub fn verify(
        headers: &axum::http::HeaderMap,
        app: &App,
    ) -> std::result::Result<Self, ApiError> {
        let header = headers
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
