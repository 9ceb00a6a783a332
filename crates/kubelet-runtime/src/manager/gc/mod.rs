//! Removal of what a pod no longer needs (upstream `kuberuntime_gc.go`
//! `evictSandboxes`, `removeOldestN`, and the pod cleanup of
//! `kubelet_pods.go`): dead sandboxes, old container instances, and the
//! runtime's traces of a pod that is gone (never its pod directory).
//!
//! The periodic collector (upstream `containerGC.GarbageCollect`) is in
//! `collector`; both remove a container with its log files, as upstream's
//! `removeContainer` does (`removeContainerLog`: the log and its rotations).

mod collector;
#[cfg(test)]
mod tests;

use std::path::Path;

use cri::pb;
use tracing::{debug, info, warn};

use super::KubeRuntimeManager;
use crate::Result;
use crate::pod_status::{ContainerState, PodStatus};

impl KubeRuntimeManager {
    /// Removes sandboxes that are not ready, not the newest, and hold no
    /// containers any more (upstream container GC's `evictSandboxes`), so a
    /// recreated sandbox does not leave the dead one behind forever.
    pub(super) async fn remove_dead_sandboxes(&self, status: &PodStatus) {
        let ready = pb::PodSandboxState::SandboxReady as i32;
        for s in status.sandboxes.iter().skip(1) {
            if s.state == ready || status.containers.iter().any(|c| c.sandbox_id == s.id) {
                continue;
            }
            info!(sandbox.id = %s.id, "Removing dead pod sandbox");
            if let Err(e) = self.runtime.remove_pod_sandbox(&s.id).await
                && !e.is_not_found()
            {
                warn!(sandbox.id = %s.id, error = %e, "Failed to remove dead sandbox");
            }
        }
    }

    /// Keeps the newest exited instances of a container (the newest is its
    /// `lastState`), as many as `--maximum-dead-containers-per-container`
    /// allows but at least one, and removes older dead ones.
    pub(super) async fn prune_instances(&self, status: &PodStatus, name: &str) {
        let keep = self.cfg.max_dead_per_container.max(1);
        let dead: Vec<_> = status
            .instances(name)
            .filter(|s| s.state != ContainerState::Running)
            .skip(keep)
            .collect();
        for s in dead {
            if let Err(e) = self.remove_container(&s.id).await {
                warn!(container.id = %s.id, error = %e, "Failed to remove dead container");
            }
        }
    }

    /// Upstream `removeContainer`: the container's log file and its rotated
    /// files first (a removed container's logs are read by nobody, and
    /// containerd leaves them), then the container. A container already
    /// gone is not an error.
    pub(super) async fn remove_container(&self, id: &str) -> Result<()> {
        match self.runtime.container_status(id).await {
            Ok(s) => remove_container_logs(&s.log_path).await,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        match self.runtime.remove_container(id).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes every container and sandbox of a pod no source wants any more,
    /// its cgroups and its log directory; not `<root-dir>/pods/<uid>`,
    /// which the kubelet's volume clean-up removes. Call after
    /// [`Self::kill_pod`].
    pub async fn remove_pod(&self, status: &PodStatus) -> Result<()> {
        for c in &status.containers {
            match self.runtime.remove_container(&c.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for s in &status.sandboxes {
            match self.runtime.remove_pod_sandbox(&s.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        crate::cgroups::destroy_pod_cgroups(&self.cfg, &status.uid).await;
        // `<root-dir>/pods/<uid>` is not the runtime's: volumes and subPath
        // bind mounts live there, and only the kubelet's orphaned pod
        // directory clean-up (upstream `cleanupOrphanedPodDirs`) removes
        // it, once nothing is mounted under it.
        if !status.name.is_empty() {
            let dir = self.cfg.pod_logs_dir.join(format!(
                "{}_{}_{}",
                status.namespace, status.name, status.uid
            ));
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(dir = %dir.display(), error = %e, "Failed to remove pod log directory");
            }
        }
        self.forget_pod(&status.uid);
        Ok(())
    }
}

/// Removes `log_path` and its rotations (`<log_path>.<timestamp>[.gz]`,
/// upstream `logManager.Clean`'s `<log_path>*`). Only absolute paths: the
/// runtime reports the path it writes to.
async fn remove_container_logs(log_path: &str) {
    let path = Path::new(log_path);
    if log_path.is_empty() || !path.is_absolute() {
        return;
    }
    let (Some(dir), Some(base)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "Cannot list container log directory");
            return;
        }
    };
    let rotated = format!("{base}.");
    loop {
        let entry = match entries.next_entry().await {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "Cannot list container log directory");
                break;
            }
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name != base && !name.starts_with(&rotated) {
            continue;
        }
        let file = entry.path();
        match tokio::fs::remove_file(&file).await {
            Ok(()) => debug!(file = %file.display(), "Removed container log"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(file = %file.display(), error = %e, "Failed to remove container log"),
        }
    }
}
