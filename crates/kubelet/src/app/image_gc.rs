//! Image garbage collection (`kubelet-images`), upstream `ImageGCManager.Start` and `StartGarbageCollection`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::housekeeping::Housekeeping;

/// Starts it on `tasks` under `stop`; returns what eviction reclaims
/// disk with.
pub(super) fn spawn(
    _h: &Housekeeping<'_>,
    _tasks: &TaskTracker,
    _stop: &CancellationToken,
) -> Option<Arc<dyn kubelet_eviction::ImageGc>> {
    None
}
