//! What the node API's listeners allow a client (upstream: the `http.Server`
//! of `ListenAndServeKubeletServer` and `ListenAndServeKubeletReadOnlyServer`
//! in `pkg/kubelet/server/server.go`, with `IdleTimeout` 90 s and
//! `MaxHeaderBytes` 1 MiB, and Go's header-read and idle deadlines), plus a
//! cap on open connections per port, which upstream leaves to the OS.
//!
//! Each connection is tracked from `accept` to the drop of its socket, so an
//! upgraded exec, attach or port-forward session keeps its place. The
//! connection's clock: a new connection must bring a request head within
//! the header timeout; a kept-alive one may wait the idle timeout for its
//! next request, then has the header timeout from that request's first byte
//! (Go's `IdleTimeout` then `ReadHeaderTimeout`). At the cap, a new client
//! takes the place of the oldest connection that has no request in flight,
//! one that never sent a request first; only when every connection is busy
//! does the new client wait for a place.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to send a request head, from the connection's
/// start (after the TLS handshake) or from the first byte of a kept-alive
/// connection's next request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kept-alive connection may wait for its next request
/// (upstream `IdleTimeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The largest request head (upstream `MaxHeaderBytes`).
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// Open connections per port, upgraded sessions included.
pub const MAX_CONNECTIONS: usize = 1024;

/// hyper refuses a smaller HTTP/1 read buffer.
const MIN_BUF_SIZE: usize = 8192;

/// The limits of one listener; [`Default`] holds the kubelet's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// TLS handshake deadline.
    pub handshake_timeout: Duration,
    /// Request-head deadline.
    pub header_read_timeout: Duration,
    /// Keep-alive idle deadline.
    pub idle_timeout: Duration,
    /// Largest request head, in bytes.
    pub max_header_bytes: usize,
    /// Open connections at most.
    pub max_connections: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_header_bytes: MAX_HEADER_BYTES,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

impl ServeLimits {
    /// hyper's HTTP/1 read buffer, which bounds a request head.
    pub(crate) fn h1_buf_size(&self) -> usize {
        self.max_header_bytes.max(MIN_BUF_SIZE)
    }

    /// hyper's own HTTP/1 header timer, a backstop behind the connection's
    /// clock: it starts when hyper waits for a head, idle time included.
    pub(crate) fn h1_header_backstop(&self) -> Duration {
        self.idle_timeout + self.header_read_timeout
    }

    /// The HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`.
    pub(crate) fn h2_header_list_size(&self) -> u32 {
        u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX)
    }
}

/// The state of one connection, shared by its task, its socket and its
/// requests.
#[derive(Debug)]
pub(crate) struct Conn {
    state: Mutex<State>,
    /// Rung when the deadline may have moved.
    pub(crate) changed: Notify,
    /// Cancelled when the connection gives its place to a new client.
    pub(crate) shed: CancellationToken,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// A request was received (its head complete).
    served: bool,
    /// The connection speaks HTTP/2.
    h2: bool,
    /// Handed to an upgraded session: no longer HTTP.
    upgraded: bool,
    /// Since when no request is in flight (the start, at first).
    idle_since: Instant,
    /// The first byte read since then.
    first_byte: Option<Instant>,
}

impl Conn {
    fn new() -> Self {
        Self {
            state: Mutex::new(State {
                in_flight: 0,
                served: false,
                h2: false,
                upgraded: false,
                idle_since: Instant::now(),
                first_byte: None,
            }),
            changed: Notify::new(),
            shed: CancellationToken::new(),
        }
    }

    /// Restarts the clock: the connection's HTTP starts now (after the TLS
    /// handshake).
    pub(crate) fn restart(&self) {
        let mut s = self.state.lock();
        s.idle_since = Instant::now();
        s.first_byte = None;
    }

    /// A request arrived; the guard ends it when its response is sent.
    pub(crate) fn begin(self: &Arc<Self>, version: http::Version) -> RequestGuard {
        let mut s = self.state.lock();
        s.in_flight += 1;
        s.served = true;
        s.h2 |= version == http::Version::HTTP_2;
        drop(s);
        self.changed.notify_one();
        RequestGuard(self.clone())
    }

    /// The connection was upgraded: its session has no HTTP deadline.
    pub(crate) fn upgraded(&self) {
        self.state.lock().upgraded = true;
        self.changed.notify_one();
    }

    fn end(&self) {
        let mut s = self.state.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.idle_since = Instant::now();
            s.first_byte = None;
        }
        drop(s);
        self.changed.notify_one();
    }

    fn read(&self) {
        let mut s = self.state.lock();
        if s.in_flight == 0 && s.first_byte.is_none() {
            s.first_byte = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    /// When the connection is cut unless a request arrives; `None` while a
    /// request is in flight or the connection was upgraded.
    pub(crate) fn deadline(&self, limits: &ServeLimits) -> Option<Instant> {
        let s = self.state.lock();
        if s.in_flight > 0 || s.upgraded {
            return None;
        }
        if !s.served {
            return Some(s.idle_since + limits.header_read_timeout);
        }
        match s.first_byte {
            Some(at) if !s.h2 => Some(at + limits.header_read_timeout),
            _ => Some(s.idle_since + limits.idle_timeout),
        }
    }

    /// Whether the connection is idle over HTTP/2 after requests (it is
    /// then closed with a GOAWAY rather than dropped).
    pub(crate) fn idle_h2(&self) -> bool {
        let s = self.state.lock();
        s.h2 && s.served && s.in_flight == 0
    }

    /// The order in which connections give their place: `None` when busy,
    /// else never-served connections before kept-alive ones, oldest first.
    fn shed_rank(&self) -> Option<(bool, Instant)> {
        let s = self.state.lock();
        (s.in_flight == 0 && !s.upgraded && !self.shed.is_cancelled())
            .then_some((s.served, s.idle_since))
    }
}

/// Ends a request when dropped (with its response body).
#[derive(Debug)]
pub(crate) struct RequestGuard(Arc<Conn>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The open connections of one listener.
#[derive(Debug)]
pub(crate) struct ConnTable {
    max: usize,
    conns: Mutex<(u64, HashMap<u64, Arc<Conn>>)>,
    freed: Notify,
}

impl ConnTable {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            conns: Mutex::new((0, HashMap::new())),
            freed: Notify::new(),
        })
    }

    /// A place for a new connection: at once below the cap; else after the
    /// most sheddable connection gave its place; else once one ends.
    /// `None` when `stop` fires first.
    pub(crate) async fn admit(self: &Arc<Self>, stop: &CancellationToken) -> Option<Slot> {
        loop {
            let victim = {
                let mut guard = self.conns.lock();
                let (next, conns) = &mut *guard;
                if conns.len() < self.max {
                    let id = *next;
                    *next += 1;
                    let conn = Arc::new(Conn::new());
                    conns.insert(id, conn.clone());
                    return Some(Slot {
                        table: self.clone(),
                        id,
                        conn,
                    });
                }
                conns
                    .values()
                    .filter_map(|c| c.shed_rank().map(|r| (r, c.clone())))
                    .min_by_key(|(r, _)| *r)
                    .map(|(_, c)| c)
            };
            if let Some(victim) = victim {
                tracing::debug!("connection limit reached: closing an idle connection");
                victim.shed.cancel();
            }
            // A connection that becomes idle can be shed: look again now
            // and then, not only when one ends.
            tokio::select! {
                () = stop.cancelled() => return None,
                () = self.freed.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// A connection's place in its [`ConnTable`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    table: Arc<ConnTable>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.conns.lock().1.remove(&self.id);
        self.table.freed.notify_one();
    }
}

/// A connection's socket holding its [`Slot`]: the place is held as long
/// as the socket, through an upgrade, and bytes read restart the header
/// clock of an idle connection.
#[derive(Debug)]
pub(crate) struct TrackedIo<S> {
    io: S,
    slot: Slot,
}

impl<S> TrackedIo<S> {
    pub(crate) fn new(io: S, slot: Slot) -> Self {
        Self { io, slot }
    }

    pub(crate) fn conn(&self) -> Arc<Conn> {
        self.slot.conn.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.slot.conn.read();
        }
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedIo<S> {
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

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A response body that ends its request when it is dropped (sent, or
/// abandoned with its connection).
pub(crate) fn guarded(body: axum::body::Body, guard: RequestGuard) -> axum::body::Body {
    axum::body::Body::new(body.map_frame(move |frame: hyper::body::Frame<Bytes>| {
        let _held = &guard;
        frame
    }))
}
