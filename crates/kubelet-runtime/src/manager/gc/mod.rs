//! Removal of what a pod no longer needs (upstream `kuberuntime_gc.go`
//! `evictSandboxes`, `removeOldestN`, and the pod cleanup of
//! `kubelet_pods.go`): dead sandboxes, old container instances, and the
//! runtime's traces of a pod that is gone (never its pod directory).

use cri::pb;
use tracing::{info, warn};

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

    /// Keeps the newest exited instance of a container (its `lastState`) and
    /// removes older dead ones (upstream keeps one dead container per name).
    pub(super) async fn prune_instances(&self, status: &PodStatus, name: &str) {
        let dead: Vec<_> = status
            .instances(name)
            .filter(|s| s.state != ContainerState::Running)
            .skip(1)
            .collect();
        for s in dead {
            if let Err(e) = self.runtime.remove_container(&s.id).await
                && !e.is_not_found()
            {
                warn!(container.id = %s.id, error = %e, "Failed to remove dead container");
            }
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
