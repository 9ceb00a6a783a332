//! Building the prober (upstream `NewKubelet`'s `prober.NewManager`): one
//! worker per container and probe, reading the pod status cache, probing
//! through the CRI runtime service and writing the shared [`ProbeResults`].

use std::sync::Arc;

use kubelet_runtime::ProbeResults;
use kubelet_types::events::Recorder;
use tokio_util::sync::CancellationToken;

use crate::prober::ProbeManager;
use crate::status::StatusManager;

/// The prober for this kubelet; its workers stop with `stop`.
pub(super) fn probe_manager(
    results: &ProbeResults,
    cri: Arc<dyn cri::RuntimeService>,
    status: Arc<StatusManager>,
    recorder: Arc<dyn Recorder>,
    metrics: Arc<kubelet_metrics::KubeletMetrics>,
    stop: &CancellationToken,
) -> Arc<dyn ProbeManager> {
    Arc::new(
        kubelet_prober::Manager::new(results.clone(), cri, status, recorder, stop.child_token())
            .with_metrics(metrics),
    )
}
