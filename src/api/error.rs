//! API errors: every refusal is `{error, message}` JSON with the status that says who must act.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tracing::warn;

#[derive(Debug)]
pub enum ApiError {
    /// 400: the request itself is wrong (ids, headers, body).
    BadRequest(String),
    /// 401: no valid session.
    Unauthenticated(String),
    /// 403: a valid session acting for someone else.
    Forbidden(String),
    /// 404: no such endpoint.
    NotFound(String),
    /// 413: the body is over the limit.
    TooLarge(String),
    /// 422: a request key reused for a different request.
    KeyReused,
    /// 503: a dependency failed; retry later.
    Unavailable(String),
    /// 429: writes over the configured rate.
    RateLimited,
    /// 429: this user's writes over their share (`api.max_writes_per_user_per_s`).
    UserRateLimited,
    /// 503: writes over the in-flight bound.
    Overloaded,
    /// 503: another region is the item's home (docs/multi-region.md) and the write was not
    /// forwarded there (no peer for it, or it was forwarded already).
    NotHome(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, String) {
        match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, "bad_request", m.clone()),
            ApiError::Unauthenticated(m) => {
                (StatusCode::UNAUTHORIZED, "unauthenticated", m.clone())
            }
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, "forbidden", m.clone()),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m.clone()),
            ApiError::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", m.clone()),
            ApiError::KeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was used for a different request".into(),
            ),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", m.clone()),
            ApiError::RateLimited => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "writes are over the configured rate; retry after the given seconds".into(),
            ),
            ApiError::UserRateLimited => (
                StatusCode::TOO_MANY_REQUESTS,
                "user_rate_limited",
                "this user's writes are over their share (api.max_writes_per_user_per_s); retry after the given seconds".into(),
            ),
            ApiError::Overloaded => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "too many writes in flight; retry after the given seconds".into(),
            ),
            ApiError::NotHome(m) => (StatusCode::SERVICE_UNAVAILABLE, "not_home", m.clone()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, error, message) = self.parts();
        let mut r = (status, Json(json!({ "error": error, "message": message }))).into_response();
        if matches!(
            self,
            ApiError::Unavailable(_)
                | ApiError::RateLimited
                | ApiError::UserRateLimited
                | ApiError::Overloaded
                | ApiError::NotHome(_)
        ) {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// A dependency's failure: the client gets a stable message and an id to quote, never the
/// driver's text (hosts, addresses, statements: issue 44); the log has both.
impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> Self {
        let id = format!("{:016x}", rand::random::<u64>());
        warn!(error = %e, request_id = %id, "request failed on a dependency");
        ApiError::Unavailable(format!(
            "a dependency failed; retry later (request id {id})"
        ))
    }
}

impl From<crate::write::WriteError> for ApiError {
    fn from(e: crate::write::WriteError) -> Self {
        use crate::write::WriteError as W;
        match e {
            W::KeyReused => ApiError::KeyReused,
            W::Erased { .. } => ApiError::Forbidden(e.to_string()),
            W::RetryWithSameKey(_) | W::RangeClosed(_) | W::ClockOff(_) => {
                ApiError::Unavailable(e.to_string())
            }
            W::NotHome { .. } => ApiError::NotHome(e.to_string()),
            W::Dependency(e) => e.into(),
        }
    }
}

impl From<scylla::errors::ExecutionError> for ApiError {
    fn from(e: scylla::errors::ExecutionError) -> Self {
        crate::error::Error::from(e).into()
    }
}
