//! What the subsystems that keep the node alive for months read: the
//! runtime, the desired pods and their statuses, the pod killer, the event
//! recorder and the metrics (upstream hands the same `*Kubelet` fields to
//! `StartGarbageCollection`, the log manager, the eviction manager and the
//! node shutdown manager). Imports no other `app` module.

use std::sync::Arc;

use cri::RemoteRuntime;
use kubelet_config::KubeletConfig;
use kubelet_podconfig::SourcesReady;
use kubelet_runtime::KubeRuntimeManager;
use kubelet_types::events::Recorder;

use crate::pod_killer::PodKiller;
use crate::pod_manager::PodManager;
use crate::runtime_state::RuntimeState;
use crate::status::StatusManager;

/// The kubelet as the housekeeping subsystems see it.
#[allow(dead_code)] // each subsystem reads what it needs
pub(super) struct Housekeeping<'a> {
    pub cfg: &'a KubeletConfig,
    /// The runtime manager (`kubeGenericRuntimeManager`).
    pub manager: Arc<KubeRuntimeManager>,
    /// The CRI client (stats, image filesystem, log reopen).
    pub remote: RemoteRuntime,
    /// The instrumented CRI runtime service.
    pub cri: Arc<dyn cri::RuntimeService>,
    /// Events (a no-op recorder without an apiserver).
    pub recorder: Arc<dyn Recorder>,
    /// The kubelet's metrics.
    pub metrics: Arc<kubelet_metrics::KubeletMetrics>,
    /// Desired pods.
    pub pods: PodManager,
    /// Generated pod statuses.
    pub status: Arc<StatusManager>,
    /// Ends pods (eviction, node shutdown).
    pub killer: Arc<dyn PodKiller>,
    /// The kubelet as its server reads it: `/stats/summary`.
    pub host: Arc<crate::host::KubeletHost>,
    /// Runtime and network health (node readiness).
    pub runtime_state: Arc<RuntimeState>,
    /// Whether every pod source has reported.
    pub sources_ready: Arc<SourcesReady>,
}
