//! Every API request counted and timed by route, method and status: what the write SLOs
//! (availability and p99 latency, `k8s/components/monitoring/`) are computed from.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

use crate::runtime::metrics as m;

/// Records one request: `likes_api_requests_total{route, method, code}` and
/// `likes_api_request_duration_seconds{route, method}`. The route is the matched pattern
/// (`/v1/items/{item_id}/likes`), never the raw path, so the label set stays small.
pub async fn record(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().as_str().to_string();
    let started = Instant::now();
    let response = next.run(req).await;
    let code = response.status().as_str().to_string();
    metrics::histogram!(m::API_REQUEST_SECONDS, "route" => route.clone(), "method" => method.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(m::API_REQUESTS, "route" => route, "method" => method, "code" => code)
        .increment(1);
    response
}
