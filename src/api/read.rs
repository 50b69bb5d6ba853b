//! Reads: the public count `{count, asOf}` (seconds behind, and saying so) and the actor's
//! own button state (read-your-writes: the edge at SERIAL consistency).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use scylla::value::CqlTimestamp;
use serde::Serialize;

use super::error::ApiError;
use super::write::read_edge;
use super::{check_id, Actor, App};
use crate::hash;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountAnswer {
    pub item_id: String,
    pub count: i64,
    /// End of the last window applied (RFC 3339, UTC); null before the item's first window,
    /// when the count is 0 because nothing has been counted yet.
    pub as_of: Option<String>,
}

/// `GET /v1/items/{itemId}/count`.
pub async fn count(
    State(app): State<Arc<App>>,
    Path(item): Path<String>,
) -> Result<Json<CountAnswer>, ApiError> {
    check_id("itemId", &item)?;
    let shard = app.topology.counter_shard(&item);
    let rows = app
        .session
        .query_unpaged(
            format!(
                "SELECT count, as_of FROM {}.like_counts WHERE shard = ? AND item_id = ?",
                app.settings.cql.keyspace
            ),
            (shard, &item),
        )
        .await?
        .into_rows_result()
        .map_err(crate::error::Error::from)?;
    let row = rows
        .maybe_first_row::<(Option<i64>, Option<CqlTimestamp>)>()
        .map_err(crate::error::Error::from)?;
    let (count, as_of) = row.unwrap_or((Some(0), None));
    Ok(Json(CountAnswer {
        item_id: item,
        count: count.unwrap_or(0),
        as_of: as_of.map(|t| {
            humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.0.max(0) as u64),
            )
            .to_string()
        }),
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
    let edge = read_edge(&app.session, &app.stmts, &item, bucket, &user).await?;
    Ok(Json(LikedAnswer {
        item_id: item,
        user_id: user,
        liked: edge.map(|e| e.liked).unwrap_or(false),
    }))
}
