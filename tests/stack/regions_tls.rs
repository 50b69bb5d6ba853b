//! Issue 44, item 3: writes forwarded between regions carry the user's bearer token, so they
//! travel over TLS. Region-b's API serves HTTPS only, asking for a client certificate
//! (mutual TLS); region-a forwards to its `https://` address trusting only `region.peer_ca`
//! and presenting its own certificate. A CA, a server and a client certificate are made here
//! (rcgen); the dev stack's one datacenter is enough: the forward is the API's.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

use crate::common::topology as fx;

/// A CA's PEM, and a way to sign leaves with it.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Self {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    /// (certificate PEM, key PEM) for 127.0.0.1 and localhost.
    fn leaf(&self, purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.extended_key_usages = vec![purpose];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_forwarded_between_regions_go_over_mutual_tls() {
    let dir = std::env::temp_dir().join(likes_testkit::names::unique("likes-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let put = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let (ca, stranger) = (Ca::new("likes test CA"), Ca::new("someone else's CA"));
    let ca_pem = put("ca.pem", &ca.cert.pem());
    let stranger_pem = put("stranger.pem", &stranger.cert.pem());
    let (server_cert, server_key) = ca.leaf(ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = ca.leaf(ExtendedKeyUsagePurpose::ClientAuth);

    let mut a = crate::common::regions::one_datacenter("regiontls");
    a.region.peer_ca = ca_pem.clone();
    a.region.peer_cert = put("client.pem", &client_cert);
    a.region.peer_key = put("client.key", &client_key);
    let topology = likes::topology::Topology::load(None).unwrap();
    fx::setup(&a, &topology).await;
    likes::ops::region::init(&a, "region-a").await.unwrap();
    crate::common::regions::move_only(&a, likes::ops::region::Which::Ranges(vec![0]), "region-b")
        .await
        .unwrap();
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let b_addr = lb.local_addr().unwrap();
    let mut b = a.clone();
    b.region.name = Some("region-b".into());
    b.api.tls_cert = put("server.pem", &server_cert);
    b.api.tls_key = put("server.key", &server_key);
    b.api.tls_client_ca = ca_pem.clone();
    a.region.peers = [("region-b".to_string(), format!("https://{b_addr}"))].into();
    let api_b = crate::common::regions::serve(lb, &b, &topology, None).await;
    let api_a = crate::common::regions::serve(la, &a, &topology, None).await;
    let item = (0..)
        .map(|n| format!("tls-{n}"))
        .find(|i| likes::region::range_of(i, 4) == 0)
        .unwrap();

    // Region-a's client sends region-b's item to region-a: forwarded over mutual TLS.
    let r = api_a
        .http
        .post(format!("{}/v1/items/{item}/likes", api_a.base))
        .bearer_auth(api_a.token("tess"))
        .header("Idempotency-Key", "k1")
        .send()
        .await
        .unwrap();
    let by = r.headers().get("x-likes-region").cloned();
    let (status, body) = (r.status().as_u16(), r.text().await.unwrap());
    assert_eq!(
        (status, by.as_ref().and_then(|v| v.to_str().ok())),
        (200, Some("region-b")),
        "{body}"
    );
    let (_, liked) = api_b
        .get("tess", &format!("/v1/items/{item}/likes/tess"))
        .await;
    assert_eq!(liked["liked"], serde_json::json!(true), "{liked}");

    // Region-b speaks TLS only, and only to clients with a certificate its CA signed.
    let plain = reqwest::Client::new()
        .get(format!("http://{b_addr}/healthz"))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    let ca_only = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    assert!(
        ca_only
            .get(format!("https://{b_addr}/healthz"))
            .send()
            .await
            .is_err(),
        "a client without a certificate was served"
    );

    // A region that trusts another CA refuses region-b's certificate: the write is not sent.
    let mut wary = a.clone();
    wary.region.peer_ca = stranger_pem;
    let lw = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_w = crate::common::regions::serve(lw, &wary, &topology, None).await;
    let (s, e) = api_w.like("tess", &item, "k2").await;
    assert_eq!(s.as_u16(), 503, "a forward to an untrusted peer: {e}");
    fx::teardown(&a, &topology).await;
    let _ = std::fs::remove_dir_all(&dir);
}
