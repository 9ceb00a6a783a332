//! The listeners' limits against misbehaving clients: a client that
//! trickles its request head or sends nothing is cut at the header timeout,
//! a kept-alive connection waits the idle timeout, the TLS handshake has
//! its deadline, and the connection cap holds while new clients are served.
//! Timeouts run on paused time; the shedding test sets hour-long timeouts,
//! so only shedding can free a place.

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

use super::limits::{HEADER_READ_TIMEOUT, IDLE_TIMEOUT};
use super::*;

const DEADLINE: Duration = Duration::from_secs(10);
/// Longer than any deadline of the default limits.
const LONG: Duration = Duration::from_secs(600);

fn router(hold: Arc<Semaphore>) -> Router {
    Router::new()
        .route("/ping", get(|| async { "pong" }))
        .route(
            "/hold",
            get(move || {
                let hold = hold.clone();
                async move {
                    let _permit = hold.acquire().await;
                    "held"
                }
            }),
        )
}

async fn plain(limits: ServeLimits, hold: Arc<Semaphore>) -> (SocketAddr, CancellationToken) {
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
async fn closed(s: &mut TcpStream) -> Instant {
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

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// An HTTP/1.1 client connection; the task ends when the server closes it.
async fn client(addr: SocketAddr) -> (Sender, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

async fn get_body(send: &mut Sender, path: &str) -> String {
    let req = http::Request::get(path)
        .header(http::header::HOST, "kubelet")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

fn assert_near(elapsed: Duration, expected: Duration) {
    assert!(
        elapsed >= expected.saturating_sub(Duration::from_secs(1))
            && elapsed <= expected + Duration::from_secs(1),
        "closed after {elapsed:?}, expected {expected:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_trickling_client_is_cut_off_at_the_header_timeout() {
    let (addr, _stop) = plain(ServeLimits::default(), Arc::new(Semaphore::new(0))).await;
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
    let (addr, _stop) = plain(ServeLimits::default(), Arc::new(Semaphore::new(0))).await;
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
        router(Arc::new(Semaphore::new(0))),
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
    let (addr, _stop) = plain(limits, Arc::new(Semaphore::new(0))).await;
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

#[tokio::test(start_paused = true)]
async fn at_the_cap_with_every_connection_busy_a_new_client_waits_for_a_place() {
    let limits = ServeLimits {
        max_connections: 2,
        ..ServeLimits::default()
    };
    let hold = Arc::new(Semaphore::new(0));
    let (addr, _stop) = plain(limits, hold.clone()).await;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let (mut send, conn) = client(addr).await;
        busy.push((
            tokio::spawn(async move { get_body(&mut send, "/hold").await }),
            conn,
        ));
    }
    tokio::task::yield_now().await;
    let (mut send, _conn) = client(addr).await;
    let third = get_body(&mut send, "/ping");
    tokio::pin!(third);
    assert!(
        tokio::time::timeout(IDLE_TIMEOUT * 2, third.as_mut())
            .await
            .is_err(),
        "a third connection is not served while two requests hold the cap"
    );
    // One request ends: its connection, now idle, gives its place.
    hold.add_permits(1);
    let body = tokio::time::timeout(DEADLINE, third)
        .await
        .expect("served once a place is free");
    assert_eq!(body, "pong");
}
