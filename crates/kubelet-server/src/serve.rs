//! The node API's serving loops (upstream `Server.ListenAndServe*` in
//! `pkg/kubelet/server/server.go`, i.e. Go's `http.Server.ServeTLS`): accept,
//! TLS handshake under a deadline, then HTTP/1.1 or h2 with upgrades (exec,
//! attach, port-forward) on a task of its own, so one slow or broken client
//! never holds up another. The peer's certificate chain rides in each
//! request's extensions as [`PeerCertificates`], and its address as axum's
//! `ConnectInfo`. A plain-HTTP loop serves the read-only port. Both loops
//! bound what a client may hold ([`limits`]): header and idle deadlines,
//! the size of a request head, write stalls (no progress of a response, per
//! response, for 10 min: not upstream's absolute `WriteTimeout`), the open
//! connections per port, and per address those that served it nothing.

pub mod limits;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use limits::{Conn, ConnTable, TrackedIo, guarded};
pub use limits::{HANDSHAKE_TIMEOUT, ServeLimits};

/// How long open connections get to finish after the stop token fires
/// before they are cut (follows and exec sessions would never end).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle HTTP/2 connection shed for a new client gets to take
/// its GOAWAY (its place already went to the new client).
const SHED_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The client certificate chain the peer presented (leaf first), as the TLS
/// layer received it; not yet verified against any CA.
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<[CertificateDer<'static>]>);

/// Long-lived work a request leaves behind (an upgraded exec, attach or
/// port-forward session): spawned on the server's task tracker, in the
/// request's span, and ended when the server stops. Every request served by
/// [`serve_tls`] or [`serve_plain`] carries one in its extensions.
#[derive(Clone, Debug)]
pub struct Sessions {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Sessions {
    /// Sessions on `tracker`, ended by `stop`.
    pub fn new(tracker: TaskTracker, stop: CancellationToken) -> Self {
        Self { tracker, stop }
    }

    /// The sessions of the request with `extensions`; a router served
    /// elsewhere (tests) gets a tracker of its own that is never stopped.
    pub fn of(extensions: &http::Extensions) -> Self {
        extensions.get::<Self>().cloned().unwrap_or_else(|| Self {
            tracker: TaskTracker::new(),
            stop: CancellationToken::new(),
        })
    }

    /// Runs `fut` until it ends or the server stops.
    pub fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        let fut = async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = fut => {}
            }
        };
        self.tracker
            .spawn(tracing::Instrument::in_current_span(fut));
    }
}

/// Serves `router` over TLS on `listener` until `stop` fires, with the
/// kubelet's [`ServeLimits`]; each connection runs on `tracker`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    serve_tls_with(listener, tls, router, stop, tracker, ServeLimits::default()).await;
}

/// [`serve_tls`] with `limits`.
pub async fn serve_tls_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    stop: CancellationToken,
    tracker: TaskTracker,
    limits: ServeLimits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let sessions = Sessions::new(tracker.clone(), stop.clone());
    let table = ConnTable::new(limits);
    accept_loop(listener, stop.clone(), table, |tcp, peer| {
        let acceptor = acceptor.clone();
        let router = router.clone();
        let stop = stop.clone();
        let sessions = sessions.clone();
        tracker.spawn(async move {
            let conn = tcp.conn();
            let handshake = tokio::select! {
                () = stop.cancelled() => return,
                () = conn.shed.cancelled() => return,
                h = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)) => h,
            };
            let tls = match handshake {
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
            conn.restart();
            let certs = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| PeerCertificates(c.iter().map(|c| c.clone().into_owned()).collect()));
            let client = Client {
                peer,
                certs,
                sessions,
                conn,
            };
            connection(tls, router, client, stop, limits).await;
        });
    })
    .await;
}

/// Serves `router` over plain HTTP on `listener` (the read-only port) until
/// `stop` fires, with the kubelet's [`ServeLimits`]; each connection runs
/// on `tracker`.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    serve_plain_with(listener, router, stop, tracker, ServeLimits::default()).await;
}

/// [`serve_plain`] with `limits`.
pub async fn serve_plain_with(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    tracker: TaskTracker,
    limits: ServeLimits,
) {
    let sessions = Sessions::new(tracker.clone(), stop.clone());
    let table = ConnTable::new(limits);
    accept_loop(listener, stop.clone(), table, |tcp, peer| {
        let client = Client {
            peer,
            certs: None,
            sessions: sessions.clone(),
            conn: tcp.conn(),
        };
        tracker.spawn(connection(
            tcp,
            router.clone(),
            client,
            stop.clone(),
            limits,
        ));
    })
    .await;
}

async fn accept_loop(
    listener: TcpListener,
    stop: CancellationToken,
    table: Arc<ConnTable>,
    mut spawn: impl FnMut(TrackedIo<TcpStream>, SocketAddr),
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    // At a cap with no connection to give way, the new one
                    // is closed at once: the loop never waits for a place.
                    match table.admit(peer.ip()) {
                        Some(slot) => spawn(TrackedIo::new(tcp, slot), peer),
                        None => tracing::debug!(%peer, "connection limit reached: refused"),
                    }
                }
                Err(e) => {
                    // Out of descriptors and the like: back off, as Go's
                    // http.Server does, instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
            },
        }
    }
}

/// What a connection knows of its client.
struct Client {
    peer: SocketAddr,
    certs: Option<PeerCertificates>,
    sessions: Sessions,
    conn: Arc<Conn>,
}

async fn connection<S>(
    io: S,
    router: Router,
    client: Client,
    stop: CancellationToken,
    limits: ServeLimits,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Client {
        peer,
        certs,
        sessions,
        conn: state,
    } = client;
    let svc_state = state.clone();
    let svc = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        let guard = svc_state.begin(req.version());
        if let Some(c) = &certs {
            req.extensions_mut().insert(c.clone());
        }
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(sessions.clone());
        let router = router.clone();
        let svc_state = svc_state.clone();
        async move {
            let resp = match router.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                svc_state.upgraded();
            }
            Ok::<_, Infallible>(resp.map(|body| guarded(body, guard)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.h1_header_backstop())
        .max_buf_size(limits.h1_buf_size());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.h2_header_list_size());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    loop {
        let deadline = state.deadline(&limits);
        let expired = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = stop.cancelled() => break,
            () = state.shed.cancelled() => {
                tracing::debug!(%peer, "connection closed for a new client");
                if state.idle_h2() {
                    // Tell an HTTP/2 client with GOAWAY, briefly.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHED_DRAIN_TIMEOUT, conn).await;
                }
                return;
            }
            () = state.changed.notified() => {}
            () = expired => {
                if state.deadline(&limits).is_some_and(|at| at <= tokio::time::Instant::now()) {
                    tracing::debug!(%peer, "connection closed: no request or write progress in time");
                    if state.idle_h2() {
                        // Tell an HTTP/2 client with GOAWAY.
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(DRAIN_TIMEOUT, conn).await;
                    }
                    return;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, conn).await;
}

#[cfg(test)]
mod limits_share_tests;
#[cfg(test)]
mod limits_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{SwappableCert, TlsSettings, certified_key_from_pem, server_config};
    use axum::extract::Request;
    use axum::routing::get;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn cert(name: &str) -> (Arc<rustls::sign::CertifiedKey>, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        let c = p.self_signed(&key).expect("cert");
        let ck = certified_key_from_pem(c.pem().as_bytes(), key.serialize_pem().as_bytes())
            .expect("certified key");
        (Arc::new(ck), c.der().clone())
    }

    /// Echoes bytes on an HTTP/1.1 upgrade, as exec and port-forward use it.
    async fn upgrade(mut req: Request) -> axum::response::Response {
        let Some(on) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
            return (http::StatusCode::BAD_REQUEST, "no upgrade").into_response();
        };
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 4];
                if io.read_exact(&mut buf).await.is_ok() {
                    let _ = io.write_all(&buf).await;
                }
            }
        });
        http::Response::builder()
            .status(http::StatusCode::SWITCHING_PROTOCOLS)
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "echo")
            .body(axum::body::Body::empty())
            .map(IntoResponse::into_response)
            .unwrap_or_else(|_| http::StatusCode::INTERNAL_SERVER_ERROR.into_response())
    }

    use axum::response::IntoResponse;

    fn router() -> Router {
        Router::new()
            .route("/ping", get(|| async { "pong" }))
            .route("/echo", get(upgrade))
    }

    #[tokio::test]
    async fn plain_loop_serves_requests_and_upgrades_then_stops() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
        tracker.spawn(serve_plain(
            listener,
            router(),
            stop.clone(),
            tracker.clone(),
        ));

        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        tokio::spawn(conn.with_upgrades());
        let resp = send
            .send_request(
                http::Request::get("/ping")
                    .body(Empty::<Bytes>::new())
                    .expect("request"),
            )
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"pong");
        let resp = send
            .send_request(
                http::Request::get("/echo")
                    .header(http::header::CONNECTION, "Upgrade")
                    .header(http::header::UPGRADE, "echo")
                    .body(Empty::<Bytes>::new())
                    .expect("request"),
            )
            .await
            .expect("response");
        assert_eq!(resp.status(), http::StatusCode::SWITCHING_PROTOCOLS);
        let mut io = TokioIo::new(hyper::upgrade::on(resp).await.expect("upgraded"));
        io.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        io.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"ping");

        stop.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(30), tracker.wait())
            .await
            .expect("stops");
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }

    async fn tls_get(
        addr: std::net::SocketAddr,
        root: CertificateDer<'static>,
    ) -> (String, Vec<CertificateDer<'static>>) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root).expect("root");
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").expect("name"),
                tcp,
            )
            .await
            .expect("handshake");
        let presented = tls
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| c.to_vec())
            .unwrap_or_default();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("http handshake");
        tokio::spawn(conn);
        let resp = send
            .send_request(
                http::Request::get("/ping")
                    .header(http::header::HOST, "localhost")
                    .body(Empty::<Bytes>::new())
                    .expect("request"),
            )
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (String::from_utf8_lossy(&body).into_owned(), presented)
    }

    #[tokio::test]
    async fn a_stalled_client_does_not_hold_up_others_and_a_swapped_cert_is_served() {
        let (first, first_der) = cert("first");
        let (second, second_der) = cert("second");
        let resolver = Arc::new(SwappableCert::new(first));
        let cfg = server_config(&TlsSettings::default(), resolver.clone()).expect("config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
        tracker.spawn(serve_tls(
            listener,
            Arc::new(cfg),
            router(),
            stop.clone(),
            tracker.clone(),
        ));
        // Connects and never says a word.
        let _stalled = TcpStream::connect(addr).await.expect("connect");
        let (body, presented) = tls_get(addr, first_der.clone()).await;
        assert_eq!(body, "pong");
        assert_eq!(presented.first(), Some(&first_der));
        resolver.set(second);
        let (body, presented) = tls_get(addr, second_der.clone()).await;
        assert_eq!(body, "pong");
        assert_eq!(presented.first(), Some(&second_der));
        stop.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(30), tracker.wait())
            .await
            .expect("stops");
    }
}
