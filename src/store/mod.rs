//! Every table's CQL, and the events topic: typed access to the edges (with their request keys
//! and history), the users' index, the outbox, the counter rows and their fence, retractions,
//! erasures and the topology record, with statements prepared once at start. Each process
//! takes the stores it uses: the relay needs the outbox, the edges and the events, never a
//! session key. Serial consistency is set once, where the session is built (cql/mod.rs).

pub mod counts;
pub mod edge_history;
pub mod edges;
pub mod erasures;
pub mod events;
pub mod imported;
pub mod outbox;
pub mod outbox_lease;
pub mod ranges;
pub mod recorded;
pub mod request_keys;
pub mod retractions;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};

use crate::error::{Error, Result};

/// Prepares one statement; a failure names the statement (a schema older than the code).
pub(crate) async fn prepare(session: &Session, q: String) -> Result<PreparedStatement> {
    use scylla::errors::{PrepareError, RequestAttemptError};
    session.prepare(q.clone()).await.map_err(|e| match e {
        // The database refused the statement: the schema is not what this version expects.
        PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(..),
        } => Error::Schema(format!("prepare {q}: {e}")),
        // No node reachable, a connection broken: a restart, worth another try.
        _ => Error::CqlTransient(format!("prepare {q}: {e}")),
    })
}

/// A row as (column name, value) pairs.
pub type Columns = Vec<(String, Option<CqlValue>)>;

/// None when a conditional statement applied; otherwise the row it returned, by column.
pub fn not_applied(result: scylla::response::query_result::QueryResult) -> Result<Option<Columns>> {
    let rows = result.into_rows_result()?;
    let names = crate::cql::column_names(&rows);
    let row: Row = rows.single_row()?;
    let applied = crate::records::lwt_applied(&names, &row.columns) == Some(true);
    let cols: Columns = names.into_iter().zip(row.columns).collect();
    Ok(if applied { None } else { Some(cols) })
}

/// Every store the API uses, prepared once at start.
pub struct Stores {
    pub edges: edges::Edges,
    pub outbox: outbox::Outbox,
    pub counts: counts::Counts,
    pub retractions: retractions::Retractions,
    pub erasures: erasures::Erasures,
}

impl Stores {
    pub async fn prepare(session: &std::sync::Arc<Session>, ks: &str) -> Result<Self> {
        Ok(Self {
            edges: edges::Edges::prepare(session.clone(), ks).await?,
            outbox: outbox::Outbox::prepare(session.clone(), ks).await?,
            counts: counts::Counts::prepare(session.clone(), ks).await?,
            retractions: retractions::Retractions::prepare(session.clone(), ks).await?,
            erasures: erasures::Erasures::prepare(session.clone(), ks).await?,
        })
    }
}
