//! Pod sandbox creation (upstream `kuberuntime_sandbox.go`
//! `createPodSandbox`): the pod log directory, then `RunPodSandbox`.

use cri::pb;
use k8s_openapi::api::core::v1::Pod;
use kubelet_types::events::{EventType, pod_ref, reason};
use tracing::info;

use kubelet_metrics::StartPhase;
use tokio::time::Instant;

use super::{KubeRuntimeManager, StartTimings};
use crate::actions::PodActions;
use crate::sandbox::pod_logs_dir;
use crate::{Error, Result};

impl KubeRuntimeManager {
    pub(super) async fn ensure_sandbox(
        &self,
        p: &Pod,
        a: &PodActions,
        cfg: &pb::PodSandboxConfig,
        timings: &mut StartTimings,
    ) -> Result<String> {
        if !a.create_sandbox {
            return a.sandbox_id.clone().ok_or(Error::NoSandbox);
        }
        let start = Instant::now();
        let r = self.create_sandbox(p, a, cfg).await;
        // Upstream counts every creation attempt, and the failed ones as errors.
        if let Some(m) = &self.metrics {
            m.record_started_pod(r.is_err());
        }
        if r.is_ok() {
            let d = start.elapsed();
            timings.sandbox = Some(d);
            self.observe_phase(StartPhase::Sandbox, d);
        }
        r
    }

    async fn create_sandbox(
        &self,
        p: &Pod,
        a: &PodActions,
        cfg: &pb::PodSandboxConfig,
    ) -> Result<String> {
        let dir = pod_logs_dir(&self.cfg.pod_logs_dir, p);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| Error::Io {
                context: format!("create pod log directory {}", dir.display()),
                source,
            })?;
        // Upstream `createPodSandbox`: the RuntimeClass's handler, or the default.
        let handler = match self.helper.get() {
            Some(h) => h
                .lookup_runtime_handler(p)
                .await
                .map_err(|e| self.sandbox_refused(p, &e))?,
            None => None,
        };
        let handler = handler.unwrap_or_else(|| self.cfg.runtime_handler.clone());
        // Upstream `NamespacesForPod` while generating the sandbox config.
        let helper = self.helper.get();
        crate::userns::check_host_users(p, &handler, |h| match helper {
            Some(helper) => helper.handler_supports_user_namespaces(h),
            None => Err(crate::runtime_helper::RuntimeHandlerError {
                message: "runtime handlers are not set".into(),
            }),
        })
        .map_err(|e| self.sandbox_refused(p, &e))?;
        crate::cgroups::ensure_pod_cgroup(&self.cfg, self.recorder.as_ref(), p).await?;
        info!(attempt = a.attempt, handler = %handler, "Creating pod sandbox");
        let id = self
            .runtime
            .run_pod_sandbox(cfg.clone(), &handler)
            .await
            .map_err(|e| {
                let message = format!("Failed to create pod sandbox: {}", e.message());
                self.recorder.event(
                    &pod_ref(p, None),
                    EventType::Warning,
                    reason::FAILED_CREATE_POD_SANDBOX,
                    message.clone(),
                );
                Error::CreateSandbox(e)
            })?;
        info!(sandbox.id = %id, "Created pod sandbox");
        Ok(id)
    }

    /// The sandbox's config could not be made: upstream's Warning event,
    /// and the pod waits (its containers `ContainerCreating`) and retries.
    fn sandbox_refused(&self, p: &Pod, e: &dyn std::fmt::Display) -> Error {
        let message = format!("Failed to create pod sandbox: {e}");
        self.recorder.event(
            &pod_ref(p, None),
            EventType::Warning,
            reason::FAILED_CREATE_POD_SANDBOX,
            message.clone(),
        );
        Error::Container {
            reason: reason::FAILED_CREATE_POD_SANDBOX,
            message,
            source: None,
        }
    }
}
