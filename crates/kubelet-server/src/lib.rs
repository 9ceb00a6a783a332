//! The kubelet's HTTP endpoints (upstream `pkg/kubelet/server`). Today the
//! local health endpoint ([`healthz`], 10248); next, the node API on 10250.
//! Everything the server reads of the kubelet goes through [`HostInterface`],
//! which the agent implements (upstream `server.HostInterface`), so this crate
//! depends on no agent code and is tested against a fake host.

pub mod auth;
pub mod healthz;
pub mod logs;
pub mod metrics;
pub mod serve;
pub mod server;
pub mod stats;
pub mod streaming;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

/// What the server reads of the running kubelet (upstream `server.HostInterface`).
/// The node API's other concerns (logs, streaming, stats) read the kubelet
/// through their own traits, beside their handlers.
#[async_trait::async_trait]
pub trait HostInterface: Send + Sync + 'static {
    /// The sync loop's resync period (`syncFrequency`).
    fn resync_interval(&self) -> Duration;
    /// When the sync loop last started an iteration; `None` before the first.
    fn latest_loop_entry_time(&self) -> Option<Instant>;
    /// The node's name.
    fn node_name(&self) -> &str {
        ""
    }
    /// A desired pod by namespace and name (upstream `GetPodByName`); a
    /// mirror pod's name finds its static pod.
    fn get_pod_by_name(&self, _namespace: &str, _name: &str) -> Option<Arc<Pod>> {
        None
    }
    /// The pods bound to this node with their latest generated status
    /// (upstream `GetPods`, served at `/pods`).
    fn get_pods(&self) -> Vec<Pod> {
        Vec::new()
    }
    /// The pods the runtime runs, as bare pods naming their containers
    /// (upstream `GetRunningPods`, served at `/runningpods/`).
    async fn get_running_pods(&self) -> Result<Vec<Pod>, ServerError> {
        Ok(Vec::new())
    }
}

/// Errors of the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listening address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: std::net::SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The container runtime failed a call the server needed.
    #[error("container runtime: {0}")]
    Runtime(#[from] cri::CriError),
    /// A log verbosity change was refused.
    #[error("{0}")]
    Verbosity(#[source] Box<dyn std::error::Error + Send + Sync>),
}
