//! The kubelet's HTTP endpoints (upstream `pkg/kubelet/server`). Today the
//! local health endpoint ([`healthz`], 10248); next, the node API on 10250.
//! Everything the server reads of the kubelet goes through [`HostInterface`],
//! which the agent implements (upstream `server.HostInterface`), so this crate
//! depends on no agent code and is tested against a fake host.

pub mod healthz;

use std::time::Duration;

use tokio::time::Instant;

/// What the server reads of the running kubelet (upstream `server.HostInterface`).
pub trait HostInterface: Send + Sync + 'static {
    /// The sync loop's resync period (`syncFrequency`).
    fn resync_interval(&self) -> Duration;
    /// When the sync loop last started an iteration; `None` before the first.
    fn latest_loop_entry_time(&self) -> Option<Instant>;
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
}
