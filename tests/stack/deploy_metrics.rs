//! Every metric the alert rules and the Grafana dashboard use (k8s/components/monitoring/)
//! is on the /metrics of the real processes: `likes api`, `likes relay`, `likes dedupe` and
//! `likes count` as child processes on the real stack, after a little traffic, and the
//! drift and recount gauges as `likes drift` and `likes reconcile --dead-letters` write them
//! with `--metrics-file`. A rule on a metric nobody
//! exports would never fire; this is the test that it exists.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::procs::{harness, Stage};

const RULES: &str = include_str!("../../k8s/components/monitoring/prometheusrule.yaml");
const DASHBOARD: &str = include_str!("../../k8s/components/monitoring/dashboard.json");

/// Every `likes_…` metric name a text mentions (recording rules are `likes:…`, not matched).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("likes_") {
        let start = i + at;
        let word_start =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = start
            + text[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(text.len() - start);
        if word_start {
            out.insert(text[start..end].to_string());
        }
        i = end;
    }
    out
}

/// The sample names of a Prometheus text exposition, and each histogram's own name.
fn exposed(body: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    let histograms: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_suffix("_bucket").map(str::to_string))
        .collect();
    names.extend(histograms);
    names
}

async fn scrape(http: &reqwest::Client, port: u16) -> String {
    http.get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("/metrics on {port}: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported() {
    let h = harness("deploymetrics").await;
    let key = "deploy-metrics-session-key-0123456789abcdef".to_string();
    let api_port = crate::common::free_port();
    let ports: Vec<(&'static str, u16)> = ["api", "relay", "dedupe", "count"]
        .into_iter()
        .map(|p| (p, crate::common::free_port()))
        .collect();
    let mut procs: Vec<Stage> = ports
        .iter()
        .map(|&(name, port)| {
            let mut env = h.env.clone();
            env.push(("LIKES__METRICS__LISTEN".into(), format!("127.0.0.1:{port}")));
            env.push(("LIKES__API__LISTEN".into(), format!("127.0.0.1:{api_port}")));
            env.push(("LIKES__API__SESSION_KEY".into(), key.clone()));
            env.push(("LIKES__API__RELAY".into(), "false".into()));
            Stage::new(name, env, &h.dir)
        })
        .collect();
    for p in &mut procs {
        p.start();
    }

    // A little traffic: a like from a named platform, an unlike, a read.
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{api_port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "api not ready in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut env = crate::common::env_for(&h.settings);
    env.push(("LIKES__API__SESSION_KEY", key.clone()));
    let (ok, token, err) = crate::common::likes(&["token", "--user", "alice"], &env);
    assert!(ok, "likes token: {err}");
    let token = token.trim();
    for (item, k) in [("item-1", "k1"), ("item-2", "k2")] {
        let r = http
            .post(format!("{base}/v1/items/{item}/likes"))
            .bearer_auth(token)
            .header("Idempotency-Key", k)
            .header("X-Client-Platform", "ios")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let r = http
        .delete(format!("{base}/v1/items/item-2/likes/alice"))
        .bearer_auth(token)
        .header("Idempotency-Key", "k3")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let want = std::collections::BTreeMap::from([("item-1".to_string(), 1)]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let have =
            crate::common::topology::nonzero(&crate::common::topology::counts(&h.settings).await);
        if have == want {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "counts {have:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The drift gauges come from the drift job, not a server.
    let drift_file = h.dir.join("drift.prom");
    let (ok, out, err) = crate::common::likes(
        &[
            "drift",
            "--item",
            "item-1",
            "--metrics-file",
            drift_file.to_str().unwrap(),
        ],
        &crate::common::env_for(&h.settings),
    );
    assert!(ok, "likes drift: {out}\n{err}");

    // And the recount job's (an empty queue: no cut to wait for).
    let recount_file = h.dir.join("recount.prom");
    let (ok, out, err) = crate::common::likes(
        &[
            "reconcile",
            "--dead-letters",
            "--metrics-file",
            recount_file.to_str().unwrap(),
        ],
        &crate::common::env_for(&h.settings),
    );
    assert!(ok, "likes reconcile --dead-letters: {out}\n{err}");

    let mut have = exposed(&std::fs::read_to_string(&drift_file).unwrap());
    have.extend(exposed(&std::fs::read_to_string(&recount_file).unwrap()));
    for &(name, port) in &ports {
        let body = scrape(&http, port).await;
        have.extend(exposed(&body));
        if name == "dedupe" {
            assert!(
                body.contains(r#"likes_dedupe_events_by_platform_total{platform="ios"}"#),
                "stage 1 reads the new schema field:\n{body}"
            );
        }
    }
    let mut used = metric_names(RULES);
    used.extend(metric_names(DASHBOARD));
    assert!(
        used.len() >= 25,
        "the rules and the dashboard name {used:?}"
    );
    let missing: Vec<_> = used.difference(&have).collect();
    assert!(
        missing.is_empty(),
        "used by the alerts or the dashboard but exported by no process: {missing:?}\nexported: {have:?}"
    );
    for p in &mut procs {
        p.stop();
    }
    crate::common::topology::teardown(&h.settings, &h.topology).await;
}

#[test]
fn metric_names_are_whole_words() {
    let names = metric_names(
        "rate(likes_a_total[5m]) / likes:b:ratio + xlikes_c + likes_d_bucket{le=\"1\"}",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["likes_a_total", "likes_d_bucket"]
    );
}
