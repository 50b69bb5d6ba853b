//! The API's HTTP server: axum's router on hyper, with the bounds a server facing the internet
//! needs and `axum::serve` does not set (issue 44: 12,000 half-open connections were all
//! accepted and held, RSS 98 → 409 MB; an idle connection, a partial request line and headers
//! sent a line every 5 s were all still open after 70 s):
//!
//! - at most `api.max_connections` connections; past it the next is accepted only when one
//!   closes (the kernel's backlog holds the rest), so memory and descriptors stay bounded;
//! - a request's headers must arrive within `api.header_read_timeout`, counted from when the
//!   server waits for them: an idle connection, a partial request line and a slowloris that
//!   sends a byte a second are all closed by it;
//! - a request must be answered within `api.request_timeout` (`timeout` below, a layer of
//!   the router), which bounds a slow body as well: 503 with Retry-After;
//! - with `api.tls_cert`, every connection is TLS (`tls.rs`), its handshake bounded by the
//!   header timeout too.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::error::ApiError;

/// The server's own bounds (`api.*`).
#[derive(Clone)]
pub struct Bounds {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    /// Some: HTTPS only.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Bounds {
    pub fn of(settings: &crate::config::Settings) -> crate::error::Result<Self> {
        Ok(Self {
            max_connections: settings.api.max_connections,
            header_read_timeout: settings.api.header_read_timeout,
            tls: super::tls::acceptor(settings)?,
        })
    }
}

/// Serves `router` on `listener` until `stop`, then lets the connections finish what they
/// are answering.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(bounds.max_connections.max(1)));
    let connections = TaskTracker::new();
    // One protocol per connection, chosen before any byte is read: the automatic choice
    // reads the first bytes itself with no timeout, so an idle connection was never closed.
    // HTTP/1.1 on plain TCP; HTTP/2 where TLS negotiates it (ALPN).
    let mut h1 = auto::Builder::new(TokioExecutor::new()).http1_only();
    h1.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout);
    let mut h2 = auto::Builder::new(TokioExecutor::new()).http2_only();
    h2.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(bounds.header_read_timeout));
    let (h1, h2) = (Arc::new(h1), Arc::new(h2));
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
            _ = stop.cancelled() => break,
        };
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((stream, _)) => stream,
                // Out of descriptors, a connection reset before it was taken: the listener
                // itself is fine; wait a moment rather than spin.
                Err(e) => {
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (h1, h2, router, stop) = (h1.clone(), h2.clone(), router.clone(), stop.clone());
        let (tls, handshake) = (bounds.tls.clone(), bounds.header_read_timeout);
        connections.spawn(async move {
            let _slot = slot;
            match tls {
                None => connection(stream, &h1, router, stop).await,
                Some(tls) => match tokio::time::timeout(handshake, tls.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let h2_agreed = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                        let builder = if h2_agreed { &h2 } else { &h1 };
                        connection(stream, builder, router, stop).await
                    }
                    Ok(Err(e)) => debug!(error = %e, "TLS handshake failed"),
                    Err(_) => debug!("TLS handshake not done within api.header_read_timeout"),
                },
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

async fn connection<I>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    router: Router,
    stop: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(router);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let served = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        // A client that went away or was timed out: routine.
        debug!(error = %e, "connection ended");
    }
}

/// A request not answered within `limit` gets 503 with Retry-After. A write cut here is a
/// write whose client went away: its key and its outbox entry make a retry safe.
pub async fn timeout(limit: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::Unavailable(format!(
            "the request was not answered within api.request_timeout ({limit:?})"
        ))
        .into_response(),
    }
}
