//! What the runtime manager asks of the kubelet when it creates a container
//! (upstream `kubecontainer.RuntimeHelper`): the container's environment and
//! mounts (`GenerateRunContainerOptions`: `makeEnvironmentVariables`,
//! `makeMounts`, the managed `/etc/hosts`) and the pod's image pull secrets
//! (`getPullSecretsForPod`). The kubelet implements it over its volume
//! manager, ConfigMap/Secret managers and service lister.

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};

/// Environment, mounts and devices of one container (upstream
/// `kubecontainer.RunContainerOptions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunContainerOptions {
    /// Environment, in upstream's order; also what `$(VAR)` in command and
    /// args expands against.
    pub envs: Vec<pb::KeyValue>,
    /// Volume mounts, `/etc/hosts`, device plugin mounts and the like (the
    /// termination log is added by the runtime manager).
    pub mounts: Vec<pb::Mount>,
    /// Device nodes from device plugins (host path, container path,
    /// permissions).
    pub devices: Vec<pb::Device>,
    /// Container annotations from device plugins, beside the kubelet's own.
    pub annotations: Vec<(String, String)>,
    /// Fully qualified CDI device names from device plugins.
    pub cdi_devices: Vec<pb::CdiDevice>,
}

/// The container's configuration could not be generated: the container is
/// not created and waits with `CreateContainerConfigError` and this message
/// (upstream's `ErrCreateContainerConfig`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ContainerConfigError {
    /// Upstream's message (`configmap "x" not found`, ...).
    pub message: String,
}

/// The kubelet, as the runtime manager sees it while starting containers.
#[async_trait::async_trait]
pub trait RuntimeHelper: Send + Sync + 'static {
    /// Environment and mounts for `c` of `pod`, whose sandbox has `pod_ips`.
    async fn generate_run_container_options(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<RunContainerOptions, ContainerConfigError>;

    /// The pod's `imagePullSecrets` that exist (missing ones are skipped with
    /// a warning, as upstream).
    async fn get_pull_secrets(&self, pod: &Pod) -> Vec<Secret>;

    /// The CRI runtime handler of the pod's `runtimeClassName` (upstream
    /// `runtimeClassManager.LookupRuntimeHandler`); `None` when the pod names
    /// no class, or the kubelet has no apiserver to ask.
    async fn lookup_runtime_handler(
        &self,
        _pod: &Pod,
    ) -> Result<Option<String>, RuntimeHandlerError> {
        Ok(None)
    }

    /// Whether the runtime `handler` can give a pod a user namespace
    /// (upstream `HandlerSupportsUserNamespaces`, from the runtime's last
    /// `Status`). The default answers as a runtime that lists no handlers
    /// (containerd 1.6).
    fn handler_supports_user_namespaces(&self, handler: &str) -> Result<bool, RuntimeHandlerError> {
        Err(RuntimeHandlerError {
            message: format!("the handler {handler:?} is not known"),
        })
    }
}

/// The pod's RuntimeClass could not be resolved: its sandbox is not
/// created (`FailedCreatePodSandBox` with this message) and it is retried.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct RuntimeHandlerError {
    /// Upstream's message (`failed to lookup RuntimeClass x: ...`).
    pub message: String,
}
