//! The listeners' limits against misbehaving clients: a client that
//! trickles its request head or sends nothing is cut at the header timeout,
//! a kept-alive connection waits the idle timeout, the TLS handshake has
//! its deadline, and the connection cap holds while new clients are served.
//! Timeouts run on paused time; the shedding test sets hour-long timeouts,
//! so only shedding can free a place. The per-address share with upgraded
//! sessions, and write stalls on HTTP/2, are in `limits_share_tests`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::limits::{HEADER_READ_TIMEOUT, IDLE_TIMEOUT, WRITE_STALL_TIMEOUT};
use super::*;
use futures::StreamExt;

pub(super) const DEADLINE: Duration = Duration::from_secs(10);
/// Longer than any deadline of the default limits.
pub(super) const LONG: Duration = Duration::from_secs(600);

/// `/hold` answers once `gate` has a permit; each arrival adds one to
/// `arrived`.
#[derive(Clone)]
pub(super) struct Hold {
    pub(super) gate: Arc<Semaphore>,
    pub(super) arrived: Arc<Semaphore>,
}

impl Hold {
    pub(super) fn new() -> Self {
        Self {
            gate: Arc::new(Semaphore::new(0)),
            arrived: Arc::new(Semaphore::new(0)),
        }
    }
}

fn router(hold: Hold) -> Router {
    Router::new()
        .route("/ping", get(|| async { "pong" }))
        .route(
            "/hold",
            get(move || {
                let hold = hold.clone();
                async move {
                    hold.arrived.add_permits(1);
                    let _permit = hold.gate.acquire().await;
                    "held"
                }
            }),
        )
        .route("/echo", get(echo))
        .route(
            "/big",
            get(|| async {
                // Endless: more than any socket buffer holds.
                let chunk = Bytes::from(vec![0u8; 1 << 16]);
                axum::body::Body::from_stream(
                    futures::stream::repeat(chunk).map(Ok::<_, std::convert::Infallible>),
                )
            }),
        )
}

/// Echoes bytes on an HTTP/1.1 upgrade until the client goes, as an exec
/// or port-forward session stays open.
async fn echo(mut req: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(on) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return http::StatusCode::BAD_REQUEST.into_response();
    };
    tokio::spawn(async move {
        if let Ok(up) = on.await {
            let (mut rd, mut wr) = tokio::io::split(TokioIo::new(up));
            let _ = tokio::io::copy(&mut rd, &mut wr).await;
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

pub(super) async fn plain(limits: ServeLimits, hold: Hold) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    tokio::spawn(serve_plain_with(
        listener,
        router(hold),
        stop.clone(),
        TaskTracker::new(),
        limits,
    ));
    (addr, stop)
}

/// Waits until the server closes `s` (EOF or an error); returns when.
pub(super) async fn closed(s: &mut TcpStream) -> Instant {
    let mut buf = [0u8; 256];
    let wait = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(LONG, wait)
        .await
        .expect("the server closes the connection")
}

pub(super) type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// An HTTP/1.1 client connection; the task ends when the server closes it.
pub(super) async fn client(addr: SocketAddr) -> (Sender, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

pub(super) async fn get_body(send: &mut Sender, path: &str) -> String {
    let req = http::Request::get(path)
        .header(http::header::HOST, "kubelet")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

pub(super) fn assert_near(elapsed: Duration, expected: Duration) {
    assert!(
        elapsed >= expected.saturating_sub(Duration::from_secs(1))
            && elapsed <= expected + Duration::from_secs(1),
        "closed after {elapsed:?}, expected {expected:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_trickling_client_is_cut_off_at_the_header_timeout() {
    let (addr, _stop) = plain(ServeLimits::default(), Hold::new()).await;
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = s.split();
    let head = b"GET /ping HTTP/1.1\r\nHost: kubelet\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let trickle = async {
        for b in head {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("still open after trickling {} bytes", head.len());
    };
    let cut = async {
        let mut buf = [0u8; 64];
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => Instant::now(),
            Ok(n) => panic!("no response expected: {:?}", &buf[..n]),
        }
    };
    let at = tokio::select! {
        () = trickle => unreachable!(),
        at = cut => at,
    };
    assert!(head.len() > 2 * HEADER_READ_TIMEOUT.as_secs() as usize);
    assert_near(at - start, HEADER_READ_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_is_cut_off_at_the_header_timeout_and_a_kept_alive_one_after_idling() {
    let (addr, _stop) = plain(ServeLimits::default(), Hold::new()).await;
    let start = Instant::now();
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    assert_near(closed(&mut silent).await - start, HEADER_READ_TIMEOUT);

    // A kept-alive connection may wait longer than the header timeout for
    // its next request (upstream IdleTimeout 90 s), and no longer.
    let (mut send, conn) = client(addr).await;
    assert_eq!(get_body(&mut send, "/ping").await, "pong");
    tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(10)).await;
    assert_eq!(get_body(&mut send, "/ping").await, "pong");
    let idle = Instant::now();
    tokio::time::timeout(LONG, conn)
        .await
        .expect("the server closes the kept-alive connection")
        .expect("client task");
    assert_near(Instant::now() - idle, IDLE_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn the_tls_handshake_and_the_first_request_have_deadlines() {
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let ck =
        crate::tls::certified_key_from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
            .expect("certified key");
    let resolver = Arc::new(crate::tls::SwappableCert::new(Arc::new(ck)));
    let cfg =
        crate::tls::server_config(&crate::tls::TlsSettings::default(), resolver).expect("config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    tokio::spawn(serve_tls(
        listener,
        Arc::new(cfg),
        router(Hold::new()),
        stop.clone(),
        TaskTracker::new(),
    ));

    // No handshake at all.
    let start = Instant::now();
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    assert_near(closed(&mut silent).await - start, HANDSHAKE_TIMEOUT);

    // A handshake, then no request.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let client_cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client_cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").expect("name"),
            tcp,
        )
        .await
        .expect("handshake");
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(LONG, tls.read(&mut buf))
        .await
        .expect("the server closes the connection");
    assert!(!matches!(read, Ok(n) if n > 0), "{read:?}");
    assert_near(Instant::now() - start, HEADER_READ_TIMEOUT);
}

#[tokio::test]
async fn at_the_cap_a_new_client_takes_the_place_of_one_without_a_request() {
    // Hour-long timeouts: only shedding can make room here.
    let limits = ServeLimits {
        header_read_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        max_connections: 3,
        ..ServeLimits::default()
    };
    let (addr, _stop) = plain(limits, Hold::new()).await;
    let mut attackers = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /ping HTTP/1.1\r\nHost:")
            .await
            .expect("write");
        attackers.push(s);
    }
    // Each new client is served, in the place of the oldest connection
    // that never sent a request.
    let mut clients = Vec::new();
    for attacker in &mut attackers {
        let (mut send, conn) = client(addr).await;
        let body = tokio::time::timeout(DEADLINE, get_body(&mut send, "/ping"))
            .await
            .expect("served while the cap is full");
        assert_eq!(body, "pong");
        tokio::time::timeout(DEADLINE, closed(attacker))
            .await
            .expect("the oldest idle attacker was closed");
        clients.push((send, conn));
    }
    // All three places now hold served clients: the next one takes the
    // place of the one idle longest.
    let (mut send, _conn) = client(addr).await;
    let body = tokio::time::timeout(DEADLINE, get_body(&mut send, "/ping"))
        .await
        .expect("served");
    assert_eq!(body, "pong");
    let (_, first) = clients.remove(0);
    tokio::time::timeout(DEADLINE, first)
        .await
        .expect("the longest idle client was closed")
        .expect("client task");
    for (_, conn) in &clients {
        assert!(!conn.is_finished(), "newer clients keep their connections");
    }
}

/// Connects from `ip` (any address of the loopback network) to `addr`.
pub(super) async fn connect_from(ip: [u8; 4], addr: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(SocketAddr::from((ip, 0))).expect("bind");
    sock.connect(addr).await.expect("connect")
}

/// Asserts that the server closes `s` at once, without a response.
async fn refused(mut s: TcpStream) {
    let start = Instant::now();
    let at = closed(&mut s).await;
    assert!(at - start < Duration::from_secs(1), "closed at once");
}

/// Starts two `/hold` requests, each on a connection of its own, and
/// returns once both are in flight.
async fn two_held(addr: SocketAddr, hold: &Hold) -> Vec<tokio::task::JoinHandle<String>> {
    let mut busy = Vec::new();
    for _ in 0..2 {
        let (mut send, _conn) = client(addr).await;
        busy.push(tokio::spawn(
            async move { get_body(&mut send, "/hold").await },
        ));
    }
    hold.arrived
        .acquire_many(2)
        .await
        .expect("both /hold requests arrive")
        .forget();
    busy
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_with_every_connection_busy_a_new_client_is_closed_at_once() {
    let limits = ServeLimits {
        max_connections: 2,
        ..ServeLimits::default()
    };
    let hold = Hold::new();
    let (addr, _stop) = plain(limits, hold.clone()).await;
    let mut busy = two_held(addr, &hold).await;
    // The accept loop does not wait: each new client is closed at once;
    // a handler that takes long is not a stalled write.
    refused(TcpStream::connect(addr).await.expect("connect")).await;
    tokio::time::sleep(WRITE_STALL_TIMEOUT * 2).await;
    refused(TcpStream::connect(addr).await.expect("connect")).await;
    // One request ends: its connection, now idle, gives its place.
    hold.gate.add_permits(1);
    let first = busy.remove(0);
    assert_eq!(first.await.expect("client task"), "held");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut send, _conn) = client(addr).await;
    let body = tokio::time::timeout(DEADLINE, get_body(&mut send, "/ping"))
        .await
        .expect("served once a place is free");
    assert_eq!(body, "pong");
}

#[tokio::test(start_paused = true)]
async fn clients_that_take_no_response_do_not_keep_a_legitimate_client_out() {
    let limits = ServeLimits {
        max_connections: 2,
        ..ServeLimits::default()
    };
    let (addr, _stop) = plain(limits, Hold::new()).await;
    // HTTP/1: asks for an endless response and reads none of it.
    let mut h1 = TcpStream::connect(addr).await.expect("connect");
    h1.write_all(b"GET /big HTTP/1.1\r\nHost: kubelet\r\n\r\n")
        .await
        .expect("write");
    // HTTP/2: a zero stream window, so not even a small body is sent.
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut h2, h2_conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    let h2_conn = tokio::spawn(h2_conn);
    let req = http::Request::get("http://kubelet/ping")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let _unread = h2.send_request(req).await.expect("response head");
    // Both are owed a response: they hold the cap, for now.
    refused(TcpStream::connect(addr).await.expect("connect")).await;
    // Stalled past the write-stall timeout, each gives way to a new client.
    tokio::time::sleep(WRITE_STALL_TIMEOUT + Duration::from_secs(1)).await;
    let mut served = Vec::new();
    for _ in 0..2 {
        let (mut send, conn) = client(addr).await;
        let body = tokio::time::timeout(DEADLINE, get_body(&mut send, "/ping"))
            .await
            .expect("served while stalled clients hold the cap");
        assert_eq!(body, "pong");
        served.push((send, conn));
    }
    closed(&mut h1).await;
    let _ = tokio::time::timeout(DEADLINE, h2_conn)
        .await
        .expect("the HTTP/2 client was closed");
    for (_, conn) in &served {
        assert!(!conn.is_finished(), "served clients keep their connections");
    }
}

#[tokio::test(start_paused = true)]
async fn one_address_holds_at_most_its_share_of_silent_connections() {
    let limits = ServeLimits {
        max_connections: 8,
        max_connections_per_ip: 2,
        ..ServeLimits::default()
    };
    let (addr, _stop) = plain(limits, Hold::new()).await;
    // Two connections without a request fill the share of 127.0.0.1; its
    // next one takes the place of the oldest.
    let mut first = connect_from([127, 0, 0, 1], addr).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut second = connect_from([127, 0, 0, 1], addr).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _third = connect_from([127, 0, 0, 1], addr).await;
    tokio::time::timeout(DEADLINE, closed(&mut first))
        .await
        .expect("the oldest silent connection gave way");
    let mut buf = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_secs(1), second.read(&mut buf))
            .await
            .is_err(),
        "the newer silent connection keeps its place"
    );
    // Another address still gets in.
    let tcp = connect_from([127, 0, 0, 2], addr).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let body = tokio::time::timeout(DEADLINE, get_body(&mut send, "/ping"))
        .await
        .expect("served");
    assert_eq!(body, "pong");
    // At its share, an address's own connection without a request gives
    // way to its next one; its served connection does not count.
    let mut silent = connect_from([127, 0, 0, 2], addr).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _next = connect_from([127, 0, 0, 2], addr).await;
    let _last = connect_from([127, 0, 0, 2], addr).await;
    tokio::time::timeout(DEADLINE, closed(&mut silent))
        .await
        .expect("the silent connection gave way");
    assert!(!send.is_closed(), "the served connection keeps its place");
}

#[tokio::test(start_paused = true)]
async fn an_idle_http2_connection_shed_at_the_cap_gets_a_goaway() {
    let limits = ServeLimits {
        max_connections: 1,
        ..ServeLimits::default()
    };
    let (addr, _stop) = plain(limits, Hold::new()).await;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut h2, h2_conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    let h2_conn = tokio::spawn(h2_conn);
    let req = http::Request::get("http://kubelet/ping")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = h2.send_request(req).await.expect("response");
    resp.into_body().collect().await.expect("body");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut send, _conn) = client(addr).await;
    assert_eq!(get_body(&mut send, "/ping").await, "pong");
    tokio::time::timeout(DEADLINE, h2_conn)
        .await
        .expect("the HTTP/2 connection was closed")
        .expect("client task")
        .expect("closed with a GOAWAY, not cut");
}
