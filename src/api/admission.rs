//! Write admission: writes past a bound fail at once with 429 or 503 and `Retry-After`,
//! never wait in an unbounded queue. Reads are not admitted here, so they keep serving while
//! writes are shed.
//!
//! Two bounds: writes in flight (each holds Cassandra LWTs until its flip has applied; the
//! wait for the broker's ack after it is bounded by `api.publish_wait` and not counted),
//! under a limit that moves with their latency (`limit.rs`; past it the database is saturated: 503), and a
//! token bucket on the write rate (a client or a burst asking for more than the configured
//! share: 429). Before both, each user's own share (`user_share.rs`: 429), so one session
//! cannot take the pod's writes; the gate (`gate.rs`) has already refused requests with no
//! valid credential, which therefore spend none of this.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use super::error::ApiError;
use super::gate::Caller;
use super::limit::Limit;
use super::user_share::UserShare;
use crate::runtime::metrics as m;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub struct Admission {
    in_flight: Arc<Limit>,
    bucket: Mutex<Bucket>,
    users: UserShare,
}

struct Bucket {
    tokens: f64,
    per_s: f64,
    burst: f64,
    at: Instant,
}

impl Admission {
    /// At most `max_in_flight` concurrent writes, fewer as their latency passes
    /// `latency_target` (zero: a fixed bound); `per_s` writes a second with bursts of
    /// `per_s / 10` (at least 1); `per_s = 0` turns the rate bound off.
    pub fn new(
        max_in_flight: usize,
        latency_target: std::time::Duration,
        per_s: f64,
        users: UserShare,
    ) -> Self {
        let burst = (per_s / 10.0).max(1.0);
        Self {
            users,
            in_flight: Arc::new(Limit::new(max_in_flight, latency_target)),
            bucket: Mutex::new(Bucket {
                tokens: burst,
                per_s,
                burst,
                at: Instant::now(),
            }),
        }
    }

    fn take_token(&self) -> bool {
        self.take_token_at(Instant::now())
    }

    /// The bucket at a given instant: its unit test moves time itself, so the refill it checks
    /// does not depend on how long the box takes between two calls.
    fn take_token_at(&self, now: Instant) -> bool {
        let mut b = self.bucket.lock().unwrap();
        if b.per_s <= 0.0 {
            return true;
        }
        let now = now.max(b.at);
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * b.per_s).min(b.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Marks a write's answer as shed here, so the outermost layer (`observe.rs`) times it.
#[derive(Clone, Copy)]
pub struct Shed;

fn shed(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.extensions_mut().insert(Shed);
    r
}

/// The middleware on the write routes.
pub async fn admit(State(admission): State<Arc<Admission>>, req: Request, next: Next) -> Response {
    // Operators' writes (retractions, erasures) are not a user's: the pod's bounds only.
    if let Some(Caller::User(user)) = req.extensions().get::<Caller>() {
        if !admission.users.take(user) {
            metrics::counter!(m::API_SHED, "reason" => "user_rate").increment(1);
            return shed(ApiError::UserRateLimited);
        }
    }
    if !admission.take_token() {
        metrics::counter!(m::API_SHED, "reason" => "rate").increment(1);
        return shed(ApiError::RateLimited);
    }
    let Some(permit) = admission.in_flight.try_acquire() else {
        metrics::counter!(m::API_SHED, "reason" => "in_flight").increment(1);
        return shed(ApiError::Overloaded);
    };
    // The permit ends when the write is done with the database, before its wait on the
    // broker (src/write/cas_done.rs), when it is forwarded to another region, or with the
    // request.
    let held = Arc::new(Mutex::new(Some(permit)));
    let release = held.clone();
    let released = move |learn: bool| {
        if let Some(p) = release.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if !learn {
                p.forget();
            }
        }
    };
    let response = crate::write::cas_done::scope(released, next.run(req)).await;
    drop(held);
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bucket_refills_at_the_rate() {
        let a = super::Admission::new(
            1,
            std::time::Duration::ZERO,
            100.0,
            super::UserShare::new(0.0, 1.0),
        );
        let t0 = a.bucket.lock().unwrap().at;
        let granted = (0..50).filter(|_| a.take_token_at(t0)).count();
        assert_eq!(granted, 10, "a burst of per_s / 10");
        let later = t0 + std::time::Duration::from_millis(100);
        let again = (0..50).filter(|_| a.take_token_at(later)).count();
        assert_eq!(again, 10, "100 ms at 100/s refills 10");
        let much_later = later + std::time::Duration::from_secs(60);
        let capped = (0..50).filter(|_| a.take_token_at(much_later)).count();
        assert_eq!(capped, 10, "never more than the burst");
        let off = super::Admission::new(
            1,
            std::time::Duration::ZERO,
            0.0,
            super::UserShare::new(0.0, 1.0),
        );
        assert!((0..1000).all(|_| off.take_token()));
    }
}
