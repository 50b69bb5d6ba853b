//! `POST /v1/items/{itemId}/likes` and `DELETE /v1/items/{itemId}/likes/{userId}`: the
//! request as HTTP carries it (path ids, Idempotency-Key, X-Client-Platform, the empty body),
//! handed to the write path (`crate::write`), whose answer or refusal becomes the response.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::{check_id, Actor, App};
use crate::schema::v1::ClientPlatform;
use crate::write::{Write, WriteError};

/// `POST /v1/items/{itemId}/likes`: the session's user likes the item.
pub async fn like(
    State(app): State<Arc<App>>,
    Actor(user): Actor,
    Path(item): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
    body: std::result::Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> std::result::Result<Response, ApiError> {
    check_id("itemId", &item)?;
    let body = body.map_err(|e| match e.status() {
        axum::http::StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(format!(
            "the body may be at most {} bytes (it is empty or {{}})",
            super::BODY_LIMIT
        )),
        _ => ApiError::BadRequest(format!("unreadable body: {e}")),
    })?;
    empty_body(&body)?;
    let key = request_key(&headers)?;
    let platform = client_platform(&headers)?;
    let write = Write {
        platform,
        ..Write::by_user(&user, &item, true, &key)
    };
    answer(&app, &write, Method::POST, &uri, &headers).await
}

/// `DELETE /v1/items/{itemId}/likes/{userId}`: the session's user unlikes the item.
pub async fn unlike(
    State(app): State<Arc<App>>,
    Actor(actor): Actor,
    Path((item, user)): Path<(String, String)>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> std::result::Result<Response, ApiError> {
    check_id("itemId", &item)?;
    check_id("userId", &user)?;
    if user != actor {
        return Err(ApiError::Forbidden(
            "userId must be the session's user: nobody unlikes for someone else".into(),
        ));
    }
    let key = request_key(&headers)?;
    let platform = client_platform(&headers)?;
    let write = Write {
        platform,
        ..Write::by_user(&user, &item, false, &key)
    };
    answer(&app, &write, Method::DELETE, &uri, &headers).await
}

/// The write's answer here, or, for an item homed in another region, that region's answer
/// to the same request (api/forward.rs).
async fn answer(
    app: &App,
    write: &Write<'_>,
    method: Method,
    uri: &OriginalUri,
    headers: &HeaderMap,
) -> std::result::Result<Response, ApiError> {
    match app.writer.write(write).await {
        Ok(answer) => Ok(Json(answer).into_response()),
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
            match &app.forwarder {
                Some(f) => {
                    crate::write::cas_done::forwarding();
                    let path = uri
                        .0
                        .path_and_query()
                        .map(|p| p.as_str())
                        .unwrap_or(uri.0.path());
                    f.forward(&home, method, path, headers, None, refusal).await
                }
                None => Err(refusal),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The write body is empty or `{}`; anything else is refused, not ignored.
pub fn empty_body(body: &[u8]) -> std::result::Result<(), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(m) if m.is_empty() => Ok(()),
        Ok(m) => Err(ApiError::BadRequest(format!(
            "unknown fields in the body: {}",
            m.keys().cloned().collect::<Vec<_>>().join(", ")
        ))),
        Err(e) => Err(ApiError::BadRequest(format!(
            "the body is not a JSON object: {e}"
        ))),
    }
}

/// The request's Idempotency-Key: 1-128 visible ASCII characters, or a 400.
pub fn request_key(headers: &HeaderMap) -> std::result::Result<String, ApiError> {
    let key = headers
        .get("idempotency-key")
        .ok_or_else(|| ApiError::BadRequest("missing Idempotency-Key header".into()))?
        .to_str()
        .map_err(|_| ApiError::BadRequest("Idempotency-Key must be visible ASCII".into()))?;
    if !(1..=128).contains(&key.len()) || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::BadRequest(
            "Idempotency-Key must be 1-128 visible ASCII characters".into(),
        ));
    }
    Ok(key.to_string())
}

/// The optional X-Client-Platform header: `web`, `ios`, `android` or `other` (any case);
/// absent is UNSPECIFIED, anything else a 400 (never silently dropped).
pub fn client_platform(headers: &HeaderMap) -> std::result::Result<ClientPlatform, ApiError> {
    let Some(value) = headers.get("x-client-platform") else {
        return Ok(ClientPlatform::Unspecified);
    };
    let value = value.to_str().unwrap_or("").to_ascii_lowercase();
    Ok(match value.as_str() {
        "web" => ClientPlatform::Web,
        "ios" => ClientPlatform::Ios,
        "android" => ClientPlatform::Android,
        "other" => ClientPlatform::Other,
        _ => {
            return Err(ApiError::BadRequest(
                "X-Client-Platform must be one of web, ios, android, other".into(),
            ))
        }
    })
}
