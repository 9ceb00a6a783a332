//! Task helpers the subsystems share: spawning on the tracker in a span, and
//! telling systemd the kubelet is up. Imports no other `app` module.

use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, warn};

/// Spawns `fut` on `tasks` inside `span`.
pub(super) fn spawn_in<F>(tasks: &TaskTracker, span: tracing::Span, fut: F) -> JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tasks.spawn(fut.instrument(span))
}

/// Tells systemd (`Type=notify`) the kubelet is up; a no-op outside systemd.
pub(super) fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!(error = %e, "Cannot notify systemd");
    }
}
