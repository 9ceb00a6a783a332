//! The kubelet as the server sees it (upstream: `*Kubelet` implementing
//! `server.HostInterface`): read-only views for `kubelet-server`. Each
//! concern of the node API (logs, streaming, stats) is implemented in its own
//! submodule over the same [`KubeletHost`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cri::RemoteRuntime;
use k8s_openapi::api::core::v1::Pod;
use kubelet_runtime::KubeRuntimeManager;
use kubelet_runtime::pleg::PodCache;
use kubelet_server::ServerError;
use tokio::time::Instant;

mod logs;
mod running;
pub mod stats;
mod streaming;

use crate::pod_manager::PodManager;
use crate::status::StatusManager;
use crate::sync_loop::Heartbeat;

/// The agent's implementation of [`kubelet_server::HostInterface`] and the
/// node API's other host traits.
pub struct KubeletHost {
    /// The sync loop's heartbeat.
    pub heartbeat: Arc<Heartbeat>,
    /// `syncFrequency`.
    pub resync: Duration,
    /// The node's name.
    pub node_name: String,
    /// Desired pods (static and API), and mirror pods.
    pub pods: PodManager,
    /// Generated pod statuses.
    pub status: Arc<StatusManager>,
    /// The runtime manager (`kubeGenericRuntimeManager`).
    pub manager: Arc<KubeRuntimeManager>,
    /// The CRI client, for calls outside the sync path (streaming, stats).
    pub remote: RemoteRuntime,
    /// The PLEG's pod cache: the runtime's latest view of each pod.
    pub pod_cache: Arc<PodCache>,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// Where container logs live (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The previous CPU sample of each container, pod and the node, for
    /// `usageNanoCores` when the runtime does not fill it.
    pub cpu_usage: stats::CpuUsageCache,
    /// One stats collection at a time, reused by concurrent scrapes.
    pub summary_cache: stats::SummaryCache,
    /// Where the stats calls to the runtime are counted.
    pub metrics: Arc<kubelet_metrics::KubeletMetrics>,
    /// The pod cgroups, for pods the runtime gives no stats for.
    pub pod_cgroups: Arc<dyn stats::PodCgroupDirs>,
    /// The CSI volume plugin (cluster mode): CSI volumes' stats.
    pub csi: Option<Arc<kubelet_csi::CsiPlugin>>,
}

#[async_trait::async_trait]
impl kubelet_server::HostInterface for KubeletHost {
    fn resync_interval(&self) -> Duration {
        self.resync
    }

    fn latest_loop_entry_time(&self) -> Option<Instant> {
        self.heartbeat.latest()
    }

    fn node_name(&self) -> &str {
        &self.node_name
    }

    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get_pods().into_iter().find(|p| {
            p.metadata.name.as_deref() == Some(name)
                && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
    }

    fn get_pods(&self) -> Vec<Pod> {
        self.pods
            .get_pods()
            .into_iter()
            .map(|p| {
                let mut pod = Pod::clone(&p);
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if let Some(status) = self.status.get_pod_status(&uid) {
                    pod.status = Some(status);
                }
                pod
            })
            .collect()
    }

    async fn get_running_pods(&self) -> Result<Vec<Pod>, ServerError> {
        running::running_pods(self.manager.runtime().as_ref()).await
    }
}
