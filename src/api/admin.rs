//! `POST /v1/admin/retractions`: an operator (abuse, legal) unlikes for a user, with a
//! reason. It takes a separate credential, goes through the same write path as the user's
//! own unlike (so the count drops through the pipeline, never by overwrite), marks the event
//! as a retraction, and records who was retracted and why in `retractions`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::error::ApiError;
use super::{check_id, App};
use crate::runtime::clock::now_ms;
use crate::schema::v1::Source;
use crate::store::erasures::Erasure;
use crate::write::{Write, WriteError};

#[derive(Debug, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Retraction {
    pub item_id: String,
    pub user_id: String,
    pub reason: String,
}

pub async fn retract(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Json<Retraction>, axum::extract::rejection::JsonRejection>,
) -> Result<axum::response::Response, ApiError> {
    check(&app, &headers)?;
    let Json(r) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_id("itemId", &r.item_id)?;
    check_id("userId", &r.user_id)?;
    if !(1..=500).contains(&r.reason.trim().len()) {
        return Err(ApiError::BadRequest(
            "reason must be 1-500 characters".into(),
        ));
    }
    let key = &super::write::request_key(&headers)?;
    // Stored in the operators' namespace of request keys: no user key can reach it.
    let write = Write {
        source: Source::Retraction,
        ..Write::by_user(&r.user_id, &r.item_id, false, key)
    };
    let answer = match app.writer.write(&write).await {
        Ok(answer) => answer,
        // Another region's item: its home retracts it and records why (as a user's write is
        // forwarded; a retrying tool would otherwise be told not_home for ever).
        Err(WriteError::NotHome {
            home,
            item,
            range,
            region,
        }) => {
            let refusal = ApiError::from(WriteError::NotHome {
                home: home.clone(),
                item,
                range,
                region,
            });
            let Some(f) = &app.forwarder else {
                return Err(refusal);
            };
            let body = serde_json::to_vec(&r).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            crate::write::cas_done::forwarding();
            return f
                .forward(
                    &home,
                    Method::POST,
                    "/v1/admin/retractions",
                    &headers,
                    Some(body),
                    refusal,
                )
                .await;
        }
        Err(e) => return Err(e.into()),
    };
    app.store
        .retractions
        .record(&r.item_id, &r.user_id, r.reason.trim(), key, now_ms())
        .await?;
    // The user is on the retraction's row; the log names the item only (issue 44).
    tracing::info!(item = %r.item_id, reason = %r.reason, changed = answer.changed, "retraction");
    Ok(Json(answer).into_response())
}

/// The operators' credential: X-Admin-Token equal to api.admin_token.
pub(super) fn check(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let admin = &app.settings.api.admin_token;
    let given = headers
        .get("x-admin-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // An unset admin token disables the endpoint; a comparison in constant time otherwise.
    if admin.len() < 32 || !constant_time_eq(given.as_bytes(), admin.as_bytes()) {
        return Err(ApiError::Unauthenticated(
            "admin endpoints need X-Admin-Token (api.admin_token)".into(),
        ));
    }
    Ok(())
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ErasureRequest {
    pub user_id: String,
}

/// `POST /v1/admin/erasures {userId}`: records the erasure durably and answers 202 with its
/// id; `likes erase` works it. Asking again for a user not yet purged answers the same one.
pub async fn request_erasure(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Json<ErasureRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Erasure>), ApiError> {
    check(&app, &headers)?;
    let Json(r) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_id("userId", &r.user_id)?;
    let e = app.store.erasures.request(&r.user_id, now_ms()).await?;
    app.writer.note_erased(&r.user_id);
    // The erasure's id finds its user in `erasures`; a log line naming the user would outlive
    // the erasure itself.
    tracing::info!(id = %e.id, "erasure requested");
    Ok((StatusCode::ACCEPTED, Json(e)))
}

/// `GET /v1/admin/erasures/{id}`: where the erasure is.
pub async fn erasure(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Erasure>, ApiError> {
    check(&app, &headers)?;
    check_id("id", &id)?;
    app.store
        .erasures
        .get(&id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no erasure {id}")))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
