//! The kubelet as the runtime manager's `RuntimeHelper` (upstream
//! `Kubelet.GenerateRunContainerOptions` and `getPullSecretsForPod`):
//! environment, mounts and `/etc/hosts` for each container, and the pod's
//! image pull secrets.

use std::collections::HashMap;
use std::sync::Arc;

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kubelet_runtime::{ContainerConfigError, RunContainerOptions, RuntimeHelper};
use kubelet_types::events::{EventType, Recorder, pod_ref};
use kubelet_types::pod;
use kubelet_volume::VolumeHost;
use tracing::warn;

use super::mounts::make_mounts;
use crate::volume_host::KubeletVolumeHost;
use crate::volumemanager::VolumeManager;

/// The kubelet's answers to the runtime manager.
pub struct KubeletRuntimeHelper {
    /// Set-up volumes.
    pub volumes: VolumeManager,
    /// Objects from the apiserver.
    pub host: Arc<KubeletVolumeHost>,
    /// Where events go.
    pub recorder: Arc<dyn Recorder>,
}

impl KubeletRuntimeHelper {
    async fn envs(
        &self,
        p: &Pod,
        c: &Container,
        _pod_ips: &[String],
    ) -> Result<Vec<pb::KeyValue>, ContainerConfigError> {
        let _ = p;
        let mut vars: HashMap<String, String> = HashMap::new();
        let mut out = Vec::new();
        for e in c.env.iter().flatten() {
            let value = kubelet_runtime::expansion::expand(e.value.as_deref().unwrap_or(""), &vars);
            vars.insert(e.name.clone(), value.clone());
            out.push(pb::KeyValue {
                key: e.name.clone(),
                value,
            });
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl RuntimeHelper for KubeletRuntimeHelper {
    async fn generate_run_container_options(
        &self,
        p: &Pod,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<RunContainerOptions, ContainerConfigError> {
        let envs = self.envs(p, c, pod_ips).await?;
        let env: HashMap<String, String> = envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        let volumes = self.volumes.get_mounted_volumes_for_pod(pod::uid(p));
        let mounts = make_mounts(p, c, &volumes, &env, self.volumes.pods_dir())
            .await
            .map_err(|e| ContainerConfigError { message: e.0 })?;
        Ok(RunContainerOptions { envs, mounts })
    }

    async fn get_pull_secrets(&self, p: &Pod) -> Vec<Secret> {
        let ns = pod::namespace(p);
        let mut out = Vec::new();
        let names = p
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty());
        for name in names {
            match self.host.get_secret(ns, &name).await {
                Ok(s) => out.push(s),
                Err(e) => {
                    // Upstream goes on without it: the pull may still work.
                    warn!(secret = %name, error = %e, "Unable to retrieve pull secret; the image pull may not succeed");
                    self.recorder.event(
                        &pod_ref(p, None),
                        EventType::Warning,
                        "FailedToRetrieveImagePullSecret",
                        format!(
                            "Unable to retrieve some image pull secrets ({name}); attempting to pull the image may not succeed."
                        ),
                    );
                }
            }
        }
        out
    }
}
