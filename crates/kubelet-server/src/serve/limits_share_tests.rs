//! The per-address share counts only connections that served their client
//! nothing (the apiserver proxies every exec, attach, port-forward and log
//! follow from a few addresses), and write stalls are counted per response,
//! so an HTTP/2 client that takes no response cannot hide its stall behind
//! PINGs the server acknowledges.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::limits::MAX_CONNECTIONS_PER_IP;
use super::limits_tests::{DEADLINE, Hold, closed, connect_from, get_body, plain};
use super::*;

/// Sessions from one address, past its share.
const SESSIONS: usize = 200;
const _: () = assert!(SESSIONS > MAX_CONNECTIONS_PER_IP);

/// An upgraded echo session from `ip`, checked once.
async fn session(ip: [u8; 4], addr: SocketAddr) -> TokioIo<hyper::upgrade::Upgraded> {
    let tcp = connect_from(ip, addr).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn.with_upgrades());
    let req = http::Request::get("/echo")
        .header(http::header::HOST, "kubelet")
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "echo")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("admitted and answered");
    assert_eq!(resp.status(), http::StatusCode::SWITCHING_PROTOCOLS);
    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.expect("upgraded"));
    echoes(&mut io).await;
    io
}

async fn echoes(io: &mut TokioIo<hyper::upgrade::Upgraded>) {
    io.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    tokio::time::timeout(DEADLINE, io.read_exact(&mut buf))
        .await
        .expect("echoed in time")
        .expect("session open");
    assert_eq!(&buf, b"ping");
}

#[tokio::test]
async fn upgraded_sessions_and_requests_in_flight_from_one_address_are_all_kept() {
    // The kubelet's caps; hour-long timeouts, so only shedding closes.
    let limits = ServeLimits {
        header_read_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..ServeLimits::default()
    };
    let hold = Hold::new();
    let (addr, _stop) = plain(limits, hold.clone()).await;
    let apiserver = [127, 0, 0, 1];
    // Half exec-like upgraded sessions, half requests in flight.
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS / 2 {
        sessions.push(session(apiserver, addr).await);
    }
    let mut held = Vec::new();
    for _ in 0..SESSIONS / 2 {
        let tcp = connect_from(apiserver, addr).await;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        held.push(tokio::spawn(
            async move { get_body(&mut send, "/hold").await },
        ));
    }
    tokio::time::timeout(DEADLINE, hold.arrived.acquire_many(SESSIONS as u32 / 2))
        .await
        .expect("every /hold request arrives")
        .expect("semaphore")
        .forget();

    // Another address's silent connections are still held to its share.
    let other = [127, 0, 0, 2];
    let mut silent = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_IP {
        silent.push(connect_from(other, addr).await);
    }
    let _next = connect_from(other, addr).await;
    tokio::time::timeout(DEADLINE, closed(&mut silent[0]))
        .await
        .expect("the oldest silent connection gave way");
    let mut buf = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(200), silent[1].read(&mut buf))
            .await
            .is_err(),
        "the other silent connections keep their places"
    );

    // Every session and request of the first address is still served.
    for io in &mut sessions {
        echoes(io).await;
    }
    hold.gate.add_permits(SESSIONS);
    for h in held {
        let body = tokio::time::timeout(DEADLINE, h)
            .await
            .expect("answered in time")
            .expect("client task");
        assert_eq!(body, "held");
    }
}

/// A client socket that counts the bytes it reads.
struct Counting {
    io: TcpStream,
    read: Arc<AtomicUsize>,
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.io).poll_read(cx, buf);
        self.read
            .fetch_add(buf.filled().len() - before, Ordering::Relaxed);
        res
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Short stall and write timeouts, on real time: the client's PINGs and
/// their acknowledgements must flow while the clocks run.
const STALL: Duration = Duration::from_secs(2);
const CUT: Duration = Duration::from_secs(4);
const PING: Duration = Duration::from_millis(250);

/// An HTTP/2 client that announces a zero stream window and PINGs every
/// [`PING`], with one response it never takes; returns the bytes it has
/// read from the server so far and its connection task.
async fn pinging_zero_window_client(
    addr: SocketAddr,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let read = Arc::new(AtomicUsize::new(0));
    let io = Counting {
        io: TcpStream::connect(addr).await.expect("connect"),
        read: read.clone(),
    };
    let (mut h2, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(0)
        .keep_alive_interval(PING)
        .keep_alive_timeout(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(io))
        .await
        .expect("h2 handshake");
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get("http://kubelet/ping")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = h2.send_request(req).await.expect("response head");
    // Kept unread (and the sender with it) as long as the connection.
    tokio::spawn(async move {
        let _keep = (h2, resp);
        std::future::pending::<()>().await;
    });
    (read, conn)
}

/// `GET /ping` on a new connection; `None` when the server closed it (at
/// the cap with no connection to give way).
async fn try_ping(addr: SocketAddr) -> Option<String> {
    use http_body_util::BodyExt;
    let tcp = TcpStream::connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get("/ping")
        .header(http::header::HOST, "kubelet")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let resp = send.send_request(req).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn an_http2_client_that_takes_no_response_is_sheddable_despite_its_pings() {
    let limits = ServeLimits {
        max_connections: 1,
        write_stall_timeout: STALL,
        ..ServeLimits::default()
    };
    let (addr, _stop) = plain(limits, Hold::new()).await;
    let (read, h2_conn) = pinging_zero_window_client(addr).await;
    let before = read.load(Ordering::Relaxed);
    tokio::time::sleep(STALL + Duration::from_secs(1)).await;
    assert!(
        read.load(Ordering::Relaxed) > before,
        "the server acknowledged the client's PINGs"
    );
    assert!(
        !h2_conn.is_finished(),
        "the PINGs kept the connection alive"
    );
    // Its response made no progress: once stalled for the stall timeout it
    // gives its place to a new client (asked again until then: a busy
    // machine may hand the response over late, which starts its clock late).
    let served = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Ok(Some(body)) =
                tokio::time::timeout(Duration::from_secs(1), try_ping(addr)).await
            {
                break body;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
    .expect("served in the stalled connection's place");
    assert_eq!(served, "pong");
    tokio::time::timeout(DEADLINE, h2_conn)
        .await
        .expect("the stalled HTTP/2 connection was closed")
        .expect("client task");
}

#[tokio::test]
async fn an_http2_client_that_takes_no_response_is_cut_at_the_write_timeout_despite_its_pings() {
    let limits = ServeLimits {
        write_stall_timeout: STALL,
        write_timeout: CUT,
        ..ServeLimits::default()
    };
    let (addr, _stop) = plain(limits, Hold::new()).await;
    let start = Instant::now();
    let (read, h2_conn) = pinging_zero_window_client(addr).await;
    let before = read.load(Ordering::Relaxed);
    tokio::time::timeout(CUT + DEADLINE, h2_conn)
        .await
        .expect("the stalled HTTP/2 connection was cut")
        .expect("client task");
    assert!(
        read.load(Ordering::Relaxed) > before,
        "the server acknowledged the client's PINGs"
    );
    assert!(
        Instant::now() - start >= CUT,
        "cut no sooner than the write timeout"
    );
}
