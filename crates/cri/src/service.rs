//! The trait seam between the kubelet and a container runtime: the subset of
//! CRI `RuntimeService` and `ImageService` the kubelet's sync path uses
//! (upstream `internalapi.RuntimeService` / `internalapi.ImageManagerService`).

use std::time::Duration;

use crate::Result;
use crate::pb;

/// Pod sandbox and container lifecycle calls.
#[async_trait::async_trait]
pub trait RuntimeService: Send + Sync + 'static {
    /// Runtime name and version (`Version`).
    async fn version(&self) -> Result<pb::VersionResponse>;
    /// The runtime's answer to `Status` (not verbose): its conditions
    /// (RuntimeReady, NetworkReady), runtime handlers with their features,
    /// and runtime features (runtimes before CRI 1.30 send neither).
    async fn status(&self) -> Result<pb::StatusResponse>;

    /// Creates and starts a sandbox; returns its ID.
    async fn run_pod_sandbox(
        &self,
        config: pb::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String>;
    /// Stops a sandbox and every container in it (idempotent).
    async fn stop_pod_sandbox(&self, id: &str) -> Result<()>;
    /// Removes a stopped sandbox (idempotent).
    async fn remove_pod_sandbox(&self, id: &str) -> Result<()>;
    /// Status of one sandbox, including its IP.
    async fn pod_sandbox_status(&self, id: &str) -> Result<pb::PodSandboxStatus>;
    /// Sandboxes that match the filter.
    async fn list_pod_sandbox(
        &self,
        filter: Option<pb::PodSandboxFilter>,
    ) -> Result<Vec<pb::PodSandbox>>;

    /// Creates a container in a sandbox; returns its ID.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: pb::ContainerConfig,
        sandbox_config: pb::PodSandboxConfig,
    ) -> Result<String>;
    /// Starts a created container.
    async fn start_container(&self, id: &str) -> Result<()>;
    /// Stops a container, killing it after `timeout` (idempotent).
    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()>;
    /// Removes a container (idempotent).
    async fn remove_container(&self, id: &str) -> Result<()>;
    /// Containers that match the filter.
    async fn list_containers(
        &self,
        filter: Option<pb::ContainerFilter>,
    ) -> Result<Vec<pb::Container>>;
    /// Status of one container: state, exit code, timestamps, reason.
    async fn container_status(&self, id: &str) -> Result<pb::ContainerStatus>;
    /// Runs a command in a container and waits for it (probes, hooks).
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<pb::ExecSyncResponse>;
}

/// Image calls.
#[async_trait::async_trait]
pub trait ImageService: Send + Sync + 'static {
    /// The image if present on the node, `None` otherwise.
    async fn image_status(&self, image: &str) -> Result<Option<pb::Image>>;
    /// Pulls an image; returns the image reference (ID) the runtime resolved.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<pb::AuthConfig>,
        sandbox_config: Option<pb::PodSandboxConfig>,
    ) -> Result<String>;
    /// Every image on the node.
    async fn list_images(&self) -> Result<Vec<pb::Image>>;
    /// Removes an image (idempotent).
    async fn remove_image(&self, image: &str) -> Result<()>;
}
