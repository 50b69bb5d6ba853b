//! Like and unlike: DESIGN.md's three layers of write idempotency and its outbox.
//!
//! 1. The request key: `INSERT ... IF NOT EXISTS` on `idempotency` claims it before anything
//!    happens. A replayed key returns its stored answer and touches nothing (so a like whose
//!    answer was lost, retried after an unlike, cannot re-like); the same key with another
//!    request is a 422.
//! 2. The conditional write: the edge flips only if its state differs, by compare-and-set on
//!    the op_id just read; a real flip bumps op_id by one, a no-op writes nothing and emits
//!    nothing.
//! 3. The row: one row per (item, user).
//!
//! Before the flip an outbox entry is written; after the event is published it is deleted.
//! A crash in between leaves the entry, and `likes relay` publishes the edge's current state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use scylla::value::{CqlTimestamp, CqlValue};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::{check_id, Actor, App};
use crate::hash;
use crate::runtime::clock::now_ms;
use crate::schema::v1::{EdgeState, Source};
use crate::store::edges::Edge;
use crate::store::not_applied;
use crate::store::outbox::{outbox_minute, OUTBOX_SHARDS};

/// The answer of a write, stored under its request key and replayed verbatim.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WriteAnswer {
    pub item_id: String,
    pub user_id: String,
    pub liked: bool,
    /// Whether this request flipped the edge (false: it already was in that state).
    pub changed: bool,
    pub op_id: i64,
}

/// `POST /v1/items/{itemId}/likes`: the session's user likes the item.
pub async fn like(
    State(app): State<Arc<App>>,
    Actor(user): Actor,
    Path(item): Path<String>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> std::result::Result<Json<WriteAnswer>, ApiError> {
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
    write(&app, &user, &item, true, &key).await.map(Json)
}

/// `DELETE /v1/items/{itemId}/likes/{userId}`: the session's user unlikes the item.
pub async fn unlike(
    State(app): State<Arc<App>>,
    Actor(actor): Actor,
    Path((item, user)): Path<(String, String)>,
    headers: HeaderMap,
) -> std::result::Result<Json<WriteAnswer>, ApiError> {
    check_id("itemId", &item)?;
    check_id("userId", &user)?;
    if user != actor {
        return Err(ApiError::Forbidden(
            "userId must be the session's user: nobody unlikes for someone else".into(),
        ));
    }
    let key = request_key(&headers)?;
    write(&app, &user, &item, false, &key).await.map(Json)
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

fn fingerprint(item: &str, liked: bool) -> Vec<u8> {
    let op = if liked { "like" } else { "unlike" };
    Sha256::digest(format!("{op}\n{item}")).to_vec()
}

/// The whole write path of one request by the user.
pub async fn write(
    app: &App,
    user: &str,
    item: &str,
    liked: bool,
    key: &str,
) -> std::result::Result<WriteAnswer, ApiError> {
    write_as(app, user, item, liked, key, Source::Api).await
}

/// The write path, with the event marked as coming from `source`.
pub async fn write_as(
    app: &App,
    user: &str,
    item: &str,
    liked: bool,
    key: &str,
    source: Source,
) -> std::result::Result<WriteAnswer, ApiError> {
    let fp = fingerprint(item, liked);
    let now = now_ms();
    // Layer 1: the request key.
    if let Some(existing) = app.store.requests.claim(user, key, &fp, now).await? {
        let col = |n: &str| {
            existing
                .iter()
                .find(|(k, _)| k == n)
                .and_then(|(_, v)| v.clone())
        };
        if col("fingerprint") != Some(CqlValue::Blob(fp.clone())) {
            return Err(ApiError::KeyReused);
        }
        if let Some(CqlValue::Text(stored)) = col("response") {
            return serde_json::from_str(&stored)
                .map_err(|e| ApiError::Unavailable(format!("stored answer unreadable: {e}")));
        }
        // Claimed but unanswered: in flight, or its process died. Only the latter is taken over.
        let claimed_at = match col("created_at") {
            Some(CqlValue::Timestamp(t)) => t.0,
            _ => 0,
        };
        if now - claimed_at < app.settings.api.claim_takeover.as_millis() as i64 {
            return Err(ApiError::InProgress);
        }
    }

    let intent = Intent {
        user,
        item,
        liked,
        source,
    };
    // The deadline bounds how long the outbox entry written in `act` can belong to a request
    // whose flip is still to land: the relay waits longer than it plus one CQL timeout.
    let left = app
        .settings
        .api
        .write_deadline
        .saturating_sub(std::time::Duration::from_millis(
            (now_ms() - now).max(0) as u64
        ));
    // Whether this request may have flipped the edge: then its key must never run again.
    let flipped = AtomicBool::new(false);
    let done = act(app, &intent, key, now, left, &flipped).await;
    if done.is_err() && !flipped.load(Ordering::Relaxed) {
        // Nothing changed: let a retry with this key run now instead of waiting for the
        // takeover. After a flip the claim is kept (answered, or taken over later): a re-run
        // after the user's next write would undo it.
        let _ = app.store.requests.release(user, key).await;
    }
    done
}

/// What a request asks for.
struct Intent<'a> {
    user: &'a str,
    item: &'a str,
    liked: bool,
    source: Source,
}

/// Everything after the claim: the outbox, the flip, the event, the stored answer.
async fn act(
    app: &App,
    intent: &Intent<'_>,
    key: &str,
    now: i64,
    deadline: std::time::Duration,
    flipped: &AtomicBool,
) -> std::result::Result<WriteAnswer, ApiError> {
    let &Intent {
        user,
        item,
        liked,
        source,
    } = intent;
    let s = &app.store;
    let bucket = hash::bucket_of(user, app.topology.buckets) as i32;
    let shard = hash::partition_for(item.as_bytes(), OUTBOX_SHARDS) as i32;
    let minute = outbox_minute(now);
    let entry = format!("{:016x}", rand::random::<u64>());
    // Both before the flip (the erasure walk may see an extra edge, never miss one); they
    // do not depend on each other, so they travel together.
    let by_user = async {
        if liked {
            app.session
                .execute_unpaged(&s.edges.by_user, (user, item, CqlTimestamp(now)))
                .await?;
        }
        Ok::<_, ApiError>(())
    };
    let outbox = async {
        s.outbox
            .put((shard, minute), item, user, &entry, now)
            .await?;
        Ok::<_, ApiError>(())
    };
    // Layer 2: the compare-and-set flip, within the deadline. What follows a flip (the
    // answer, the event) always runs to its end: it is what makes a retry replay.
    let until_flip = async {
        tokio::try_join!(by_user, outbox)?;
        flip(app, item, bucket, user, liked, now, flipped).await
    };
    let (edge, flipped_from) = match tokio::time::timeout(deadline, until_flip).await {
        Ok(r) => r?,
        Err(_) => {
            // A CAS may still be in flight: whether it applies is unknown.
            flipped.store(true, Ordering::Relaxed);
            return Err(ApiError::Unavailable(format!(
                "the write did not reach its flip within its deadline ({:?}); retry with the same key",
                app.settings.api.write_deadline
            )));
        }
    };
    let answer = WriteAnswer {
        item_id: item.to_string(),
        user_id: user.to_string(),
        liked,
        changed: flipped_from,
        op_id: edge.op_id,
    };
    let body = serde_json::to_string(&answer).expect("answers serialize");
    let store = async {
        s.requests.answer(user, key, &body).await?;
        Ok::<_, ApiError>(())
    };
    if flipped_from {
        // The answer is stored while the event is published, so whatever becomes of the
        // publish, a retry of this key replays it. A failed publish leaves the outbox entry
        // for the relay.
        let published = async {
            fail::fail_point!("api-after-flip-before-produce", |_| Err(
                ApiError::Unavailable("injected: after the flip, before the produce".into())
            ));
            app.events
                .publish(item, user, &edge, source)
                .await
                .map_err(|e| ApiError::Unavailable(format!("publishing the event: {e}")))
        };
        let (published, stored) = tokio::join!(published, store);
        published?;
        stored?;
        s.outbox.delete((shard, minute), item, user, &entry).await?;
        return Ok(answer);
    }
    fail::fail_point!("api-before-outbox-clear", |_| Err(ApiError::Unavailable(
        "injected: before the outbox entry is cleared".into()
    )));
    // A no-op: nothing to publish. Both run to the end: a failed clear leaves an entry the
    // relay deletes unpublished, and must not stop the answer from being stored.
    let clear = async {
        s.outbox.delete((shard, minute), item, user, &entry).await?;
        Ok::<_, ApiError>(())
    };
    let (cleared, stored) = tokio::join!(clear, store);
    stored?;
    cleared?;
    Ok(answer)
}

/// Flips the edge to `liked` unless it already is. Returns the edge as it now is and
/// whether this call flipped it.
///
/// The compare-and-set is aimed with a guess (a like guesses "no row yet", an unlike reads
/// the edge without Paxos), so the common request costs one Paxos round, not a SERIAL read
/// and then a write. A wrong guess only fails the CAS, whose answer (or a SERIAL read) then
/// tells the truth. "Already in that state, do nothing" is decided only on a linearizable
/// view of the edge, never on the guess.
async fn flip(
    app: &App,
    item: &str,
    bucket: i32,
    user: &str,
    liked: bool,
    now: i64,
    flipped: &AtomicBool,
) -> std::result::Result<(Edge, bool), ApiError> {
    let (session, edges) = (&*app.session, &app.store.edges);
    let state = if liked {
        EdgeState::Liked
    } else {
        EdgeState::Unliked
    } as i8;
    let mut seen = if liked {
        None
    } else {
        edges.peek(item, bucket, user).await?
    };
    let mut certain = false;
    for _attempt in 0..16 {
        let already = match seen {
            Some(e) => e.liked == liked,
            None => !liked,
        };
        if already {
            if !certain {
                seen = edges.read(item, bucket, user).await?;
                certain = true;
                continue;
            }
            let e = seen.unwrap_or(Edge {
                liked: false,
                op_id: 0,
                updated_at_ms: 0,
                prev_at_ms: 0,
            });
            return Ok((e, false));
        }
        // From here the CAS may apply even if its answer never arrives.
        flipped.store(true, Ordering::Relaxed);
        let result = match seen {
            None => {
                session
                    .execute_unpaged(
                        &edges.insert,
                        (item, bucket, user, state, CqlTimestamp(now)),
                    )
                    .await?
            }
            Some(e) => {
                session
                    .execute_unpaged(
                        &edges.update,
                        (
                            state,
                            e.op_id + 1,
                            CqlTimestamp(now),
                            CqlTimestamp(e.updated_at_ms),
                            item,
                            bucket,
                            user,
                            e.op_id,
                        ),
                    )
                    .await?
            }
        };
        let Some(existing) = not_applied(result)? else {
            return Ok((
                Edge {
                    liked,
                    op_id: seen.map(|e| e.op_id).unwrap_or(0) + 1,
                    updated_at_ms: now,
                    prev_at_ms: seen.map(|e| e.updated_at_ms).unwrap_or(0),
                },
                true,
            ));
        };
        // A failed INSERT IF NOT EXISTS answers with the whole row as Paxos saw it; a failed
        // UPDATE IF only with op_id, so the rest is read at SERIAL.
        seen = match (seen, Edge::of_columns(&existing)) {
            (None, Some(row)) => Some(row),
            _ => edges.read(item, bucket, user).await?,
        };
        certain = true;
    }
    Err(ApiError::Unavailable(
        "the edge kept changing under this request; retry".into(),
    ))
}
