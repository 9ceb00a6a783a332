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
//! (Go's `IdleTimeout` then `ReadHeaderTimeout`). A response the client
//! does not take (it reads nothing, or announces a zero HTTP/2 window) is a
//! write stall. Progress is counted per response, never at the socket (so
//! PING or SETTINGS acknowledgements and other streams' data do not hide
//! a stalled HTTP/2 stream): a response makes progress when its body yields
//! a frame, which hyper asks for only once the frame before it found room
//! (HTTP/2 flow-control capacity, or space in the HTTP/1 write buffer). A
//! response's clock runs while it is owed to the client, not while its
//! body waits on its source (a quiet log follow). A connection one of whose
//! responses is stalled for the write-stall timeout may be shed; it is cut
//! once a response has made no progress for the write timeout and no other
//! response on it has either (a stream stuck behind its window does not
//! cut busy siblings). This is "no progress for 10 min", unlike upstream's
//! `WriteTimeout` (4 h from the request, progress or not). At the cap, a
//! new client takes the place of a connection that never sent a request,
//! else of the one stalled longest, else of the one idle longest; with no
//! such connection the new client is closed at once, and the accept loop
//! never waits. One address holds at most `max_connections_per_ip` places
//! that served it nothing (connections before their first request head,
//! and stalled ones); past that, its oldest such connection gives way. Its
//! upgraded sessions, requests in flight and kept-alive connections do not
//! count, since nearly all proxied traffic (exec, attach, port-forward,
//! log follows) comes from the apiserver's few addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
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
/// Open connections per port from one address that served it nothing:
/// before their first request head, or stalled on a write.
pub const MAX_CONNECTIONS_PER_IP: usize = MAX_CONNECTIONS / 8;
/// How long a response may go without write progress before its
/// connection may give its place to a new client.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a response may go without write progress before its
/// connection is cut.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(600);

/// hyper refuses a smaller HTTP/1 read buffer.
const MIN_BUF_SIZE: usize = 8192;
/// The highest shed rank that counts against an address's share: never
/// served (0) or stalled (1).
const UNSERVED_RANK: u8 = 1;

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
    /// Open connections from one address at most, among those before
    /// their first request head or stalled on a write.
    pub max_connections_per_ip: usize,
    /// Write stall after which a connection may be shed at the cap.
    pub write_stall_timeout: Duration,
    /// Write stall after which a connection is cut (no progress, not an
    /// absolute bound).
    pub write_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_header_bytes: MAX_HEADER_BYTES,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_ip: MAX_CONNECTIONS_PER_IP,
            write_stall_timeout: WRITE_STALL_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
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
    /// Responses handed to hyper whose bodies are not waiting on their
    /// source (the client owes us progress), by request: since when each
    /// has made no progress (its last frame, or when it became owed).
    owed: HashMap<u64, Instant>,
    /// The id of the next request.
    next_request: u64,
    /// The last frame any response body yielded (the start, at first).
    last_frame: Instant,
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
                owed: HashMap::new(),
                next_request: 0,
                last_frame: Instant::now(),
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
        let id = s.next_request;
        s.next_request += 1;
        drop(s);
        self.changed.notify_one();
        RequestGuard {
            conn: self.clone(),
            id,
            owed: false,
        }
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

    /// Response `id` starts or stops being owed to the client.
    fn owe(&self, id: u64, owed: bool) {
        let mut s = self.state.lock();
        if owed {
            s.owed.insert(id, Instant::now());
            drop(s);
            self.changed.notify_one();
        } else {
            s.owed.remove(&id);
        }
    }

    /// Response `id`, owed to the client, yielded a frame.
    fn progress(&self, id: u64) {
        let now = Instant::now();
        let mut s = self.state.lock();
        let first = s.owed.insert(id, now).is_none();
        s.last_frame = now;
        drop(s);
        if first {
            self.changed.notify_one();
        }
    }

    /// Since when the longest stalled response owed to the client has made
    /// no progress.
    fn stalled_since(s: &State) -> Option<Instant> {
        if s.in_flight == 0 || s.upgraded {
            return None;
        }
        s.owed.values().min().copied()
    }

    /// When the connection is cut: unless a request arrives, while none is
    /// in flight; unless a response makes progress, while one is owed (any
    /// response's frame counts, so a stream stuck behind its window does
    /// not cut siblings that make progress); `None` otherwise and once the
    /// connection was upgraded.
    pub(crate) fn deadline(&self, limits: &ServeLimits) -> Option<Instant> {
        let s = self.state.lock();
        if let Some(since) = Self::stalled_since(&s) {
            return Some(since.max(s.last_frame) + limits.write_timeout);
        }
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

    /// The order in which connections give their place (lowest first):
    /// never-served connections (0), then ones with a response stalled past
    /// `stall` (1), then kept-alive idle ones (2), each oldest first; `None`
    /// for the rest (busy, upgraded, or already shed).
    fn shed_rank(&self, stall: Duration, now: Instant) -> Option<(u8, Instant)> {
        if self.shed.is_cancelled() {
            return None;
        }
        let s = self.state.lock();
        if s.upgraded {
            return None;
        }
        if s.in_flight == 0 {
            return Some((if s.served { 2 } else { 0 }, s.idle_since));
        }
        Self::stalled_since(&s)
            .filter(|since| now.saturating_duration_since(*since) >= stall)
            .map(|since| (1, since))
    }
}

/// Ends a request when dropped (with its response body), and tells the
/// connection whether its response is owed to the client.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    conn: Arc<Conn>,
    id: u64,
    owed: bool,
}

impl RequestGuard {
    fn owe(&mut self, owed: bool) {
        if self.owed != owed {
            self.owed = owed;
            self.conn.owe(self.id, owed);
        }
    }

    /// The response yielded a frame: it is owed, and made progress now.
    fn progress(&mut self) {
        self.owed = true;
        self.conn.progress(self.id);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.owe(false);
        self.conn.end();
    }
}

/// The open connections of one listener.
#[derive(Debug)]
pub(crate) struct ConnTable {
    limits: ServeLimits,
    conns: Mutex<Conns>,
}

#[derive(Debug, Default)]
struct Conns {
    next: u64,
    by_id: HashMap<u64, (IpAddr, Arc<Conn>)>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Conns {
    fn remove(&mut self, id: u64) {
        if let Some((ip, _)) = self.by_id.remove(&id)
            && let Some(n) = self.per_ip.get_mut(&ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }

    /// The ranks of the sheddable connections, of `ip` only if given.
    fn ranks(
        &self,
        ip: Option<IpAddr>,
        stall: Duration,
        now: Instant,
    ) -> impl Iterator<Item = ((u8, Instant), u64)> + '_ {
        self.by_id
            .iter()
            .filter(move |(_, (at, _))| ip.is_none_or(|ip| ip == *at))
            .filter_map(move |(id, (_, c))| c.shed_rank(stall, now).map(|r| (r, *id)))
    }

    /// The most sheddable connection of rank `max_rank` at most, among
    /// those of `ip` if given.
    fn victim(&self, ip: Option<IpAddr>, max_rank: u8, stall: Duration) -> Option<u64> {
        self.ranks(ip, stall, Instant::now())
            .filter(|((rank, _), _)| *rank <= max_rank)
            .min()
            .map(|(_, id)| id)
    }

    /// The connections of `ip` that count against its share: before their
    /// first request head, or stalled (ranks 0 and 1).
    fn unserved_of(&self, ip: IpAddr, stall: Duration) -> usize {
        self.ranks(Some(ip), stall, Instant::now())
            .filter(|((rank, _), _)| *rank <= UNSERVED_RANK)
            .count()
    }
}

impl ConnTable {
    pub(crate) fn new(limits: ServeLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            conns: Mutex::new(Conns::default()),
        })
    }

    /// A place for a new connection from `ip`, never waiting: at once
    /// below the caps; else in the place of the most sheddable connection
    /// (of `ip`'s unserved or stalled ones, when it is `ip`'s share that is
    /// reached), which is told to close and no longer counts; `None` when
    /// no connection can give way.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut c = self.conns.lock();
        let stall = self.limits.write_stall_timeout;
        let share = self.limits.max_connections_per_ip.max(1);
        // All of `ip`'s connections bound those that count, cheaply.
        let of_ip = c.per_ip.get(&ip).copied().unwrap_or(0);
        if of_ip >= share && c.unserved_of(ip, stall) >= share {
            let id = c.victim(Some(ip), UNSERVED_RANK, stall)?;
            self.shed(&mut c, id);
        } else if c.by_id.len() >= self.limits.max_connections.max(1) {
            let id = c.victim(None, u8::MAX, stall)?;
            self.shed(&mut c, id);
        }
        let id = c.next;
        c.next += 1;
        let conn = Arc::new(Conn::new());
        c.by_id.insert(id, (ip, conn.clone()));
        *c.per_ip.entry(ip).or_insert(0) += 1;
        Some(Slot {
            table: self.clone(),
            id,
            conn,
        })
    }

    fn shed(&self, c: &mut Conns, id: u64) {
        if let Some((_, victim)) = c.by_id.get(&id) {
            tracing::debug!("connection limit reached: closing an idle or stalled connection");
            victim.shed.cancel();
        }
        c.remove(id);
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
        self.table.conns.lock().remove(self.id);
    }
}

/// A connection's socket holding its [`Slot`]: the place is held as long
/// as the socket, through an upgrade, and bytes read restart the header
/// clock of an idle connection. Writes are not progress here: a response
/// makes progress when its body yields a frame ([`guarded`]).
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
/// abandoned with its connection). From its hand-over the response is owed
/// to the client, except while the body waits on its source; it makes
/// progress with each frame it yields, which hyper asks for only when the
/// frame before found room (h2 flow-control capacity, h1 buffer space), so
/// a client that takes nothing stops the frames and stalls the response.
pub(crate) fn guarded(body: axum::body::Body, mut guard: RequestGuard) -> axum::body::Body {
    guard.owe(true);
    axum::body::Body::new(Guarded { body, guard })
}

struct Guarded {
    body: axum::body::Body,
    guard: RequestGuard,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let res = Pin::new(&mut self.body).poll_frame(cx);
        match &res {
            // The body waits on its source, not on the client.
            Poll::Pending => self.guard.owe(false),
            Poll::Ready(Some(_)) => self.guard.progress(),
            Poll::Ready(None) => self.guard.owe(true),
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
