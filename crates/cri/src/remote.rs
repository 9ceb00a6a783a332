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

    async fn status(&self) -> Result<pb::RuntimeStatus> {
        let mut c = self.runtime.clone();
        let resp = call(
            "Status",
            self.timeout,
            c.status(request(pb::StatusRequest { verbose: false }, self.timeout)),
        )
        .await?;
        Ok(resp.status.unwrap_or_default())
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
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        assert_eq!(
            endpoint_path("unix:///run/containerd/containerd.sock").ok(),
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        assert_eq!(
            endpoint_path("/run/x.sock").ok(),
            Some(PathBuf::from("/run/x.sock"))
        );
        assert!(endpoint_path("tcp://1.2.3.4:5").is_err());
        assert!(endpoint_path("relative.sock").is_err());
    }

    #[tokio::test]
    async fn unreachable_runtime_is_unavailable_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("missing.sock");
        let rt = RemoteRuntime::new(
            &format!("unix://{}", sock.display()),
            None,
            Duration::from_secs(2),
        )
        .expect("lazy client");
        let err = rt.version().await.expect_err("no runtime there");
        assert!(err.is_retryable(), "{err}");
    }

    /// A tonic server on a temp socket answers through the real client path.
    #[tokio::test]
    async fn talks_to_a_server_over_uds() {
        use crate::pb::runtime_service_server::{RuntimeService as Srv, RuntimeServiceServer};
        struct V;
        #[tonic::async_trait]
        impl Srv for V {
            async fn version(
                &self,
                _: tonic::Request<pb::VersionRequest>,
            ) -> std::result::Result<tonic::Response<pb::VersionResponse>, tonic::Status>
            {
                Ok(tonic::Response::new(pb::VersionResponse {
                    version: "0.1.0".into(),
                    runtime_name: "fake".into(),
                    runtime_version: "9".into(),
                    runtime_api_version: "v1".into(),
                }))
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(V))
                .serve_with_incoming(incoming),
        );
        let rt = RemoteRuntime::new(sock.to_str().expect("utf8"), None, Duration::from_secs(5))
            .expect("client");
        let v = rt.version().await.expect("version");
        assert_eq!(v.runtime_name, "fake");
        // Methods the test server does not implement come back classified, not panicking.
        let err = rt.list_containers(None).await.expect_err("unimplemented");
        assert!(
            matches!(
                err,
                CriError::Rpc {
                    code: tonic::Code::Unimplemented,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// Serves `runtime` and `image` on a temp socket; returns a client with `timeout`.
    async fn serve<R, I>(
        runtime: R,
        image: I,
        timeout: Duration,
    ) -> (tempfile::TempDir, RemoteRuntime)
    where
        R: crate::pb::runtime_service_server::RuntimeService,
        I: crate::pb::image_service_server::ImageService,
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(crate::pb::runtime_service_server::RuntimeServiceServer::new(runtime))
                .add_service(crate::pb::image_service_server::ImageServiceServer::new(
                    image,
                ))
                .serve_with_incoming(incoming),
        );
        let rt = RemoteRuntime::new(sock.to_str().expect("utf8"), None, timeout).expect("client");
        (dir, rt)
    }

    /// Answers RunPodSandbox with DeadlineExceeded, noting the deadline it was sent.
    struct SlowSandbox(tokio::sync::mpsc::UnboundedSender<Option<String>>);

    #[tonic::async_trait]
    impl crate::pb::runtime_service_server::RuntimeService for SlowSandbox {
        async fn run_pod_sandbox(
            &self,
            req: tonic::Request<pb::RunPodSandboxRequest>,
        ) -> std::result::Result<tonic::Response<pb::RunPodSandboxResponse>, tonic::Status>
        {
            let sent = req
                .metadata()
                .get("grpc-timeout")
                .and_then(|v| v.to_str().ok())
                .map(String::from);
            let _ = self.0.send(sent);
            Err(tonic::Status::deadline_exceeded(
                "context deadline exceeded",
            ))
        }
    }

    /// Pulls take `delay`; a pull whose caller went away is reported on `dropped`.
    struct SlowPull {
        delay: Duration,
        dropped: tokio::sync::mpsc::UnboundedSender<()>,
    }

    struct OnDrop(tokio::sync::mpsc::UnboundedSender<()>, bool);

    impl Drop for OnDrop {
        fn drop(&mut self) {
            if !self.1 {
                let _ = self.0.send(());
            }
        }
    }

    #[tonic::async_trait]
    impl crate::pb::image_service_server::ImageService for SlowPull {
        async fn pull_image(
            &self,
            _: tonic::Request<pb::PullImageRequest>,
        ) -> std::result::Result<tonic::Response<pb::PullImageResponse>, tonic::Status> {
            let mut guard = OnDrop(self.dropped.clone(), false);
            tokio::time::sleep(self.delay).await;
            guard.1 = true;
            Ok(tonic::Response::new(pb::PullImageResponse {
                image_ref: "sha256:big".into(),
            }))
        }
    }

    struct NoImages;

    #[tonic::async_trait]
    impl crate::pb::image_service_server::ImageService for NoImages {}

    struct NoRuntime;

    #[tonic::async_trait]
    impl crate::pb::runtime_service_server::RuntimeService for NoRuntime {}

    #[tokio::test]
    async fn deadline_exceeded_reports_the_deadline_sent() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (_dir, rt) = serve(SlowSandbox(tx), NoImages, Duration::from_secs(3)).await;
        let err = rt
            .run_pod_sandbox(pb::PodSandboxConfig::default(), "")
            .await
            .expect_err("deadline exceeded");
        assert!(
            matches!(err, CriError::Timeout { op: "RunPodSandbox", timeout } if timeout == Duration::from_secs(6)),
            "{err:?}"
        );
        assert!(err.to_string().contains("6s"), "{err}");
        // The runtime was told the deadline, as upstream's context carries it.
        let sent = rx.recv().await.flatten().expect("grpc-timeout header");
        assert!(
            sent.ends_with('m') || sent.ends_with('u') || sent.ends_with('S'),
            "{sent}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pulls_have_no_fixed_cap() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        // Twenty minutes: longer than any cap kubelet-rs used to set (5 minutes).
        let slow = SlowPull {
            delay: Duration::from_secs(1200),
            dropped: tx,
        };
        let (_dir, rt) = serve(NoRuntime, slow, Duration::from_secs(2)).await;
        let image_ref = rt.pull_image("big:1", None, None).await.expect("pull");
        assert_eq!(image_ref, "sha256:big");
    }

    #[tokio::test]
    async fn dropping_a_pull_cancels_it_on_the_runtime() {
        let (tx, mut dropped) = tokio::sync::mpsc::unbounded_channel();
        let slow = SlowPull {
            delay: Duration::from_secs(3600),
            dropped: tx,
        };
        let (_dir, rt) = serve(NoRuntime, slow, Duration::from_secs(2)).await;
        let pull = tokio::spawn(async move { rt.pull_image("big:1", None, None).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        pull.abort();
        let seen = tokio::time::timeout(Duration::from_secs(5), dropped.recv()).await;
        assert_eq!(
            seen.ok().flatten(),
            Some(()),
            "the runtime saw the pull cancelled"
        );
    }
}
