//! The eviction manager (`kubelet-eviction`), upstream `evictionManager.Start`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::housekeeping::Housekeeping;

/// What eviction reclaims disk with before it evicts a pod.
pub(super) struct Reclaimers {
    pub images: Option<Arc<dyn kubelet_eviction::ImageGc>>,
    pub containers: Option<Arc<dyn kubelet_eviction::ContainerGc>>,
}

/// Starts it on `tasks` under `stop`.
pub(super) fn spawn(
    _h: &Housekeeping<'_>,
    _reclaim: Reclaimers,
    _tasks: &TaskTracker,
    _stop: &CancellationToken,
) {
}
