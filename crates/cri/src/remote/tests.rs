//! Unit tests of the remote runtime client against an in-process CRI server.
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
        ) -> std::result::Result<tonic::Response<pb::VersionResponse>, tonic::Status> {
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
async fn serve<R, I>(runtime: R, image: I, timeout: Duration) -> (tempfile::TempDir, RemoteRuntime)
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
    ) -> std::result::Result<tonic::Response<pb::RunPodSandboxResponse>, tonic::Status> {
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

/// Reopens one container's log; any other container is not found, and a
/// reopen that hangs is cut at the client's deadline.
struct Reopen(tokio::sync::mpsc::UnboundedSender<(String, Option<String>)>);

#[tonic::async_trait]
impl crate::pb::runtime_service_server::RuntimeService for Reopen {
    async fn reopen_container_log(
        &self,
        req: tonic::Request<pb::ReopenContainerLogRequest>,
    ) -> std::result::Result<tonic::Response<pb::ReopenContainerLogResponse>, tonic::Status> {
        let sent = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let id = req.into_inner().container_id;
        let _ = self.0.send((id.clone(), sent));
        match id.as_str() {
            "running" => Ok(tonic::Response::new(pb::ReopenContainerLogResponse {})),
            "hangs" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(tonic::Response::new(pb::ReopenContainerLogResponse {}))
            }
            _ => Err(tonic::Status::not_found("container not found")),
        }
    }
}

#[tokio::test]
async fn reopen_container_log_sends_the_id_with_the_deadline() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (_dir, rt) = serve(Reopen(tx), NoImages, Duration::from_secs(1)).await;
    rt.reopen_container_log("running").await.expect("reopened");
    let (id, sent) = rx.recv().await.expect("the runtime saw the call");
    assert_eq!(id, "running");
    assert!(sent.is_some(), "the deadline travels with the call");
    let err = rt
        .reopen_container_log("gone")
        .await
        .expect_err("not found");
    assert!(err.is_not_found(), "{err:?}");
    let err = rt
        .reopen_container_log("hangs")
        .await
        .expect_err("deadline");
    // Cut by our deadline, or by the server honouring the one it was sent.
    assert!(
        matches!(
            err,
            CriError::Timeout {
                op: "ReopenContainerLog",
                ..
            } | CriError::Rpc {
                code: tonic::Code::Cancelled,
                ..
            }
        ),
        "{err:?}"
    );
}
