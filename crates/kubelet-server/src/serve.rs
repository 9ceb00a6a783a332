//! The node API's serving loops (upstream `Server.ListenAndServe*` in
//! `pkg/kubelet/server/server.go`, i.e. Go's `http.Server.ServeTLS`): accept,
//! TLS handshake under a deadline, then HTTP/1.1 or h2 with upgrades (exec,
//! attach, port-forward) on a task of its own, so one slow or broken client
//! never holds up another. The peer's certificate chain rides in each
//! request's extensions as [`PeerCertificates`] for the x509 authenticator.
//! A plain-HTTP loop serves the read-only port.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long open connections get to finish after the stop token fires
/// before they are cut (follows and exec sessions would never end).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The client certificate chain the peer presented (leaf first), as the TLS
/// layer received it; not yet verified against any CA.
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<[CertificateDer<'static>]>);

/// Serves `router` over TLS on `listener` until `stop` fires; each
/// connection runs on `tracker`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let acceptor = TlsAcceptor::from(tls);
    accept_loop(listener, stop.clone(), |tcp, peer| {
        let acceptor = acceptor.clone();
        let router = router.clone();
        let stop = stop.clone();
        tracker.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let certs = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| PeerCertificates(c.iter().map(|c| c.clone().into_owned()).collect()));
            connection(tls, router, certs, stop).await;
        });
    })
    .await;
}

/// Serves `router` over plain HTTP on `listener` (the read-only port) until
/// `stop` fires; each connection runs on `tracker`.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    accept_loop(listener, stop.clone(), |tcp, _| {
        let router = router.clone();
        let stop = stop.clone();
        tracker.spawn(connection(tcp, router, None, stop));
    })
    .await;
}

async fn accept_loop(
    listener: TcpListener,
    stop: CancellationToken,
    mut spawn: impl FnMut(TcpStream, std::net::SocketAddr),
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    spawn(tcp, peer);
                }
                Err(e) => {
                    // Out of descriptors and the like: back off, as Go's
                    // http.Server does, instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            },
        }
    }
}

async fn connection<S>(
    io: S,
    router: Router,
    certs: Option<PeerCertificates>,
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        if let Some(c) = &certs {
            req.extensions_mut().insert(c.clone());
        }
        let router = router.clone();
        async move {
            let resp = match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            Ok::<_, Infallible>(resp)
        }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            return;
        }
        _ = stop.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, conn).await;
}
