//! Hostile clients (issue 44): a request with no valid credential is refused before any
//! admission, so a flood of them spends none of the pod's write budget; and one user writing
//! at full speed gets 429 past their own share while other users write on.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::api;
use crate::common::topology as fx;

/// The pod's rate bound holds one write and refills one every 1,000 s: whatever spends it
/// before the real user's write is seen, on any box.
fn one_write_in_the_bucket(s: &mut likes::config::Settings) {
    s.api.max_writes_per_s = 0.001;
    s.api.max_writes_per_user_per_s = 0.0;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_without_a_valid_credential_spend_no_write_budget() {
    let (settings, topology, _app, client) =
        api::serve_with("unauth", one_write_in_the_bucket).await;
    let like = format!("{}/v1/items/item-1/likes", client.base);
    let unlike = format!("{}/v1/items/item-1/likes/ann", client.base);
    let forged = likes::api::auth::Signer::new(&[7u8; 32]).sign("ann", i64::MAX / 2);
    for n in 0..10 {
        let key = format!("f{n}");
        let floods = [
            client.http.post(&like).header("Idempotency-Key", &key),
            client
                .http
                .post(&like)
                .bearer_auth(&forged)
                .header("Idempotency-Key", &key),
            client.http.post(&like).bearer_auth("v1.ann.1.00"),
            client.http.delete(&unlike).header("Idempotency-Key", &key),
            client
                .http
                .post(format!("{}/v1/admin/retractions", client.base))
                .header("x-admin-token", "guess"),
        ];
        for req in floods {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{:?}", r.text().await);
        }
    }
    let (s, b) = client.like("ann", "item-1", "real").await;
    assert_eq!(
        s,
        StatusCode::OK,
        "the real user's write got the budget: {b}"
    );
    let (s, b) = client.like("bob", "item-1", "real").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "the bucket held one: {b}");
    fx::teardown(&settings, &topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_user_past_their_share_leaves_other_users_writing() {
    let (settings, topology, _app, client) = api::serve_with("usershare", |s| {
        s.api.max_writes_per_s = 0.0;
        // Three at once, then one per 1,000 s: the flood's 4th write is refused on any box.
        s.api.max_writes_per_user_per_s = 0.001;
        s.api.user_write_burst = 3.0;
    })
    .await;
    let mut answers = Vec::new();
    for n in 0..20 {
        let (s, b) = client
            .like("mallory", &format!("item-{n}"), &format!("m{n}"))
            .await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(b["error"], "user_rate_limited", "{b}");
        }
        answers.push(s);
    }
    let ok = answers.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!((ok, answers.len() - ok), (3, 17), "{answers:?}");
    for user in ["alice", "bob", "carol"] {
        let (s, b) = client.like(user, "item-0", "k").await;
        assert_eq!(s, StatusCode::OK, "{user}: {b}");
    }
    // Reads are not writes: mallory still reads.
    let (s, _) = client.get("mallory", "/v1/items/item-0/count").await;
    assert_eq!(s, StatusCode::OK);
    let r = client
        .http
        .post(format!("{}/v1/items/item-9/likes", client.base))
        .bearer_auth(client.token("mallory"))
        .header("Idempotency-Key", "late")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
    fx::teardown(&settings, &topology).await;
}

/// Reads until the server closes the connection; how long that took, or None if it was still
/// open after `patience` (far longer than the bound under test, so any box sees the close).
async fn closed_within(conn: &mut TcpStream, patience: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((started + patience).into(), conn.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Issue 44, item 4: an idle connection, a partial request line and headers sent a byte at a
/// time (slowloris) are all closed once `api.header_read_timeout` passes; before, all three
/// were still open after 70 s. And past `api.max_connections` a new connection is answered
/// only once one closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_and_idle_connections_are_closed_and_connections_are_bounded() {
    let (settings, topology, _app, client) = api::serve_with("slowloris", |s| {
        s.api.header_read_timeout = Duration::from_secs(1);
        s.api.max_connections = 3;
    })
    .await;
    let addr = client.base.trim_start_matches("http://").to_string();
    let patience = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial.write_all(b"GET /v1/items/i/co").await.unwrap();
    let mut loris = TcpStream::connect(&addr).await.unwrap();
    loris
        .write_all(b"GET /v1/items/i/count HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    // All three slots are taken: a fourth client is not answered while they are held.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let (s, b) = client.get("ann", "/v1/items/i/count").await;
            (s, b, t0.elapsed())
        })
    };
    let trickle = tokio::spawn(async move {
        let started = Instant::now();
        // A header byte every 100 ms, well inside any per-read timeout, never finished.
        while started.elapsed() < Duration::from_secs(30) {
            if loris.write_all(b"x").await.is_err() {
                return (loris, true);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (loris, false)
    });
    assert!(
        closed_within(&mut idle, patience).await.is_some(),
        "an idle connection is still open after {patience:?}"
    );
    assert!(
        closed_within(&mut partial, patience).await.is_some(),
        "a partial request line is still open after {patience:?}"
    );
    let (mut loris, cut) = trickle.await.unwrap();
    assert!(
        cut || closed_within(&mut loris, Duration::from_secs(1))
            .await
            .is_some(),
        "a slowloris is still open after 30 s"
    );
    // The fourth client is answered once a slot frees, which no slot does before its
    // header timeout ran out (unbounded, it was answered at once).
    let (s, b, after) = waiting.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{b}");
    assert!(
        after >= Duration::from_secs(1),
        "answered after {after:?}, while three connections held every slot"
    );
    fx::teardown(&settings, &topology).await;
}

/// Issue 44, item 4: who-liked over an item whose rows are nearly all unlikes. One page read
/// the item whole before (every bucket, every chunk); now a page stops after a bounded number
/// of reads and gives a cursor, and the walk still finds every liker once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_likers_page_over_many_unlikes_stops_early_with_a_cursor() {
    let (settings, topology, _app, client) = api::serve("likersscan").await;
    let session = likes::cql::connect(&settings.cql).await.unwrap();
    let insert = session
        .prepare(format!(
            "INSERT INTO {}.edges (item_id, bucket, user_id, state, op_id) VALUES (?, ?, ?, 1, 2)",
            settings.cql.keyspace
        ))
        .await
        .unwrap();
    let users: Vec<String> = (0..4000).map(|n| format!("gone{n:05}")).collect();
    for chunk in users.chunks(200) {
        let writes = chunk.iter().map(|u| {
            let bucket = likes::hash::bucket_of(u, topology.buckets) as i32;
            session.execute_unpaged(&insert, ("item-u", bucket, u.as_str()))
        });
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
    }
    let (s, b) = client.like("zed", "item-u", "z").await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/items/item-u/likes?limit=20&cursor={c}"),
            None => "/v1/items/item-u/likes?limit=20".to_string(),
        };
        let (s, page) = client.get("dave", &q).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        pages += 1;
        if pages == 1 {
            assert!(
                page["nextCursor"].is_string(),
                "the first page read the whole item: {page}"
            );
        }
        for u in page["users"].as_array().unwrap() {
            seen.push(u.as_str().unwrap().to_string());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, vec!["zed".to_string()], "over {pages} pages");
    let bound = topology.buckets as usize / likes::api::read::MAX_READS_PER_PAGE;
    assert!(
        pages > bound,
        "{pages} pages for {} buckets",
        topology.buckets
    );
    fx::teardown(&settings, &topology).await;
}
