//! gRPC client over a unix socket (upstream `pkg/kubelet/cri/remote`): one lazily
//! connected channel per endpoint, a deadline on every call, errors classified once.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::trace;

use crate::pb::image_service_client::ImageServiceClient;
use crate::pb::runtime_service_client::RuntimeServiceClient;
use crate::service::{ImageService, RuntimeService};
use crate::{CriError, Result, pb};

/// CRI client for a remote runtime such as containerd.
///
/// Connections are made lazily and re-made after failures, so a runtime that is
/// down at start or restarts later never takes the kubelet down: calls fail with
/// [`CriError::Unavailable`] until it is back.
#[derive(Clone, Debug)]
pub struct RemoteRuntime {
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    timeout: Duration,
}

/// Turns `unix:///run/containerd/containerd.sock` or a bare absolute path into a
/// socket path. Other schemes (tcp, npipe) are refused: this kubelet runs on Linux.
pub fn endpoint_path(endpoint: &str) -> Result<PathBuf> {
    let refuse = |reason| CriError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if endpoint.contains("://") {
        return Err(refuse("only unix:// endpoints are supported"));
    } else {
        endpoint
    };
    if !path.starts_with('/') {
        return Err(refuse("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

fn channel(endpoint: &str) -> Result<Channel> {
    let path = endpoint_path(endpoint)?;
    // The authority is ignored by the connector; tonic needs some URI.
    let ep = Endpoint::from_static("http://[::]:50051").connect_timeout(Duration::from_secs(5));
    Ok(
        ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        })),
    )
}

impl RemoteRuntime {
    /// A client for `runtime_endpoint`, with images served by `image_endpoint`
    /// when it is given (`--image-service-endpoint`), else by the same socket.
    /// `timeout` is `--runtime-request-timeout`.
    pub fn new(
        runtime_endpoint: &str,
        image_endpoint: Option<&str>,
        timeout: Duration,
    ) -> Result<Self> {
        let rt = channel(runtime_endpoint)?;
        let img = match image_endpoint {
            Some(ep) if !ep.is_empty() => channel(ep)?,
            _ => rt.clone(),
        };
        // Large lists (many containers) exceed tonic's 4 MiB default; upstream allows 16 MiB.
        let max = 16 * 1024 * 1024;
        Ok(Self {
            runtime: RuntimeServiceClient::new(rt).max_decoding_message_size(max),
            image: ImageServiceClient::new(img).max_decoding_message_size(max),
            timeout,
        })
    }

    /// The generated runtime client, for RPCs outside the trait (Exec, Attach,
    /// PortForward, stats, UpdateRuntimeConfig, ...).
    pub fn runtime_client(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// The generated image client, for RPCs outside the trait (ImageFsInfo).
    pub fn image_client(&self) -> ImageServiceClient<Channel> {
        self.image.clone()
    }

    /// The per-call deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Streaming URL for `kubectl exec` (`Exec`).
    pub async fn exec(&self, req: pb::ExecRequest) -> Result<pb::ExecResponse> {
        let mut c = self.runtime.clone();
        call("Exec", self.timeout, c.exec(request(req, self.timeout))).await
    }

    /// Streaming URL for `kubectl attach` (`Attach`).
    pub async fn attach(&self, req: pb::AttachRequest) -> Result<pb::AttachResponse> {
        let mut c = self.runtime.clone();
        call("Attach", self.timeout, c.attach(request(req, self.timeout))).await
    }

    /// Streaming URL for `kubectl port-forward` (`PortForward`).
    pub async fn port_forward(
        &self,
        req: pb::PortForwardRequest,
    ) -> Result<pb::PortForwardResponse> {
        let mut c = self.runtime.clone();
        call(
            "PortForward",
            self.timeout,
            c.port_forward(request(req, self.timeout)),
        )
        .await
    }

    /// Stats of one container (`ContainerStats`).
    pub async fn container_stats(&self, id: &str) -> Result<Option<pb::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = pb::ContainerStatsRequest {
            container_id: id.to_string(),
        };
        Ok(call(
            "ContainerStats",
            self.timeout,
            c.container_stats(request(req, self.timeout)),
        )
        .await?
        .stats)
    }

    /// Stats of every sandbox that matches the filter (`ListPodSandboxStats`).
    pub async fn list_pod_sandbox_stats(
        &self,
        filter: Option<pb::PodSandboxStatsFilter>,
    ) -> Result<Vec<pb::PodSandboxStats>> {
        let mut c = self.runtime.clone();
        let req = pb::ListPodSandboxStatsRequest { filter };
        Ok(call(
            "ListPodSandboxStats",
            self.timeout,
            c.list_pod_sandbox_stats(request(req, self.timeout)),
        )
        .await?
        .stats)
    }

    /// Asks the runtime to reopen a container's log file at its log path
    /// (`ReopenContainerLog`), after the kubelet renamed it for rotation.
    /// Fails when the container is not running.
    pub async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = pb::ReopenContainerLogRequest {
            container_id: id.to_string(),
        };
        call(
            "ReopenContainerLog",
            self.timeout,
            c.reopen_container_log(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    /// The runtime's Linux configuration (`RuntimeConfig`, CRI 1.28+): the
    /// cgroup driver it uses. `None` from a runtime that does not implement
    /// the call (containerd before 2.0, CRI `Unimplemented`).
    pub async fn runtime_config(&self) -> Result<Option<pb::LinuxRuntimeConfiguration>> {
        let mut c = self.runtime.clone();
        match call(
            "RuntimeConfig",
            self.timeout,
            c.runtime_config(request(pb::RuntimeConfigRequest {}, self.timeout)),
        )
        .await
        {
            Ok(r) => Ok(r.linux),
            Err(CriError::Rpc {
                code: tonic::Code::Unimplemented,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Image filesystem usage (`ImageFsInfo`).
    pub async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse> {
        let mut c = self.image.clone();
        call(
            "ImageFsInfo",
            self.timeout,
            c.image_fs_info(request(pb::ImageFsInfoRequest {}, self.timeout)),
        )
        .await
    }
}

/// A request that carries its deadline to the runtime (`grpc-timeout`), as
/// upstream's context deadline does.
fn request<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(deadline);
    req
}

/// Runs one RPC under `timeout` and classifies its error; a `DeadlineExceeded`
/// from the runtime reports the same deadline.
async fn call<T, F>(op: &'static str, timeout: Duration, fut: F) -> Result<T>
where
    F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    trace!(cri.op = op, "CRI call");
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(CriError::from_status_with_deadline(op, status, timeout)),
        Err(_) => Err(CriError::Timeout { op, timeout }),
    }
}

/// Runs one RPC with no deadline of ours (image pulls: upstream sets none and
/// relies on the runtime's pull progress timeout). Dropping the future
/// cancels the call on the runtime.
async fn call_unbounded<T, F>(op: &'static str, fut: F) -> Result<T>
where
    F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    trace!(cri.op = op, "CRI call without deadline");
    match fut.await {
        Ok(resp) => Ok(resp.into_inner()),
        Err(status) => Err(CriError::from_status(op, status)),
    }
}

#[async_trait::async_trait]
impl RuntimeService for RemoteRuntime {
    async fn version(&self) -> Result<pb::VersionResponse> {
        let mut c = self.runtime.clone();
        let req = pb::VersionRequest {
            version: "v1".to_string(),
        };
        call(
            "Version",
            self.timeout,
            c.version(request(req, self.timeout)),
        )
        .await
    }

    async fn status(&self) -> Result<pb::StatusResponse> {
        let mut c = self.runtime.clone();
        call(
            "Status",
            self.timeout,
            c.status(request(pb::StatusRequest { verbose: false }, self.timeout)),
        )
        .await
    }

    async fn run_pod_sandbox(
        &self,
        config: pb::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = pb::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        // Upstream gives RunPodSandbox twice the request timeout: CNI setup can be slow.
        let deadline = self.timeout * 2;
        Ok(call(
            "RunPodSandbox",
            deadline,
            c.run_pod_sandbox(request(req, deadline)),
        )
        .await?
        .pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = pb::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        call(
            "StopPodSandbox",
            self.timeout,
            c.stop_pod_sandbox(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = pb::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        call(
            "RemovePodSandbox",
            self.timeout,
            c.remove_pod_sandbox(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<pb::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = pb::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        };
        let resp = call(
            "PodSandboxStatus",
            self.timeout,
            c.pod_sandbox_status(request(req, self.timeout)),
        )
        .await?;
        resp.status.ok_or(CriError::NotFound {
            op: "PodSandboxStatus",
            message: format!("no status for sandbox {id}"),
        })
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<pb::PodSandboxFilter>,
    ) -> Result<Vec<pb::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = pb::ListPodSandboxRequest { filter };
        Ok(call(
            "ListPodSandbox",
            self.timeout,
            c.list_pod_sandbox(request(req, self.timeout)),
        )
        .await?
        .items)
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: pb::ContainerConfig,
        sandbox_config: pb::PodSandboxConfig,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(call(
            "CreateContainer",
            self.timeout,
            c.create_container(request(req, self.timeout)),
        )
        .await?
        .container_id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = pb::StartContainerRequest {
            container_id: id.to_string(),
        };
        call(
            "StartContainer",
            self.timeout,
            c.start_container(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = pb::StopContainerRequest {
            container_id: id.to_string(),
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        // The runtime may take the whole grace period before it kills.
        let deadline = self.timeout + timeout;
        call(
            "StopContainer",
            deadline,
            c.stop_container(request(req, deadline)),
        )
        .await
        .map(drop)
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = pb::RemoveContainerRequest {
            container_id: id.to_string(),
        };
        call(
            "RemoveContainer",
            self.timeout,
            c.remove_container(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }

    async fn list_containers(
        &self,
        filter: Option<pb::ContainerFilter>,
    ) -> Result<Vec<pb::Container>> {
        let mut c = self.runtime.clone();
        let req = pb::ListContainersRequest { filter };
        Ok(call(
            "ListContainers",
            self.timeout,
            c.list_containers(request(req, self.timeout)),
        )
        .await?
        .containers)
    }

    async fn container_status(&self, id: &str) -> Result<pb::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = pb::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        };
        let resp = call(
            "ContainerStatus",
            self.timeout,
            c.container_status(request(req, self.timeout)),
        )
        .await?;
        resp.status.ok_or(CriError::NotFound {
            op: "ContainerStatus",
            message: format!("no status for container {id}"),
        })
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<pb::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let req = pb::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        let deadline = self.timeout + timeout;
        call("ExecSync", deadline, c.exec_sync(request(req, deadline))).await
    }
}

#[async_trait::async_trait]
impl ImageService for RemoteRuntime {
    async fn image_status(&self, image: &str) -> Result<Option<pb::Image>> {
        let mut c = self.image.clone();
        let req = pb::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        Ok(call(
            "ImageStatus",
            self.timeout,
            c.image_status(request(req, self.timeout)),
        )
        .await?
        .image)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<pb::AuthConfig>,
        sandbox_config: Option<pb::PodSandboxConfig>,
    ) -> Result<String> {
        let mut c = self.image.clone();
        let req = pb::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config,
        };
        // No deadline of ours, as upstream: a large image takes as long as it
        // takes, and the runtime cancels a pull that stops making progress.
        // The caller cancels by dropping the future (kubelet shutdown).
        Ok(call_unbounded("PullImage", c.pull_image(req))
            .await?
            .image_ref)
    }

    async fn list_images(&self) -> Result<Vec<pb::Image>> {
        let mut c = self.image.clone();
        let req = pb::ListImagesRequest { filter: None };
        Ok(call(
            "ListImages",
            self.timeout,
            c.list_images(request(req, self.timeout)),
        )
        .await?
        .images)
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let mut c = self.image.clone();
        let req = pb::RemoveImageRequest {
            image: Some(image_spec(image)),
        };
        call(
            "RemoveImage",
            self.timeout,
            c.remove_image(request(req, self.timeout)),
        )
        .await
        .map(drop)
    }
}

fn image_spec(image: &str) -> pb::ImageSpec {
    pb::ImageSpec {
        image: image.to_string(),
        user_specified_image: image.to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
