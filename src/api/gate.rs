//! Who is asking, before any work: the write routes' outermost layer checks the session token
//! (or the operators' token on `/v1/admin/`) and answers 401 at once, so a flood of requests
//! with no or a forged credential costs one HMAC each and never spends the write admission's
//! budget (issue 44: an unauthenticated flood turned 36 % of a real user's writes into 429).
//! The caller it found rides on the request for admission (each user's share) and the
//! handlers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{admin, Actor, App};

/// Who a write comes from, once the gate checked it.
#[derive(Debug, Clone)]
pub enum Caller {
    User(String),
    Operator,
}

pub async fn authenticate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let caller = if req.uri().path().starts_with("/v1/admin/") {
        admin::check(&app, req.headers()).map(|()| Caller::Operator)
    } else {
        Actor::verify(req.headers(), &app).map(|Actor(user)| Caller::User(user))
    };
    match caller {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        // Counted by the requests metric (code 401), not as shed: nothing was admitted.
        Err(e) => e.into_response(),
    }
}
