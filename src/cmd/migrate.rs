//! `likes migrate`: creates the keyspace and the tables of docs/design.md. Idempotent: a second run
//! changes nothing and says so. The one change it makes to an existing table is additive:
//! a regular column this version added is added (`ALTER TABLE ... ADD`), which older
//! processes ignore. It never drops: an existing table whose columns or key differ otherwise
//! is an error for a person to resolve, and a table this version no longer uses is a warning
//! with the command that drops it.

use std::collections::{BTreeMap, HashMap};

use scylla::client::session::Session;
use tracing::{info, warn};

use crate::config::CqlSettings;
use crate::cql::tables::{self, TableSpec, TABLES};
use crate::error::{Error, Result};

/// What a migration did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigrateReport {
    pub keyspace: String,
    pub keyspace_created: bool,
    pub created: Vec<&'static str>,
    /// (table, column) added to an existing table.
    pub added: Vec<(&'static str, &'static str)>,
    pub unchanged: Vec<&'static str>,
    /// Differences that migrate does not fix by itself (replication).
    pub warnings: Vec<String>,
}

impl MigrateReport {
    /// True when the run changed nothing.
    pub fn is_noop(&self) -> bool {
        !self.keyspace_created && self.created.is_empty() && self.added.is_empty()
    }
}

impl std::fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ks = if self.keyspace_created {
            "created"
        } else {
            "exists"
        };
        writeln!(f, "keyspace {}: {ks}", self.keyspace)?;
        for t in &self.created {
            writeln!(f, "table {}.{t}: created", self.keyspace)?;
        }
        for (t, c) in &self.added {
            writeln!(f, "table {}.{t}: added column {c}", self.keyspace)?;
        }
        for t in &self.unchanged {
            writeln!(f, "table {}.{t}: unchanged", self.keyspace)?;
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        if self.is_noop() {
            write!(f, "nothing to do")
        } else {
            write!(f, "migrated")
        }
    }
}

/// Create the CQL keyspace and tables, and record the topology's bucket count and window
/// in it (idempotent; adds columns a newer version needs, never drops or rewrites a table).
///
/// Example: after changing `window` in topology/, `likes migrate --accept-window-change`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Record a new window length (safe: the counter fence compares window end times).
    /// Without it, a window other than the recorded one is refused.
    #[arg(long)]
    pub accept_window_change: bool,
}

/// `likes migrate`.
pub async fn command(args: Args, ctx: &crate::ops::Ctx) -> Result<crate::ops::Done> {
    let session = crate::cql::connect(&ctx.settings.cql).await?;
    let report = run(&session, &ctx.settings.cql).await?;
    let mut said = report.to_string();
    // The schema's report stands even when the topology's record is refused (a window
    // change without --accept-window-change): the tables it created are there.
    let recorded = record(&session, ctx, args.accept_window_change).await;
    let recorded = recorded.map(|lines| {
        for line in lines {
            said.push('\n');
            said.push_str(&line);
        }
    });
    Ok(crate::ops::Done::report(said).failing_on(recorded))
}

/// What `likes migrate` does, for the tools' namespaces (testkit/src/namespace.rs) as for
/// the command (the tests' own setup applies the schema alone, with [`run`]): the schema applied, then the topology recorded in the keyspace (which a
/// migration that failed half-way must not have recorded). Returns what each said.
pub async fn migrate_and_record(
    session: &Session,
    ctx: &crate::ops::Ctx,
    accept_window_change: bool,
) -> Result<(MigrateReport, Vec<String>)> {
    let report = run(session, &ctx.settings.cql).await?;
    let recorded = record(session, ctx, accept_window_change).await?;
    Ok((report, recorded))
}

/// Records the topology's bucket count and window in the keyspace.
async fn record(
    session: &Session,
    ctx: &crate::ops::Ctx,
    accept_window_change: bool,
) -> Result<Vec<String>> {
    crate::store::recorded::record(
        session,
        &ctx.settings.cql.keyspace,
        &ctx.topology,
        accept_window_change,
    )
    .await
}

/// Applies the schema to `settings.keyspace`.
pub async fn run(session: &Session, settings: &CqlSettings) -> Result<MigrateReport> {
    let ks = settings.keyspace.as_str();
    let mut report = MigrateReport {
        keyspace: ks.to_string(),
        ..Default::default()
    };

    match keyspace_replication(session, ks).await? {
        None => {
            crate::cql::schema_change(session, tables::create_keyspace(ks, &settings.replication))
                .await?;
            report.keyspace_created = true;
            info!(keyspace = ks, "keyspace created");
        }
        Some(existing) => {
            let wanted = tables::replication_map(&settings.replication);
            if existing != wanted {
                let w = format!(
                    "keyspace {ks} has replication {existing:?}, the configuration asks for {wanted:?}; \
                     migrate does not change replication (ALTER KEYSPACE by hand, then run a repair)"
                );
                warn!("{w}");
                report.warnings.push(w);
            }
        }
    }

    for table in TABLES {
        let existing = table_columns(session, ks, table.name).await?;
        if existing.is_empty() {
            crate::cql::schema_change(session, table.create_statement(ks)).await?;
            info!(
                keyspace = ks,
                table = table.name,
                purpose = table.purpose,
                "table created"
            );
            report.created.push(table.name);
        } else {
            // Checked before anything is added: a table that differs in any other way is
            // reported untouched.
            let missing = missing_regular(table, &existing);
            check_table(ks, table, &existing, &missing)?;
            if missing.is_empty() {
                report.unchanged.push(table.name);
            } else {
                add_columns(session, ks, table, &missing).await?;
                report
                    .added
                    .extend(missing.into_iter().map(|c| (table.name, c)));
            }
        }
    }
    for (table, why) in RETIRED {
        if !table_columns(session, ks, table).await?.is_empty() {
            let w = format!(
                "table {ks}.{table} is no longer used ({why}); once no process of an older \
                 version runs, drop it: DROP TABLE {ks}.{table}"
            );
            warn!("{w}");
            report.warnings.push(w);
        }
    }
    Ok(report)
}

/// Tables an earlier version created and this one no longer uses, with the reason.
const RETIRED: &[(&str, &str)] = &[(
    "idempotency",
    "request keys live on the edge row since writes take one Paxos round",
)];

/// The regular columns of the spec that an existing table lacks: the ones migrate adds.
fn missing_regular(table: &TableSpec, existing: &BTreeMap<String, Column>) -> Vec<&'static str> {
    let expected = expected_columns(table);
    table
        .columns
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| !existing.contains_key(*n) && expected[*n].kind == "regular")
        .collect()
}

/// `ALTER TABLE ... ADD` for each of `columns` (names from the spec).
async fn add_columns(
    session: &Session,
    keyspace: &str,
    table: &TableSpec,
    columns: &[&'static str],
) -> Result<()> {
    for (name, cql_type) in table.columns.iter().filter(|(n, _)| columns.contains(n)) {
        crate::cql::schema_change(
            session,
            format!(
                "ALTER TABLE {keyspace}.{} ADD {name} {cql_type}",
                table.name
            ),
        )
        .await?;
        info!(keyspace, table = table.name, column = name, "column added");
    }
    Ok(())
}

async fn keyspace_replication(
    session: &Session,
    keyspace: &str,
) -> Result<Option<BTreeMap<String, String>>> {
    let rows = session
        .query_unpaged(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await?
        .into_rows_result()?;
    Ok(rows
        .maybe_first_row::<(HashMap<String, String>,)>()?
        .map(|(m,)| m.into_iter().collect()))
}

/// An existing column: its CQL type and its kind (partition_key, clustering, regular).
#[derive(Debug, PartialEq, Eq)]
struct Column {
    kind: String,
    position: i32,
    cql_type: String,
}

async fn table_columns(
    session: &Session,
    keyspace: &str,
    table: &str,
) -> Result<BTreeMap<String, Column>> {
    let rows = session
        .query_unpaged(
            "SELECT column_name, kind, position, type FROM system_schema.columns \
             WHERE keyspace_name = ? AND table_name = ?",
            (keyspace, table),
        )
        .await?
        .into_rows_result()?;
    let mut out = BTreeMap::new();
    for row in rows.rows::<(String, String, i32, String)>()? {
        let (name, kind, position, cql_type) = row?;
        out.insert(
            name,
            Column {
                kind,
                position,
                cql_type,
            },
        );
    }
    Ok(out)
}

/// The spec's columns as `system_schema.columns` would list them.
fn expected_columns(table: &TableSpec) -> BTreeMap<String, Column> {
    table
        .columns
        .iter()
        .map(|(name, cql_type)| {
            let (kind, position) =
                if let Some(i) = table.partition_key.iter().position(|c| c == name) {
                    ("partition_key", i as i32)
                } else if let Some(i) = table.clustering.iter().position(|c| c == name) {
                    ("clustering", i as i32)
                } else {
                    ("regular", -1)
                };
            (
                name.to_string(),
                Column {
                    kind: kind.into(),
                    position,
                    cql_type: cql_type.to_string(),
                },
            )
        })
        .collect()
}

/// Every difference between an existing table and the spec, except the regular columns in
/// `to_add` (which migrate adds); an error naming them all.
fn check_table(
    keyspace: &str,
    table: &TableSpec,
    existing: &BTreeMap<String, Column>,
    to_add: &[&str],
) -> Result<()> {
    let expected = expected_columns(table);
    let mut diffs = Vec::new();
    for (name, want) in &expected {
        match existing.get(name) {
            None if to_add.contains(&name.as_str()) => {}
            None => diffs.push(format!("column {name} is missing")),
            Some(have) if have != want => diffs.push(format!(
                "column {name} is {} {} (position {}), expected {} {} (position {})",
                have.kind, have.cql_type, have.position, want.kind, want.cql_type, want.position
            )),
            Some(_) => {}
        }
    }
    for name in existing.keys().filter(|n| !expected.contains_key(*n)) {
        diffs.push(format!("column {name} is not in this version's schema"));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema(format!(
            "table {keyspace}.{} exists but differs from this version's schema: {}; \
             migrate never alters tables: fix it by hand or use another keyspace",
            table.name,
            diffs.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matching_table_passes_and_a_drifted_one_is_named() {
        let edges = &TABLES[0];
        let mut have = expected_columns(edges);
        assert!(check_table("ks", edges, &have, &[]).is_ok());
        have.get_mut("state").unwrap().cql_type = "int".into();
        have.remove("epoch");
        let err = check_table("ks", edges, &have, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("column state is regular int"), "{err}");
        assert!(err.contains("column epoch is missing"), "{err}");
    }
}
