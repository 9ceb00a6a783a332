//! The OOM watcher (upstream `oomWatcher.Start(nodeRef)` in
//! `Kubelet.initializeModules`): `SystemOOM` events on the Node from the
//! kernel log, on `tasks` under `stop`.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info_span;

use super::housekeeping::Housekeeping;
use super::spawn::spawn_in;

/// Starts it; without a readable `/dev/kmsg` it logs once and ends.
pub(super) fn spawn(h: &Housekeeping<'_>, tasks: &TaskTracker, stop: &CancellationToken) {
    spawn_in(
        tasks,
        info_span!("oom_watcher"),
        crate::oom_watcher::run(
            h.recorder.clone(),
            kubelet_types::events::node_ref(&h.cfg.node_name),
            stop.child_token(),
        ),
    );
}
