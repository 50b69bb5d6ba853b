//! TLS for the API (issue 44: forwards carried users' bearer tokens between regions in clear
//! text, and the configuration refused any peer that was not `http://`).
//!
//! - With `api.tls_cert` and `api.tls_key` (PEM files, e.g. a mounted Kubernetes secret) the
//!   API serves HTTPS only (HTTP/1.1 and HTTP/2 by ALPN); with `api.tls_client_ca` as well it
//!   asks every client for a certificate that CA signed (mutual TLS, for an API only peers
//!   reach).
//! - A region forwards to `https://` peers, trusting the CA in `region.peer_ca` and nothing
//!   else (no system roots: a peer is ours), and presenting `region.peer_cert`/`peer_key`
//!   when the peers ask for a client certificate.
//!
//! rustls on ring: no OpenSSL on the host, no aws-lc build.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Settings;
use crate::error::{Error, Result};

// rustls marks ring's provider deprecated because it has no post-quantum key exchange; aws-lc
// (which has) would add a cmake build of a C library to every build, which the fast-start
// work took out. Classical ECDHE between our own regions is the accepted trade for now.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{what} {}: no certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))
}

fn roots(path: &Path, what: &str) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(path, what)? {
        roots
            .add(c)
            .map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))?;
    }
    Ok(roots)
}

/// The server's TLS, when `api.tls_cert` is set (the configuration check makes the key come
/// with it).
pub fn acceptor(settings: &Settings) -> Result<Option<tokio_rustls::TlsAcceptor>> {
    let api = &settings.api;
    if api.tls_cert.is_empty() {
        return Ok(None);
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?;
    let builder = if api.tls_client_ca.is_empty() {
        builder.with_no_client_auth()
    } else {
        let roots = roots(Path::new(&api.tls_client_ca), "api.tls_client_ca")?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                .build()
                .map_err(|e| Error::Config(format!("api.tls_client_ca: {e}")))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder
        .with_single_cert(
            certs(Path::new(&api.tls_cert), "api.tls_cert")?,
            key(Path::new(&api.tls_key), "api.tls_key")?,
        )
        .map_err(|e| Error::Config(format!("api.tls_cert / api.tls_key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// The forwarding client's TLS: the peers' CA as the only root, and this region's client
/// certificate when it has one.
pub fn peer_client(
    builder: reqwest::ClientBuilder,
    settings: &Settings,
) -> Result<reqwest::ClientBuilder> {
    let r = &settings.region;
    if r.peer_ca.is_empty() {
        return Ok(builder);
    }
    let roots = roots(Path::new(&r.peer_ca), "region.peer_ca")?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = if r.peer_cert.is_empty() {
        config.with_no_client_auth()
    } else {
        config
            .with_client_auth_cert(
                certs(Path::new(&r.peer_cert), "region.peer_cert")?,
                key(Path::new(&r.peer_key), "region.peer_key")?,
            )
            .map_err(|e| Error::Config(format!("region.peer_cert / region.peer_key: {e}")))?
    };
    Ok(builder.use_preconfigured_tls(config))
}
