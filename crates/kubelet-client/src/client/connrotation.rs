//! Closing every connection of a client at once (upstream client-go
//! `util/connrotation`, the kubelet's `closeAllConns`, run as
//! `OnHeartbeatFailure` when node status or lease updates fail repeatedly).
//!
//! A connection whose peer vanished without closing it (an apiserver behind
//! a load balancer that dropped its state, a network that lost a route) looks
//! healthy to the client: HTTP/1.1 has no ping, so a request sent on it, or a
//! watch reading from it, waits until its deadline, and the pool keeps handing
//! out its idle siblings, each costing a deadline more once the apiserver is
//! back. Upstream's heartbeats detect this and close every connection the
//! client's dialer made, in use or idle, so every request in flight fails at
//! once and the next ones dial fresh connections. [`Connections::close_all`]
//! does the same: each connection the client makes is a [`Closable`] tied to
//! the current generation, and closing cancels that generation; the client's
//! pool is replaced too ([`Connections::generation`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use parking_lot::Mutex;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower::{BoxError, Service, ServiceExt};
use tracing::debug;

/// The connections a client made, closable together.
#[derive(Debug, Default)]
pub struct Connections {
    current: Mutex<CancellationToken>,
    generation: AtomicU64,
}

impl Connections {
    /// A fresh set: nothing to close yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Closes every connection made so far (upstream `closeAllConns`):
    /// requests in flight on them fail at once, idle ones leave the pool, and
    /// later requests dial new connections.
    pub fn close_all(&self) {
        let old = std::mem::take(&mut *self.current.lock());
        self.generation.fetch_add(1, Ordering::Relaxed);
        old.cancel();
        // Each failed heartbeat try during an outage closes again: not news.
        debug!("Closed all apiserver connections after repeated heartbeat failures");
    }

    /// How many times [`Connections::close_all`] ran: a client builds a new
    /// connection pool when it changes.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Wraps a new connection into the current generation.
    pub fn track<T>(&self, io: T) -> Closable<T> {
        Closable::new(io, self.current.lock().clone())
    }

    /// Dials through `connect` in the current generation: closing it fails
    /// the dial too (a TLS handshake the peer never answers), and the
    /// connection made is tracked.
    pub async fn dial<T, E>(
        &self,
        connect: impl Future<Output = Result<T, E>>,
    ) -> Result<Closable<T>, BoxError>
    where
        E: Into<BoxError>,
    {
        let token = self.current.lock().clone();
        tokio::select! {
            io = connect => Ok(Closable::new(io.map_err(Into::into)?, token)),
            () = token.cancelled() => Err(Box::new(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "apiserver connection closed while dialing, after repeated heartbeat failures",
            ))),
        }
    }
}

/// A connection being dialed: TCP, TLS, then tracked.
pub type ConnectFuture<T> = Pin<Box<dyn Future<Output = Result<Closable<T>, BoxError>> + Send>>;

/// `https` with every connection it makes dialed and tracked in `connections`
/// (upstream connrotation's `Dialer`).
pub fn connector<S>(
    https: S,
    connections: Arc<Connections>,
) -> impl Service<
    Uri,
    Response = Closable<S::Response>,
    Error = BoxError,
    Future = ConnectFuture<S::Response>,
> + Clone
+ Send
+ Sync
+ 'static
where
    S: Service<Uri> + Clone + Send + Sync + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    tower::service_fn(move |uri: Uri| {
        let https = https.clone();
        let connections = connections.clone();
        let connect: ConnectFuture<S::Response> =
            Box::pin(async move { connections.dial(https.oneshot(uri)).await });
        connect
    })
}

/// A connection that fails every read and write once its generation is
/// closed (upstream connrotation's `closableConn`).
pub struct Closable<T> {
    inner: T,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    done: bool,
}

impl<T> Closable<T> {
    /// `inner`, closed when `token` is cancelled.
    pub fn new(inner: T, token: CancellationToken) -> Self {
        Self {
            inner,
            closed: Box::pin(token.cancelled_owned()),
            done: false,
        }
    }

    /// An error once closed; otherwise registers the task to be woken when
    /// it is.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.done && self.closed.as_mut().poll(cx).is_ready() {
            self.done = true;
        }
        if self.done {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "apiserver connection closed after repeated heartbeat failures",
            ));
        }
        Ok(())
    }
}

impl<T: Read + Unpin> Read for Closable<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Closable<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for Closable<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    #[tokio::test(start_paused = true)]
    async fn closing_fails_a_read_in_flight_and_later_writes_but_not_new_connections() {
        let conns = Connections::new();
        let (ours, mut peer) = duplex(64);
        let mut old = TokioIo::new(conns.track(TokioIo::new(ours)));
        // A read waiting on a peer that never answers.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let r = old.read(&mut buf).await;
            (r, old)
        });
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(!reader.is_finished(), "waits while the generation is open");
        assert_eq!(conns.generation(), 0);
        conns.close_all();
        let (r, mut old) = reader.await.expect("reader");
        assert_eq!(
            r.expect_err("aborted").kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert!(old.write_all(b"x").await.is_err(), "stays closed");
        assert_eq!(conns.generation(), 1);

        // A dial the peer never completes fails once closed.
        let dial = {
            let conns = std::sync::Arc::new(Connections::new());
            let c = conns.clone();
            let task = tokio::spawn(async move {
                c.dial(std::future::pending::<Result<(), io::Error>>())
                    .await
                    .map(|_| ())
            });
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            assert!(!task.is_finished(), "dialing");
            conns.close_all();
            task.await.expect("dial task")
        };
        assert!(dial.is_err(), "the dial was aborted");

        let (fresh, mut peer2) = duplex(64);
        let mut fresh = TokioIo::new(conns.track(TokioIo::new(fresh)));
        fresh
            .write_all(b"ping")
            .await
            .expect("a new connection works");
        let mut buf = [0u8; 4];
        peer2.read_exact(&mut buf).await.expect("peer reads");
        assert_eq!(&buf, b"ping");
        peer.write_all(b"late").await.ok();
    }

    /// The kubelet's client against a half-open apiserver: a request on a
    /// connection that is never answered fails as soon as the connections
    /// are closed, not at its deadline, and once the apiserver answers
    /// again the next request works although the old connections stay dead.
    #[tokio::test(start_paused = true)]
    async fn closing_fails_requests_stuck_on_a_half_open_apiserver_at_once() {
        use crate::client::{ClientOptions, DEFAULT_REQUEST_TIMEOUT, from_kubeconfig_with};
        use k8s_openapi::api::core::v1::Node;
        use kube::Api;
        let c = kubelet_test_util::Cluster::start(Default::default()).await;
        let path = c.dir.path().join("n1-kubelet.conf");
        c.api
            .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
            .expect("kubeconfig");
        let conns = Arc::new(Connections::new());
        let options = ClientOptions::new(50.0, 100).with_connections(conns.clone());
        let (client, _) = from_kubeconfig_with(&path, options).await.expect("client");
        let nodes: Api<Node> = Api::all(client);
        assert!(nodes.get_opt("n1").await.is_ok(), "a pooled connection");

        c.api.set_half_open(true);
        let stuck = {
            let nodes = nodes.clone();
            tokio::spawn(async move { nodes.get_opt("n1").await })
        };
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(!stuck.is_finished(), "no answer on the pooled connection");
        let closed_at = tokio::time::Instant::now();
        conns.close_all();
        let r = stuck.await.expect("request task");
        assert!(r.is_err(), "{r:?}");
        assert!(
            closed_at.elapsed() < std::time::Duration::from_secs(1),
            "failed on closing, not at the deadline ({DEFAULT_REQUEST_TIMEOUT:?}): {:?}",
            closed_at.elapsed()
        );
        assert!(c.api.held_connections() > 0);

        c.api.set_half_open(false);
        let started = tokio::time::Instant::now();
        assert!(nodes.get_opt("n1").await.is_ok(), "a fresh connection");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
