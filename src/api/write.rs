//! Like and unlike: docs/design.md's three layers of write idempotency, in one Paxos round
//! ("One Paxos round per write"), and its outbox.
//!
//! 1. The row: one row per (item, user).
//! 2. The conditional write: the edge flips only if its state differs, by compare-and-set on
//!    the op_id the request saw; a real flip bumps op_id by one, a no-op keeps it.
//! 3. The request key: the same compare-and-set stores the key with its answer on the edge row
//!    (`recent_keys`, see [`super::request_keys`]), so there is no moment where the flip applied
//!    and its answer is lost. A key the row remembers replays its answer and writes nothing (a
//!    like whose answer was lost, retried after an unlike, cannot re-like); the same key for
//!    the other operation is a 422. Concurrent requests with one key race on the CAS: one
//!    wins, the others re-read and replay its answer.
//!
//! Before the CAS an outbox entry is written; after the event is published it is deleted.
//! A crash in between leaves the entry, and `likes relay` publishes the edge's current state.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use scylla::value::CqlTimestamp;
use serde::Serialize;

use super::error::ApiError;
use super::request_keys::{self, Remembered};
use super::{check_id, Actor, App};
use crate::hash;
use crate::runtime::clock::now_ms;
use crate::schema::v1::{ClientPlatform, Source};
use crate::store::edges::{Cas, Edge, EdgeRow};
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
    let platform = client_platform(&headers)?;
    write_as(&app, &user, &item, true, &key, Source::Api, platform)
        .await
        .map(Json)
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
    let platform = client_platform(&headers)?;
    write_as(&app, &user, &item, false, &key, Source::Api, platform)
        .await
        .map(Json)
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

/// The whole write path of one request by the user (no platform said).
pub async fn write(
    app: &App,
    user: &str,
    item: &str,
    liked: bool,
    key: &str,
) -> std::result::Result<WriteAnswer, ApiError> {
    write_as(
        app,
        user,
        item,
        liked,
        key,
        Source::Api,
        ClientPlatform::Unspecified,
    )
    .await
}

/// The write path, with the event marked as coming from `source` (which also names the
/// namespace of `key`: an operator's keys never meet a user's).
pub async fn write_as(
    app: &App,
    user: &str,
    item: &str,
    liked: bool,
    key: &str,
    source: Source,
    platform: ClientPlatform,
) -> std::result::Result<WriteAnswer, ApiError> {
    let now = now_ms();
    let req = Request {
        user,
        item,
        liked,
        platform,
        key: request_keys::stored(source, key),
        bucket: hash::bucket_of(user, app.topology.buckets) as i32,
        now,
    };
    let s = &app.store;
    let shard = hash::partition_for(item.as_bytes(), OUTBOX_SHARDS) as i32;
    let minute = outbox_minute(now);
    let entry = format!("{:016x}", rand::random::<u64>());
    // The outbox entry and the user's side of a like go before the CAS (the erasure walk may
    // see an extra edge, never miss one), after the check that the account may still write;
    // the read that aims the CAS travels with that check.
    let until_cas = async {
        // A like guesses "no row yet" (most likes are first likes): its `IF NOT EXISTS`
        // answers with the row when the guess is wrong, so it needs no read first.
        let peek = async {
            if liked {
                return Ok(None);
            }
            Ok::<_, ApiError>(s.edges.peek_row(item, req.bucket, user).await?)
        };
        // Sessions are stateless tokens: one can outlive its account. A user whose erasure
        // was requested writes nothing more (the erasure's own unlikes are operators').
        let refuse_erased = async {
            if source != Source::Api {
                return Ok(());
            }
            match s.erasures.erased(user).await? {
                Some(id) => Err(ApiError::Forbidden(format!(
                    "the account {user} is being erased or was erased (erasure {id}): its sessions can no longer write"
                ))),
                None => Ok(()),
            }
        };
        let ((), seen) = tokio::try_join!(refuse_erased, peek)?;
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
        tokio::try_join!(by_user, outbox)?;
        cas(app, &req, seen).await
    };
    // The deadline bounds how long the outbox entry can belong to a request whose CAS is
    // still to land: the relay waits longer than it plus one CQL timeout.
    let outcome = match tokio::time::timeout(app.settings.api.write_deadline, until_cas).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(ApiError::Unavailable(format!(
                "the write did not finish its compare-and-set within its deadline ({:?}); \
                 retry with the same key",
                app.settings.api.write_deadline
            )))
        }
    };
    let answer = |r: Remembered| WriteAnswer {
        item_id: item.to_string(),
        user_id: user.to_string(),
        liked: r.liked,
        changed: r.changed,
        op_id: r.op_id,
    };
    // From here the answer is on the edge row: whatever fails, a retry replays it.
    fail::fail_point!("api-after-cas", |_| Err(ApiError::Unavailable(
        "injected: right after the compare-and-set".into()
    )));
    match outcome {
        Outcome::Replay(r) => {
            // Nothing was written: the entry has nothing to stand for.
            s.outbox.delete((shard, minute), item, user, &entry).await?;
            Ok(answer(r))
        }
        Outcome::Flipped(edge, r) => {
            // A failed publish leaves the outbox entry for the relay.
            fail::fail_point!("api-after-flip-before-produce", |_| Err(
                ApiError::Unavailable("injected: after the flip, before the produce".into())
            ));
            app.events
                .publish(item, user, &edge, source)
                .await
                .map_err(|e| ApiError::Unavailable(format!("publishing the event: {e}")))?;
            s.outbox.delete((shard, minute), item, user, &entry).await?;
            Ok(answer(r))
        }
        Outcome::Kept(r) => {
            // Nothing to publish; a failed clear leaves an entry the relay deletes unpublished.
            fail::fail_point!("api-before-outbox-clear", |_| Err(ApiError::Unavailable(
                "injected: before the outbox entry is cleared".into()
            )));
            s.outbox.delete((shard, minute), item, user, &entry).await?;
            Ok(answer(r))
        }
    }
}

/// One request, as the CAS needs it.
struct Request<'a> {
    user: &'a str,
    item: &'a str,
    liked: bool,
    platform: ClientPlatform,
    /// The request key as stored on the edge (namespaced).
    key: String,
    bucket: i32,
    now: i64,
}

/// The time a request is stamped with on its edge: its own clock, but never at or before
/// the edge's last flip, whichever pod's clock stamped that. A flip's time orders the
/// edge's ops for stage 1 ("past the horizon", docs/exactness.md); a no-op's time tells a
/// cut that the op it found existed by then (ops/cut.rs), which a pod whose clock is behind
/// would otherwise date before that op's own flip (issue 23, item 8).
pub fn recorded_at(now: i64, last_flip_at: Option<i64>) -> i64 {
    last_flip_at.map_or(now, |t| now.max(t.saturating_add(1)))
}

/// What the request's compare-and-set found or did.
enum Outcome {
    /// The row already held this key: its stored answer.
    Replay(Remembered),
    /// This request flipped the edge to the given version.
    Flipped(Edge, Remembered),
    /// The edge was already in the asked state; only the key was written.
    Kept(Remembered),
}

/// The one compare-and-set of a request: aimed by `seen` (a guess from a plain read), retried
/// from a SERIAL read when it loses a race. "Already in that state" is decided by the CAS
/// itself (`IF op_id = :seen`), never by the guess.
async fn cas(
    app: &App,
    req: &Request<'_>,
    mut seen: Option<EdgeRow>,
) -> std::result::Result<Outcome, ApiError> {
    let edges = &app.store.edges;
    // Requests on one edge with different keys contend for its next slot: each lost race
    // is a fresh read and another try.
    for _attempt in 0..(2 * request_keys::KEPT) {
        let keys = seen.as_ref().map(|r| &r.keys);
        if let Some(r) = keys.and_then(|k| request_keys::lookup(k, &req.key, req.now)) {
            // A key the row holds was written by a committed CAS: its answer is final.
            if r.liked != req.liked {
                return Err(ApiError::KeyReused);
            }
            return Ok(Outcome::Replay(r));
        }
        let edge = seen.as_ref().map(|r| r.edge);
        let already = edge.map(|e| e.liked == req.liked).unwrap_or(!req.liked);
        // One edge's flip times never go backwards, whichever pod's clock stamps them:
        // stage 1 reads "past the horizon" off them in op order (docs/exactness.md).
        let flip_at = recorded_at(req.now, edge.map(|e| e.updated_at_ms));
        let to = Edge {
            liked: req.liked,
            op_id: edge.map(|e| e.op_id).unwrap_or(0) + i64::from(!already),
            updated_at_ms: flip_at,
            prev_at_ms: edge.map(|e| e.updated_at_ms).unwrap_or(0),
            earlier_at_ms: edge.map(|e| e.earlier_after_flip()).unwrap_or_default(),
            platform: req.platform as i8,
        };
        let remembered = Remembered {
            liked: req.liked,
            changed: !already,
            op_id: to.op_id,
            at_ms: flip_at,
            key: req.key.clone(),
        };
        let value = remembered.encode();
        let empty = Default::default();
        let keys = keys.unwrap_or(&empty);
        let slot = request_keys::slot_for(keys, edge.map(|e| e.op_id).unwrap_or(0), req.now);
        let cas = Cas {
            item: req.item,
            bucket: req.bucket,
            user: req.user,
            slot,
            value: &value,
            slot_was: keys.get(&slot).map(String::as_str),
        };
        let applied = match edge {
            None => {
                if !req.liked {
                    // An unlike that creates the row (to hold its key): the user's side
                    // first, as for a like, so that erasure finds every row of the user.
                    app.session
                        .execute_unpaged(
                            &app.store.edges.by_user,
                            (req.user, req.item, CqlTimestamp(req.now)),
                        )
                        .await?;
                }
                match edges.insert(&cas, &to).await? {
                    None => true,
                    Some(row) => {
                        // The row as Paxos saw it: its keys and state decide the next try.
                        seen = match row {
                            Some(row) => Some(row),
                            None => edges.read_row(req.item, req.bucket, req.user).await?,
                        };
                        continue;
                    }
                }
            }
            Some(e) if already => edges.keep(&cas, &e).await?,
            Some(e) => edges.flip(&cas, &e, &to).await?,
        };
        if applied {
            return Ok(if already {
                Outcome::Kept(remembered)
            } else {
                Outcome::Flipped(to, remembered)
            });
        }
        // Lost a race (or the guess was stale): the truth, then either our key (another
        // request with it won: replay) or another try.
        seen = edges.read_row(req.item, req.bucket, req.user).await?;
    }
    Err(ApiError::Unavailable(
        "the edge kept changing under this request; retry with the same key".into(),
    ))
}
