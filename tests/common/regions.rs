//! The two-datacenter cluster of `make up-regions` (docs/multi-region.md), for the tests that
//! need it (tests/regions.rs, tests/regions_down.rs).

use std::sync::Arc;
use std::time::Duration;

use likes::config::{ReplicationClass, Settings};
use scylla::client::session::Session;

pub fn region(base: &Settings, dc: &str, address: &str) -> Settings {
    let mut s = base.clone();
    s.cql.nodes = vec![format!("{address}:9042")];
    s.cql.local_datacenter = Some(dc.to_string());
    s
}

/// Both regions' settings on one fresh two-datacenter keyspace with 4 ranges, all homed in
/// region-a, each region with its own topics; and region-a's session.
pub async fn homed_in_a(
    name: &str,
) -> (Settings, Settings, likes::topology::Topology, Arc<Session>) {
    let mut base = super::settings(name);
    base.cql.replication.class = ReplicationClass::NetworkTopologyStrategy;
    base.cql.replication.datacenters =
        [("region-a".to_string(), 1), ("region-b".to_string(), 1)].into();
    base.api.session_key = super::api::KEY.into();
    base.api.admin_token = super::api::ADMIN.into();
    // A short fence for a test: lease 1 s + deadline 2 s + one CQL timeout 3 s.
    base.region.ranges = 4;
    base.region.lease = Duration::from_secs(1);
    base.region.refresh = Duration::from_millis(200);
    base.api.write_deadline = Duration::from_secs(2);
    base.cql.request_timeout = Duration::from_secs(3);
    let prefix = base.kafka.topic_prefix.clone();
    let in_region = |dc: &str, address: &str, letter: &str| {
        let mut s = region(&base, dc, address);
        s.region.name = Some(dc.to_string());
        s.kafka.topic_prefix = format!("{prefix}{letter}.");
        s
    };
    let (a, b) = (
        in_region("region-a", "127.0.0.2", "a"),
        in_region("region-b", "127.0.0.3", "b"),
    );
    let topology = likes::topology::Topology::load(None).unwrap();
    let session = likes::cql::connect(&a.cql)
        .await
        .expect("region-a (is `make up-regions` up?)");
    likes::cmd::migrate::run(&session, &a.cql)
        .await
        .expect("migrate");
    for s in [&a, &b] {
        likes::cmd::topics::run(s, &topology).await.expect("topics");
    }
    let init = likes::ops::region::init(&a, "region-a")
        .await
        .expect("init");
    assert_eq!((init.created, init.existing), (4, 0));
    assert_eq!(
        likes::ops::region::init(&a, "region-b")
            .await
            .expect("init again")
            .created,
        0,
        "init never moves a range"
    );
    (a, b, topology, session)
}

/// Region-a's settings for two regions on the dev stack's one datacenter (the range table,
/// the fence and the forward are the API's): a fresh keyspace, 4 ranges, and a short fence
/// for a test (lease 1 s + deadline 2 s + one CQL timeout 3 s). Region-b's is a clone with
/// its own `region.name`.
pub fn one_datacenter(name: &str) -> Settings {
    let mut a = super::topology::settings(name);
    a.api.session_key = super::api::KEY.into();
    a.api.admin_token = super::api::ADMIN.into();
    a.api.relay = false;
    a.region.name = Some("region-a".into());
    a.region.ranges = 4;
    a.region.lease = Duration::from_secs(1);
    a.region.refresh = Duration::from_millis(200);
    a.api.write_deadline = Duration::from_secs(2);
    a.cql.request_timeout = Duration::from_secs(3);
    a
}

/// A move with no recount: for the tests of the range table and the write path, which run
/// no pipeline (tests/regions.rs's count test recounts).
pub async fn move_only(
    settings: &Settings,
    which: likes::ops::region::Which,
    to: &str,
) -> likes::Result<likes::ops::region::MoveReport> {
    let topology = likes::topology::Topology::load(None).expect("topology");
    // As the runbook says: with the new home's configuration (its region.name).
    let mut s = settings.clone();
    s.region.name = Some(to.to_string());
    likes::ops::region::r#move(&s, &topology, which, to, false).await
}

/// One region's API on `listener`, in this process, on the shared two-datacenter keyspace;
/// with `relay`, the relay beside it (as `likes api` runs it) until that token is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    settings: &Settings,
    topology: &likes::topology::Topology,
    relay: Option<&likes::runtime::shutdown::CancellationToken>,
) -> super::api::Client {
    let app = likes::api::App::connect(settings, topology)
        .await
        .expect("api");
    if let Some(stop) = relay {
        let relay = likes::relay::Relay::prepare(
            app.session.clone(),
            app.events.clone(),
            app.writer.routes().cloned(),
            settings,
            topology,
        )
        .await
        .expect("relay");
        tokio::spawn(likes::relay::run(
            Arc::new(relay),
            Duration::from_secs(1),
            settings.api.relay_min_age,
            stop.clone(),
        ));
    }
    // The server `likes api` runs: HTTPS when the settings give it a certificate, and then a
    // client that trusts the peers' CA (the tests sign both with one).
    let tls = !settings.api.tls_cert.is_empty();
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{}", listener.local_addr().unwrap());
    let bounds = likes::api::serve::Bounds::of(settings).expect("server bounds");
    let stop = likes::runtime::shutdown::CancellationToken::new();
    tokio::spawn(likes::api::serve::serve(
        listener,
        likes::api::router(app),
        bounds,
        stop,
    ));
    let mut http = reqwest::Client::builder();
    if tls {
        let ca = std::fs::read(&settings.region.peer_ca).expect("region.peer_ca");
        http = http
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap());
        if !settings.region.peer_cert.is_empty() {
            let mut pem = std::fs::read(&settings.region.peer_cert).unwrap();
            pem.extend(std::fs::read(&settings.region.peer_key).unwrap());
            http = http.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
    }
    super::api::Client {
        http: http.build().unwrap(),
        base: url,
        signer: likes::api::auth::Signer::new(super::api::KEY.as_bytes()),
    }
}

/// Two listeners for the regions' APIs, each region's the other's peer (forwarding).
pub async fn peered(
    a: &mut Settings,
    b: &mut Settings,
) -> (tokio::net::TcpListener, tokio::net::TcpListener) {
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let url = |l: &tokio::net::TcpListener| format!("http://{}", l.local_addr().unwrap());
    a.region.peers = [("region-b".to_string(), url(&lb))].into();
    b.region.peers = [("region-a".to_string(), url(&la))].into();
    (la, lb)
}
