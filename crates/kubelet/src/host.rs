//! The kubelet as the server sees it (upstream: `*Kubelet` implementing
//! `server.HostInterface`): read-only views for `kubelet-server`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync_loop::Heartbeat;

/// The agent's implementation of [`kubelet_server::HostInterface`].
pub struct KubeletHost {
    /// The sync loop's heartbeat.
    pub heartbeat: Arc<Heartbeat>,
    /// `syncFrequency`.
    pub resync: Duration,
}

impl kubelet_server::HostInterface for KubeletHost {
    fn resync_interval(&self) -> Duration {
        self.resync
    }

    fn latest_loop_entry_time(&self) -> Option<Instant> {
        self.heartbeat.latest()
    }
}
