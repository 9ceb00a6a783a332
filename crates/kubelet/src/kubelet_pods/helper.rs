//! The kubelet as the runtime manager's `RuntimeHelper` (upstream
//! `Kubelet.GenerateRunContainerOptions` and `getPullSecretsForPod`):
//! environment, mounts and `/etc/hosts` for each container, with the
//! devices, mounts, environment and annotations device plugins allocated
//! to it (upstream `containerManager.GetResources`), and the pod's image
//! pull secrets.

use std::collections::HashMap;
use std::sync::Arc;

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kubelet_runtime::{ContainerConfigError, RunContainerOptions, RuntimeHelper};
use kubelet_types::events::{EventType, Recorder, pod_ref};
use kubelet_types::pod;
use kubelet_volume::VolumeHost;
use tracing::warn;

use super::env::{EnvInputs, make_environment_variables};
use super::hosts::make_hosts_mount;
use super::mounts::{make_block_devices, make_mounts};
use crate::envvars::service_env_var_map;
use crate::objects::services::ServiceLister;
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
    /// Services, for service environment variables.
    pub services: ServiceLister,
    /// The node's IPs.
    pub host_ips: Vec<String>,
    /// `clusterDomain`.
    pub cluster_domain: String,
    /// The node's hosts file (`/etc/hosts`), for host-network pods.
    pub node_hosts: std::path::PathBuf,
    /// RuntimeClass lookups (cluster mode; a standalone kubelet has none,
    /// as upstream).
    pub runtime_classes: Option<crate::runtimeclass::RuntimeClassManager>,
    /// Device plugins' allocations.
    pub devices: Option<kubelet_devicemanager::DeviceManager>,
    /// What the runtime's handlers can do (user namespaces, recursive
    /// read-only mounts), from its last ready `Status`.
    pub features: Arc<crate::runtime_features::RuntimeFeatures>,
}

/// The device plugins' part of the container's options (upstream
/// `GetResources` → `DeviceRunContainerOptions`); it comes before the
/// container's own environment and mounts.
async fn device_options(
    dm: &kubelet_devicemanager::DeviceManager,
    p: &Pod,
    c: &Container,
) -> Result<RunContainerOptions, ContainerConfigError> {
    let Some(d) = dm
        .get_device_run_container_options(p, c)
        .await
        .map_err(|e| ContainerConfigError {
            message: e.to_string(),
        })?
    else {
        return Ok(RunContainerOptions::default());
    };
    Ok(RunContainerOptions {
        envs: d
            .envs
            .into_iter()
            .map(|(key, value)| pb::KeyValue { key, value })
            .collect(),
        mounts: d
            .mounts
            .into_iter()
            .map(|m| pb::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                readonly: m.read_only,
                ..Default::default()
            })
            .collect(),
        devices: d
            .devices
            .into_iter()
            .map(|d| pb::Device {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: d.annotations,
        cdi_devices: d
            .cdi_devices
            .into_iter()
            .map(|c| pb::CdiDevice { name: c.name })
            .collect(),
    })
}

impl KubeletRuntimeHelper {
    async fn envs(
        &self,
        p: &Pod,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<Vec<pb::KeyValue>, ContainerConfigError> {
        let enable_links = p
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let service_env =
            (self.services.is_standalone() || self.services.has_synced()).then(|| {
                service_env_var_map(&self.services.services(), pod::namespace(p), enable_links)
            });
        let allocatable = self.host.node_allocatable();
        // A host-network pod's IPs are the node's (upstream reports them as
        // its `status.podIPs`, and the downward API agrees).
        let pod_ips = if pod::host_network(p) && pod_ips.is_empty() {
            self.host_ips.as_slice()
        } else {
            pod_ips
        };
        let inputs = EnvInputs {
            objects: self.host.as_ref(),
            service_env: service_env.as_ref(),
            pod_ips,
            host_ips: &self.host_ips,
            allocatable: &allocatable,
        };
        let env = make_environment_variables(p, c, &inputs)
            .await
            .map_err(|e| ContainerConfigError {
                message: e.to_string(),
            })?;
        for message in env.invalid_names {
            self.recorder.event(
                &pod_ref(p, None),
                EventType::Warning,
                "InvalidEnvironmentVariableNames",
                message,
            );
        }
        Ok(env
            .vars
            .into_iter()
            .map(|(key, value)| pb::KeyValue { key, value })
            .collect())
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
        let mut opts = match &self.devices {
            Some(dm) => device_options(dm, p, c).await?,
            None => RunContainerOptions::default(),
        };
        let envs = self.envs(p, c, pod_ips).await?;
        let env: HashMap<String, String> = envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        let volumes = self.volumes.get_mounted_volumes_for_pod(pod::uid(p));
        // Upstream `runtimeClassSupportsRecursiveReadOnlyMounts` (false when
        // the class cannot be looked up), asked only of a container that
        // wants a recursively read-only mount.
        let wants_rro = c.volume_mounts.iter().flatten().any(|m| {
            m.recursive_read_only
                .as_deref()
                .is_some_and(|r| r != "Disabled")
        });
        let supports_rro = wants_rro
            && match self.lookup_runtime_handler(p).await {
                Ok(handler) => self
                    .features
                    .handler_supports_recursive_read_only(handler.as_deref().unwrap_or_default()),
                Err(_) => false,
            };
        let mut mounts = make_mounts(p, c, &volumes, &env, self.volumes.pods_dir(), supports_rro)
            .await
            .map_err(|e| ContainerConfigError { message: e.0 })?;
        // Upstream mounts the managed hosts file once the sandbox has IPs,
        // unless the container mounts something on /etc/hosts itself.
        let own_hosts = c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/etc/hosts");
        if (!pod_ips.is_empty() || pod::host_network(p)) && !own_hosts {
            let hosts = make_hosts_mount(
                p,
                self.volumes.pods_dir(),
                pod_ips,
                &self.cluster_domain,
                &self.node_hosts,
            )
            .await
            .map_err(|e| ContainerConfigError {
                message: format!("failed to create the pod's hosts file: {e}"),
            })?;
            mounts.push(hosts);
        }
        let devices =
            make_block_devices(c, &volumes).map_err(|e| ContainerConfigError { message: e.0 })?;
        opts.envs.extend(envs);
        opts.mounts.extend(mounts);
        opts.devices.extend(devices);
        Ok(opts)
    }

    async fn lookup_runtime_handler(
        &self,
        p: &Pod,
    ) -> Result<Option<String>, kubelet_runtime::RuntimeHandlerError> {
        let Some(m) = &self.runtime_classes else {
            return Ok(None);
        };
        let name = p
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref());
        m.lookup_runtime_handler(name)
            .await
            .map_err(|e| kubelet_runtime::RuntimeHandlerError {
                message: e.to_string(),
            })
    }

    fn handler_supports_user_namespaces(
        &self,
        handler: &str,
    ) -> Result<bool, kubelet_runtime::RuntimeHandlerError> {
        self.features
            .handler_supports_user_namespaces(handler)
            .map_err(|e| kubelet_runtime::RuntimeHandlerError {
                message: e.to_string(),
            })
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
        let mut failed = Vec::new();
        for name in names {
            match self.host.get_secret(ns, &name).await {
                Ok(s) => out.push(s),
                Err(e) => {
                    // Upstream goes on without it: the pull may still work.
                    warn!(secret = %name, error = %e, "Unable to retrieve pull secret, the image pull may not succeed.");
                    failed.push(name);
                }
            }
        }
        if !failed.is_empty() {
            self.recorder.event(
                &pod_ref(p, None),
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        out
    }
}
