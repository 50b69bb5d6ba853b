//! A write whose item is homed in another region, forwarded there (docs/multi-region.md,
//! "Forwarding and retries"): the same method and path, the user's session token, request key
//! and platform. The home's answer comes back as it is, with the region that answered in
//! `X-Likes-Region`. A request key is the edge's, so a retry that lands in another region,
//! even after a move, replays the stored answer at whichever region is home then.
//!
//! A region that cannot reach the home answers 503 with Retry-After: it never writes locally.
//! A forwarded request is never forwarded again: two regions whose views of the range table
//! disagree mid-move answer `not_home` rather than bounce it between them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;

use super::error::ApiError;
use crate::config::Settings;

/// Set on a forwarded request: the region it came from.
pub const FORWARDED_BY: &str = "x-likes-forwarded-by";
/// Set on every answer of a process with `region.name`: the region that answered.
pub const ANSWERED_BY: &str = "x-likes-region";

/// The request headers a forward carries (the session or the operators' credential, the key,
/// the client's platform, the body's type).
const CARRIED: [&str; 5] = [
    "authorization",
    "x-admin-token",
    "idempotency-key",
    "x-client-platform",
    "content-type",
];

pub struct Forwarder {
    http: reqwest::Client,
    region: String,
    peers: BTreeMap<String, String>,
    deadline: Duration,
    /// Forwards in flight (`region.max_forwards_in_flight`): their own bound, apart from this
    /// region's write slots.
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl Forwarder {
    /// With `region.name` set; `region.peers` names where each other region's API is.
    pub fn new(settings: &Settings) -> crate::error::Result<Option<Self>> {
        let Some(region) = settings.region.name.clone() else {
            return Ok(None);
        };
        // A redirect would turn the POST or DELETE into a GET: the home's answer is passed
        // back as it is instead.
        let builder = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(1))
            .redirect(reqwest::redirect::Policy::none());
        let http = super::tls::peer_client(builder, settings)?
            .build()
            .map_err(|e| crate::error::Error::Config(format!("the forwarding HTTP client: {e}")))?;
        Ok(Some(Self {
            http,
            region,
            peers: settings.region.peers.clone(),
            // The home's own deadline, and the CQL timeout its compare-and-set may take
            // beyond it: a forward given up sooner would say "did not answer" about a write
            // the home made.
            deadline: settings.api.write_deadline + settings.cql.request_timeout,
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(
                settings.region.max_forwards_in_flight.max(1),
            )),
            max: settings.region.max_forwards_in_flight.max(1),
        }))
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// Sends the request on to `home`; its answer, or why there is none.
    pub async fn forward(
        &self,
        home: &str,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Option<Vec<u8>>,
        refusal: ApiError,
    ) -> Result<Response, ApiError> {
        if headers.contains_key(FORWARDED_BY) {
            // Already forwarded once: the two regions disagree on the home for a moment.
            metrics::counter!("likes_api_forwards_total", "home" => home.to_string(), "outcome" => "not_home_twice").increment(1);
            return Err(refusal);
        }
        let Some(base) = self.peers.get(home) else {
            metrics::counter!("likes_api_forwards_total", "home" => home.to_string(), "outcome" => "no_peer").increment(1);
            return Err(refusal);
        };
        // A slow or hung home holds at most this many requests here; the rest are refused at
        // once rather than queued behind them.
        let Ok(_slot) = self.slots.try_acquire() else {
            metrics::counter!("likes_api_forwards_total", "home" => home.to_string(), "outcome" => "shed").increment(1);
            return Err(ApiError::Unavailable(format!(
                "writes forwarded to region {home} are at their bound (region.max_forwards_in_flight = {}): it answers slowly or not at all; retry with the same key",
                self.max
            )));
        };
        let mut req = self
            .http
            .request(method, format!("{}{path}", base.trim_end_matches('/')))
            .timeout(self.deadline)
            .header(FORWARDED_BY, &self.region);
        for name in CARRIED {
            if let Some(v) = headers.get(name) {
                req = req.header(name, v);
            }
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let started = Instant::now();
        let answer = async {
            let r = req.send().await?;
            let status = r.status().as_u16();
            let answered_by = r.headers().get(ANSWERED_BY).cloned();
            let retry_after = r.headers().get("retry-after").cloned();
            let body = r.bytes().await?;
            Ok::<_, reqwest::Error>((status, answered_by, retry_after, body))
        };
        match answer.await {
            Ok((status, answered_by, retry_after, body)) => {
                metrics::histogram!("likes_api_forward_seconds", "home" => home.to_string())
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!("likes_api_forwards_total", "home" => home.to_string(), "outcome" => "answered").increment(1);
                let mut r = Response::new(Body::from(body));
                *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                let h = r.headers_mut();
                h.insert("content-type", HeaderValue::from_static("application/json"));
                if let Some(v) = answered_by {
                    h.insert(ANSWERED_BY, v);
                }
                if let Some(v) = retry_after {
                    h.insert("retry-after", v);
                }
                Ok(r)
            }
            Err(e) => {
                metrics::counter!("likes_api_forwards_total", "home" => home.to_string(), "outcome" => "unreachable").increment(1);
                Err(ApiError::Unavailable(format!(
                    "the item's home region {home} did not answer the forwarded write ({e}); \
                     this region does not write it, and the home may have: retry with the same \
                     Idempotency-Key, which replays the home's answer if it did"
                )))
            }
        }
    }
}
