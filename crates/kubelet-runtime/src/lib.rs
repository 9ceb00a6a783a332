//! The CRI-backed runtime side of kubelet-rs (upstream `pkg/kubelet/kuberuntime`,
//! `pkg/kubelet/images`, `pkg/kubelet/pleg`, `pkg/util/flowcontrol`).
//!
//! [`KubeRuntimeManager`] turns a desired pod and the observed runtime state
//! into CRI calls: [`actions::compute_pod_actions`] decides, `sync_pod` applies,
//! idempotently. [`pleg::GenericPleg`] relists the runtime and wakes pods whose
//! containers changed.

pub mod actions;
pub mod backoff;
pub mod cgroups;
mod container;
mod container_resources;
pub mod credentialprovider;
pub mod ephemeral;
mod error;
pub mod expansion;
pub mod foreign_restarts;
pub mod images;
pub mod instrumented;
pub mod labels;
pub mod lifecycle_handler;
pub mod logs;
mod manager;
pub mod pleg;
pub mod pod_status;
pub mod prober_results;
mod runtime_config;
pub mod runtime_helper;
mod sandbox;
mod security_context;
mod termination;
pub mod userns;

/// Resource quantities; moved to [`kubelet_types::quantity`] and re-exported here.
pub use kubelet_types::quantity;

pub use error::{Error, Result, RetryClass};
pub use manager::{KubeRuntimeManager, StartTimings, SyncResult};
pub use pod_status::{ContainerState, ContainerStatus, PodStatus};
pub use prober_results::{ProbeResult, ProbeResults, ResultsManager};
pub use runtime_config::RuntimeConfig;
pub use runtime_helper::{
    ContainerConfigError, RunContainerOptions, RuntimeHandlerError, RuntimeHelper,
};
pub use sandbox::qos_class as sandbox_qos_class;

/// The `PodSandboxConfig` kubelet-rs sends for `pod` (for benchmarks and tools
/// that must create exactly what the kubelet would). Reads `resolv.conf` on
/// the calling thread; the kubelet itself reads it off the async runtime.
pub fn generate_sandbox_config(
    cfg: &RuntimeConfig,
    pod: &k8s_openapi::api::core::v1::Pod,
    attempt: u32,
) -> cri::pb::PodSandboxConfig {
    let host_dns = sandbox::HostDns::read_blocking(&cfg.resolv_conf);
    sandbox::sandbox_config(cfg, pod, attempt, &host_dns)
}

/// The `ContainerConfig` kubelet-rs sends for a container of `pod`.
pub fn generate_container_config(
    cfg: &RuntimeConfig,
    pod: &k8s_openapi::api::core::v1::Pod,
    container: &k8s_openapi::api::core::v1::Container,
    restart_count: i32,
    image_ref: &str,
) -> cri::pb::ContainerConfig {
    container::container_config(cfg, pod, container, restart_count, image_ref, None)
}
