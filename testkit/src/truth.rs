//! The ground truth a run's counts are checked against: the edges themselves, read whole.
//! Only the tests and the tools read a keyspace whole; the product never does for a request,
//! and its jobs read what they need at a cut (src/ops/cut.rs).

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use futures::TryStreamExt;
use scylla::client::session::Session;

use likes::schema::v1::EdgeState;

/// Every edge's state, (item, user) -> liked, read page by page.
pub async fn edge_states(
    session: &Session,
    keyspace: &str,
) -> Result<HashMap<(String, String), bool>> {
    let mut rows = session
        .query_iter(
            format!("SELECT item_id, user_id, state FROM {keyspace}.edges"),
            (),
        )
        .await?
        .rows_stream::<(String, String, Option<i8>)>()?;
    let mut out = HashMap::new();
    while let Some((item, user, state)) = rows.try_next().await? {
        out.insert((item, user), state == Some(EdgeState::Liked as i8));
    }
    Ok(out)
}

/// LIKED edges per item over the whole keyspace: what each count must converge to.
pub async fn liked_per_item(session: &Session, keyspace: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for ((item, _), liked) in edge_states(session, keyspace).await? {
        if liked {
            *out.entry(item).or_insert(0) += 1;
        }
    }
    Ok(out)
}
