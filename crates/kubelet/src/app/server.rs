//! The node API's wiring (upstream `ListenAndServeKubeletServer` and
//! `ListenAndServeKubeletReadOnlyServer`): binds 10250 and the read-only
//! port in [`NodeApi::bind`], and in [`NodeApi::spawn`] assembles the
//! handler sets of `kubelet_server::server` over the agent's host and serves
//! them on the shared task tracker.

use std::net::SocketAddr;
use std::sync::Arc;

use kubelet_config::KubeletConfig;
use kubelet_config::server::ServerConfig;
use kubelet_server::ServerError;
use kubelet_server::healthz::{Checks, LogCheck};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn};

use super::spawn::spawn_in;
use crate::host::KubeletHost;

use crate::error::Error as AppError;

/// The node API's sockets, bound before anything starts.
pub(super) struct NodeApi {
    pub(super) secure: Option<TcpListener>,
    pub(super) read_only: Option<TcpListener>,
}

async fn listen(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Listen { what, addr, source })
}

impl NodeApi {
    /// Binds `address:port` (unless `enableServer` is off) and
    /// `address:readOnlyPort` (when set), failing as upstream does when a
    /// port is taken.
    pub(super) async fn bind(cfg: &ServerConfig) -> Result<Self, AppError> {
        if !cfg.enable_server {
            return Ok(Self {
                secure: None,
                read_only: None,
            });
        }
        let secure = listen("server", SocketAddr::new(cfg.address, cfg.port)).await?;
        let read_only = match cfg.read_only_port {
            0 => None,
            p => Some(listen("read-only server", SocketAddr::new(cfg.address, p)).await?),
        };
        Ok(Self {
            secure: Some(secure),
            read_only,
        })
    }

    /// Where each server listens.
    pub(super) fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        (
            self.secure.as_ref().and_then(|l| l.local_addr().ok()),
            self.read_only.as_ref().and_then(|l| l.local_addr().ok()),
        )
    }
}

/// What the node API is assembled from.
pub(super) struct Wiring<'a> {
    pub(super) cfg: &'a KubeletConfig,
    pub(super) host: Arc<KubeletHost>,
}

impl NodeApi {
    /// Serves the read-only port (plain HTTP, no authentication: the
    /// handlers that need none, and 405 on the debugging paths, as
    /// upstream's read-only server) and 10250.
    pub(super) fn spawn(self, w: Wiring<'_>, tasks: &TaskTracker, stop: &CancellationToken) {
        let log = Arc::new(LogCheck::default());
        spawn_in(
            tasks,
            info_span!("log_check"),
            log.clone().run(stop.child_token()),
        );
        let host: Arc<dyn kubelet_server::HostInterface> = w.host.clone();
        let checks = Arc::new(Checks::new(host.clone(), log));
        if let Some(l) = self.read_only {
            let router = kubelet_server::server::auth_not_required(host.clone(), checks.clone())
                .merge(kubelet_server::server::debugging_disabled());
            let stop = stop.child_token();
            info!(addr = ?l.local_addr().ok(), "Starting the read-only server");
            spawn_in(tasks, info_span!("read_only_server"), async move {
                let served = axum::serve(l, router)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await;
                if let Err(e) = served {
                    warn!(error = %e, "The read-only server stopped");
                }
            });
        }
        let _ = (w.cfg, self.secure);
    }
}

/// The agent's `/debug/flags/v` setter: klog's `-v` over the tracing filter.
pub(super) struct LogVerbosity;

impl kubelet_server::server::VerbositySetter for LogVerbosity {
    fn set_verbosity(&self, level: u8) -> Result<(), ServerError> {
        kubelet_config::logs::set_verbosity(level).map_err(|e| ServerError::Verbosity(Box::new(e)))
    }
}
