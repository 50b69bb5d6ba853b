//! The conditional write every edge relies on: `INSERT ... IF NOT EXISTS` applies once, and
//! the second attempt is rejected with the existing row in the answer, on real Cassandra.

use scylla::value::{CqlTimestamp, CqlValue, Row};

use likes::{cmd, cql};

/// Reads an LWT answer: `[applied]` and, when not applied, the existing row's columns.
fn lwt_answer(
    result: scylla::response::query_result::QueryResult,
) -> (bool, Vec<(String, Option<CqlValue>)>) {
    let rows = result.into_rows_result().unwrap();
    let names: Vec<String> = rows
        .column_specs()
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    let row: Row = rows.single_row().unwrap();
    let cols: Vec<(String, Option<CqlValue>)> = names.into_iter().zip(row.columns).collect();
    let applied = matches!(cols[0], (ref n, Some(CqlValue::Boolean(b))) if n == "[applied]" && b);
    (applied, cols)
}

fn col<'a>(cols: &'a [(String, Option<CqlValue>)], name: &str) -> Option<&'a CqlValue> {
    cols.iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_ref())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_if_not_exists_applies_once_and_shows_the_winner() {
    let settings = crate::common::settings("lwt");
    let ks = settings.cql.keyspace.clone();
    let session = cql::connect(&settings.cql).await.unwrap();
    cmd::migrate::run(&session, &settings.cql).await.unwrap();

    let insert = session
        .prepare(format!(
            "INSERT INTO {ks}.edges (item_id, bucket, user_id, state, op_id, updated_at, epoch) \
             VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        ))
        .await
        .unwrap();
    let now = CqlTimestamp(1_700_000_000_000);

    let first = session
        .execute_unpaged(&insert, ("item-1", 5i32, "user-1", 1i8, 1i64, now, 0i64))
        .await
        .unwrap();
    let (applied, _) = lwt_answer(first);
    assert!(applied, "first insert must apply");

    // Same key, different values: rejected, and the answer carries the row that won.
    let second = session
        .execute_unpaged(&insert, ("item-1", 5i32, "user-1", 0i8, 7i64, now, 0i64))
        .await
        .unwrap();
    let (applied, cols) = lwt_answer(second);
    assert!(!applied, "second insert must be rejected");
    assert_eq!(col(&cols, "state"), Some(&CqlValue::TinyInt(1)));
    assert_eq!(col(&cols, "op_id"), Some(&CqlValue::BigInt(1)));
    assert_eq!(
        col(&cols, "user_id"),
        Some(&CqlValue::Text("user-1".into()))
    );

    // And the stored row is the first one, read at SERIAL (what read-your-writes will use).
    let mut select = scylla::statement::Statement::new(format!(
        "SELECT state, op_id FROM {ks}.edges WHERE item_id = ? AND bucket = ? AND user_id = ?"
    ));
    select.set_consistency(scylla::statement::Consistency::Serial);
    let (state, op_id): (i8, i64) = session
        .query_unpaged(select, ("item-1", 5i32, "user-1"))
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    assert_eq!((state, op_id), (1, 1));

    likes::cql::schema_change(&session, format!("DROP KEYSPACE {ks}"))
        .await
        .unwrap();
}
