//! Container log rotation (`kubelet-logs`), upstream `ContainerLogManager.Start`.

use std::sync::Arc;

use kubelet_logs::{ContainerLogManager, CriLogRuntime, LogRotatePolicy};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn};

use super::housekeeping::Housekeeping;
use super::spawn::spawn_in;

/// Starts it on `tasks` under `stop`; nothing when `containerLogMaxSize`
/// is negative (upstream's stub manager).
pub(super) fn spawn(h: &Housekeeping<'_>, tasks: &TaskTracker, stop: &CancellationToken) {
    let c = &h.cfg.housekeeping.container_log;
    let policy =
        match LogRotatePolicy::new(&c.max_size, c.max_files, c.max_workers, c.monitor_interval) {
            Ok(Some(p)) => p,
            Ok(None) => {
                info!(max_size = %c.max_size, "Container log rotation is off");
                return;
            }
            // Refused when the configuration was resolved; kept as a guard.
            Err(e) => {
                warn!(error = %e, "Container log rotation is off");
                return;
            }
        };
    let runtime = Arc::new(CriLogRuntime::new(h.cri.clone(), h.remote.clone()));
    let every = policy.monitor_interval;
    let manager = Arc::new(ContainerLogManager::new(
        runtime,
        policy,
        h.cfg.runtime_request_timeout,
    ));
    let stats = manager.stats();
    let metrics = h.metrics.clone();
    // The manager's counts, exported as they grow (kubelet-rs metrics:
    // upstream has none for log rotation).
    let export = async move {
        let (mut rotations, mut failures) = (0, 0);
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let (r, f) = (stats.rotations(), stats.failures());
            metrics.add_container_log_rotations(
                r.saturating_sub(rotations),
                f.saturating_sub(failures),
            );
            (rotations, failures) = (r, f);
        }
    };
    let run = manager.run(stop.clone());
    spawn_in(tasks, info_span!("container_log_manager"), async move {
        tokio::select! {
            () = run => {}
            () = export => {}
        }
    });
}
