//! Reads: the public count `{count, asOf}` (seconds behind, and saying so) and the actor's
//! own button state (read-your-writes: the edge at SERIAL consistency).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use super::error::ApiError;
use super::{check_id, Actor, App};
use crate::hash;
use crate::store::edges::LIKERS_CHUNK;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountAnswer {
    pub item_id: String,
    pub count: i64,
    /// End of the last window applied (RFC 3339, UTC); null before the item's first window,
    /// when the count is 0 because nothing has been counted yet.
    pub as_of: Option<String>,
    /// With `region.name` set: the region that answered, from its own datacenter's copy
    /// (docs/multi-region.md): in a region that is not the item's home, `asOf` also covers
    /// the replication from the home.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// `GET /v1/items/{itemId}/count`.
pub async fn count(
    State(app): State<Arc<App>>,
    Path(item): Path<String>,
) -> Result<Json<CountAnswer>, ApiError> {
    check_id("itemId", &item)?;
    let shard = app.topology.counter_shard(&item);
    let (count, as_of) = app.store.counts.read(shard, &item).await?;
    Ok(Json(CountAnswer {
        item_id: item,
        count,
        as_of: as_of.map(|t| {
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.max(0) as u64),
            )
            .to_string()
        }),
        region: app.settings.region.name.clone(),
    }))
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LikedAnswer {
    pub item_id: String,
    pub user_id: String,
    pub liked: bool,
}

/// `GET /v1/items/{itemId}/likes/{userId}`: the actor's own state, read-your-writes.
pub async fn liked(
    State(app): State<Arc<App>>,
    Actor(actor): Actor,
    Path((item, user)): Path<(String, String)>,
) -> Result<Json<LikedAnswer>, ApiError> {
    check_id("itemId", &item)?;
    check_id("userId", &user)?;
    if user != actor {
        return Err(ApiError::Forbidden(
            "userId must be the session's user".into(),
        ));
    }
    let bucket = hash::bucket_of(&user, app.topology.buckets) as i32;
    let edge = app.store.edges.read(&item, bucket, &user).await?;
    Ok(Json(LikedAnswer {
        item_id: item,
        user_id: user,
        liked: edge.map(|e| e.liked).unwrap_or(false),
    }))
}

/// Most users in one page of who-liked.
pub const MAX_PAGE: usize = 100;

/// Reads (of `LIKERS_CHUNK` rows, or of an empty bucket) one likers page may make. An item
/// whose first rows are mostly UNLIKED was scanned whole by one request (issue 44); now a
/// page stops here with what it found, maybe fewer than `limit` users or none, and a cursor
/// to go on from.
pub const MAX_READS_PER_PAGE: usize = 10;

/// Items of one batchGet read at once (each a count and an edge).
const BATCH_READS_AT_ONCE: usize = 16;
/// Most items in one batchGet.
pub const MAX_BATCH: usize = 100;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    pub cursor: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LikersPage {
    pub item_id: String,
    pub users: Vec<String>,
    /// Pass it back as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// A position in the who-liked walk: bucket, then the last user returned in it. Opaque to
/// clients (hex); stable under concurrent writes because it is a key position, not an offset.
pub fn encode_cursor(bucket: i32, after: &str) -> String {
    hex::encode(format!("{bucket}:{after}"))
}

/// The position a cursor names, if it is one this API issued for `buckets` buckets.
pub fn decode_cursor(c: &str, buckets: i32) -> Option<(i32, String)> {
    let raw = String::from_utf8(hex::decode(c).ok()?).ok()?;
    let (b, after) = raw.split_once(':')?;
    let b: i32 = b.parse().ok()?;
    ((0..buckets).contains(&b) && (after.is_empty() || super::valid_id(after)))
        .then(|| (b, after.to_string()))
}

/// `GET /v1/items/{itemId}/likes?cursor=&limit=`: who likes the item, a page at a time,
/// walking the B buckets in order and each bucket in user order.
pub async fn likers(
    State(app): State<Arc<App>>,
    Actor(_): Actor,
    Path(item): Path<String>,
    query: Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<LikersPage>, ApiError> {
    check_id("itemId", &item)?;
    let axum::extract::Query(q) =
        query.map_err(|e| ApiError::BadRequest(format!("query: {}", e.body_text())))?;
    let limit = q.limit.unwrap_or(20);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        )));
    }
    let buckets = app.topology.buckets as i32;
    let (mut bucket, mut after) = match &q.cursor {
        None => (0, String::new()),
        Some(c) => decode_cursor(c, buckets)
            .ok_or_else(|| ApiError::BadRequest("cursor is not one this API issued".into()))?,
    };
    let mut users = Vec::with_capacity(limit);
    let mut reads = 0;
    while bucket < buckets {
        if reads == MAX_READS_PER_PAGE {
            return Ok(Json(LikersPage {
                item_id: item,
                users,
                next_cursor: Some(encode_cursor(bucket, &after)),
            }));
        }
        reads += 1;
        // Read past unliked rows in chunks; the state is not a key, so it is filtered here.
        let rows = app.store.edges.likers_chunk(&item, bucket, &after).await?;
        let mut read = 0;
        for (user, liked) in rows {
            read += 1;
            after = user.clone();
            if liked {
                users.push(user);
                if users.len() == limit {
                    return Ok(Json(LikersPage {
                        item_id: item,
                        users,
                        next_cursor: Some(encode_cursor(bucket, &after)),
                    }));
                }
            }
        }
        if read < LIKERS_CHUNK {
            bucket += 1;
            after.clear();
        }
    }
    Ok(Json(LikersPage {
        item_id: item,
        users,
        next_cursor: None,
    }))
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BatchGet {
    pub item_ids: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchItem {
    pub item_id: String,
    pub count: i64,
    pub as_of: Option<String>,
    /// The caller's own button state.
    pub liked: bool,
}

/// `POST /v1/likes:batchGet {itemIds}`: counts and the caller's button states in one call.
pub async fn batch_get(
    State(app): State<Arc<App>>,
    Actor(user): Actor,
    body: Result<Json<BatchGet>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if !(1..=MAX_BATCH).contains(&req.item_ids.len()) {
        return Err(ApiError::BadRequest(format!(
            "itemIds must hold 1..={MAX_BATCH} ids"
        )));
    }
    for id in &req.item_ids {
        check_id("every itemId", id)?;
    }
    // Bounded (issue 44): a call reads up to 200 rows, and reads pass no admission.
    let Ok(_slot) = app.batch_gets.try_acquire() else {
        return Err(ApiError::Unavailable(
            "too many batchGet calls in flight (api.max_batch_gets_in_flight); retry after the given seconds".into(),
        ));
    };
    crate::runtime::hold::point("api-batch-get").await;
    let bucket = hash::bucket_of(&user, app.topology.buckets) as i32;
    let lookups = req.item_ids.into_iter().map(|item| {
        let app = app.clone();
        let user = user.clone();
        async move {
            let Json(c) = count(State(app.clone()), Path(item.clone())).await?;
            let edge = app.store.edges.read(&item, bucket, &user).await?;
            Ok::<_, ApiError>(BatchItem {
                item_id: item,
                count: c.count,
                as_of: c.as_of,
                liked: edge.map(|e| e.liked).unwrap_or(false),
            })
        }
    });
    // At most BATCH_READS_AT_ONCE items of one call read at a time.
    use futures::{StreamExt, TryStreamExt};
    let items: Vec<BatchItem> = futures::stream::iter(lookups)
        .buffered(BATCH_READS_AT_ONCE)
        .try_collect()
        .await?;
    Ok(Json(serde_json::json!({ "items": items })))
}
