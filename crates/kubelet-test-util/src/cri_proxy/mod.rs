//! A fault-injecting CRI proxy for tests (issue 20): a tonic server on a
//! unix socket serving CRI `runtime.v1` `RuntimeService` and `ImageService`,
//! forwarding every call to a backend runtime (the real containerd, or a
//! fake), and applying fault rules per method and per pod: delay, hang until
//! released, fail with a gRPC code, drop the client's connection, answer
//! stale or edited data. It counts calls per method.
//!
//! Upstream has no such proxy; its node e2e tests break containerd itself.
//! The faults here are those of upstream's PLEG issues
//! (kubernetes/kubernetes#94829, #93886, #45419): one pod's runtime calls
//! hanging must not stall the node.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubelet_test_util::cri_proxy::CriProxyError> {
//! use kubelet_test_util::cri_proxy::{Action, CriProxy, PodSelector, Rule};
//! let proxy = CriProxy::start("/tmp/proxy.sock", "unix:///run/containerd/containerd.sock").await?;
//! let hang = proxy.add_rule(
//!     Rule::new(Action::Hang)
//!         .methods(&["ContainerStatus", "StopContainer"])
//!         .pod(PodSelector::Label("fault".into(), "hang".into())),
//! );
//! // ... run a kubelet against proxy.endpoint() ...
//! hang.release();
//! proxy.shutdown().await;
//! # Ok(()) }
//! ```

mod pods;
mod rules;
mod service;
#[cfg(test)]
mod tests;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cri::pb::image_service_server::ImageServiceServer;
use cri::pb::runtime_service_server::RuntimeServiceServer;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};

pub use rules::{Action, EditFn, PodSelector, Rule, RuleHandle};

use service::{Proxy, Shared};

/// How long the proxy waits for the backend on one forwarded call (the
/// client's own deadline usually ends the call first).
pub const BACKEND_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors starting the proxy.
#[derive(Debug, thiserror::Error)]
pub enum CriProxyError {
    /// The backend endpoint is not a unix socket address.
    #[error("backend endpoint {endpoint:?}: {reason}")]
    Backend {
        /// The endpoint given.
        endpoint: String,
        /// Why it is refused.
        reason: String,
    },
    /// The proxy's socket could not be bound.
    #[error("binding the proxy socket {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A running proxy; shut down on drop (held calls are dropped with it).
pub struct CriProxy {
    shared: Arc<Shared>,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

fn backend_channel(endpoint: &str) -> Result<Channel, CriProxyError> {
    let path = cri::endpoint_path(endpoint).map_err(|e| CriProxyError::Backend {
        endpoint: endpoint.to_string(),
        reason: e.to_string(),
    })?;
    // The authority is ignored by the connector; tonic needs some URI.
    let ep = Endpoint::from_static("http://[::]:50051").connect_timeout(Duration::from_secs(5));
    Ok(
        ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        })),
    )
}

impl CriProxy {
    /// Binds `socket` (a path; an old socket file there is replaced) and
    /// forwards to `backend` (`unix:///...` or an absolute socket path),
    /// connecting lazily, so a backend that is down shows as `Unavailable`.
    pub async fn start(socket: impl AsRef<Path>, backend: &str) -> Result<Self, CriProxyError> {
        let socket = socket.as_ref().to_path_buf();
        let channel = backend_channel(backend)?;
        let _ = tokio::fs::remove_file(&socket).await;
        let listener = UnixListener::bind(&socket).map_err(|source| CriProxyError::Bind {
            path: socket.clone(),
            source,
        })?;
        let shared = Arc::new(Shared::new(channel, BACKEND_TIMEOUT));
        let conns = shared.clone();
        let incoming = UnixListenerStream::new(listener).map(move |accepted| {
            let stream = accepted?;
            // A duplicate of the socket lets `DropConnection` shut it down
            // under the server's feet.
            match stream.as_fd().try_clone_to_owned() {
                Ok(fd) => conns.conns.lock().push(fd.into()),
                Err(e) => tracing::warn!(error = %e, "CRI proxy: cannot track a connection"),
            }
            Ok::<_, std::io::Error>(stream)
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let proxy = Proxy(shared.clone());
        let task = tokio::spawn(async move {
            let served = Server::builder()
                .add_service(RuntimeServiceServer::new(proxy.clone()))
                .add_service(ImageServiceServer::new(proxy))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "CRI proxy: server ended");
            }
        });
        tracing::info!(socket = %socket.display(), backend, "CRI proxy: serving");
        Ok(Self {
            shared,
            socket,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The proxy's CRI endpoint, `unix://<socket>`, for
    /// `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Installs `rule` after the rules already there (the first matching
    /// rule applies to a call).
    pub fn add_rule(&self, rule: Rule) -> RuleHandle {
        let (id, hits) = self.shared.rules.add(rule);
        RuleHandle {
            id,
            hits,
            table: self.shared.rules.clone(),
        }
    }

    /// Calls of CRI method `method` (e.g. `"ListPodSandbox"`) received so far,
    /// faulted or not.
    pub fn calls(&self, method: &str) -> usize {
        self.shared.calls(method)
    }

    /// Calls held by [`Action::Hang`] rules right now.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Shuts down every client connection now (as [`Action::DropConnection`]).
    pub fn drop_connections(&self) {
        self.shared.drop_connections();
    }

    /// Stops serving: held calls are let go or dropped, connections closed,
    /// the socket file removed.
    pub async fn shutdown(mut self) {
        self.stop_now().await;
    }

    async fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.shared.drop_connections();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
        let _ = tokio::fs::remove_file(&self.socket).await;
    }
}

impl Drop for CriProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.shared.drop_connections();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
