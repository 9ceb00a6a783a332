//! The proxy's CRI servers: every `runtime.v1` `RuntimeService` and
//! `ImageService` method goes through [`Shared::call`], which counts it,
//! applies the first matching fault rule and forwards it to the backend
//! runtime (upstream's CRI seen from the kubelet's side, `k8s.io/cri-api`).

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cri::pb;
use cri::pb::image_service_client::ImageServiceClient;
use cri::pb::image_service_server::ImageService;
use cri::pb::runtime_service_client::RuntimeServiceClient;
use cri::pb::runtime_service_server::RuntimeService;
use parking_lot::Mutex;
use prost::Message;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::info;

use super::pods::{Learn, PodIndex, Target};
use super::rules::{Action, RuleTable};

/// Encoded answers by (method, encoded request).
type Answers = HashMap<(&'static str, Vec<u8>), Vec<u8>>;

/// State shared by the servers, the accept loop and the test's handle.
pub(super) struct Shared {
    pub(super) rules: Arc<RuleTable>,
    pub(super) pods: PodIndex,
    calls: Mutex<HashMap<&'static str, usize>>,
    /// Last answer per (method, encoded request), for [`Action::Stale`].
    answers: Mutex<Answers>,
    /// Duplicates of the accepted client sockets, to shut them down.
    pub(super) conns: Mutex<Vec<std::os::unix::net::UnixStream>>,
    pub(super) held: AtomicUsize,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    backend_timeout: Duration,
}

/// Counts a call held by [`Action::Hang`] while it is held.
struct Held<'a>(&'a AtomicUsize);

impl<'a> Held<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub(super) fn new(channel: Channel, backend_timeout: Duration) -> Self {
        let max = 16 * 1024 * 1024;
        Self {
            rules: Arc::default(),
            pods: PodIndex::default(),
            calls: Mutex::default(),
            answers: Mutex::default(),
            conns: Mutex::default(),
            held: AtomicUsize::new(0),
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(max),
            image: ImageServiceClient::new(channel).max_decoding_message_size(max),
            backend_timeout,
        }
    }

    pub(super) fn calls(&self, method: &str) -> usize {
        self.calls.lock().get(method).copied().unwrap_or(0)
    }

    /// Shuts down every accepted client connection.
    pub(super) fn drop_connections(&self) {
        for c in self.conns.lock().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// [`Shared::fault_and_forward`] within the client's deadline, answering
    /// `DeadlineExceeded` when it passes, as a Go gRPC server (containerd)
    /// does; tonic's own deadline, a little later, would answer `Cancelled`.
    async fn call<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        deadline: Option<Duration>,
        target: Target,
        req: Req,
        forward: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Message + Clone + Learn<Resp>,
        Resp: Message + Default + Any,
        F: FnOnce(Req) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let call = self.fault_and_forward(method, target, req, forward);
        match deadline {
            None => call.await,
            Some(d) => {
                let early = d.saturating_sub((d / 10).min(Duration::from_millis(10)));
                tokio::time::timeout(early, call)
                    .await
                    .unwrap_or_else(|_| Err(Status::deadline_exceeded("context deadline exceeded")))
            }
        }
    }

    /// Counts, applies the first matching rule, forwards with `forward`.
    async fn fault_and_forward<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        target: Target,
        req: Req,
        forward: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Message + Clone + Learn<Resp>,
        Resp: Message + Default + Any,
        F: FnOnce(Req) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        *self.calls.lock().entry(method).or_default() += 1;
        let key = (method, req.encode_to_vec());
        let mut edit = None;
        if let Some(p) = self.rules.pick(method, &target, &self.pods) {
            info!(
                method,
                rule = p.id,
                action = p.action.name(),
                ?target,
                "CRI proxy: fault applied"
            );
            match p.action {
                Action::Delay(d) => tokio::time::sleep(d).await,
                Action::Hang => {
                    let _held = Held::new(&self.held);
                    let mut released = p.released;
                    // Dropped with the whole future when the client goes away.
                    let _ = released.wait_for(|r| *r).await;
                    info!(method, rule = p.id, "CRI proxy: held call released");
                }
                Action::Fail(code, message) => return Err(Status::new(code, message)),
                Action::DropConnection => {
                    self.drop_connections();
                    return Err(Status::unavailable("connection dropped by the CRI proxy"));
                }
                Action::Stale => {
                    let old = self.answers.lock().get(&key).cloned();
                    if let Some(old) = old.and_then(|b| Resp::decode(b.as_slice()).ok()) {
                        return Ok(Response::new(old));
                    }
                }
                Action::Edit(f) => edit = Some(f),
            }
        }
        let resp = tokio::time::timeout(self.backend_timeout, forward(req.clone()))
            .await
            .map_err(|_| Status::deadline_exceeded("CRI proxy: backend did not answer in time"))??
            .into_inner();
        req.learn(&resp, &self.pods);
        self.answers.lock().insert(key, resp.encode_to_vec());
        let mut resp = resp;
        if let Some(f) = edit {
            f(&mut resp);
        }
        Ok(Response::new(resp))
    }
}

/// The client's deadline from its `grpc-timeout` header (gRPC over HTTP/2:
/// an integer of up to 8 digits and a unit, `H`, `M`, `S`, `m`, `u`, `n`).
pub(super) fn client_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The servers' face of [`Shared`].
#[derive(Clone)]
pub(super) struct Proxy(pub(super) Arc<Shared>);

/// Pairs whose answers teach the proxy nothing about pods.
macro_rules! no_learning {
    ($($req:ident => $resp:ident),* $(,)?) => {
        $(impl Learn<pb::$resp> for pb::$req {})*
    };
}

no_learning!(
    VersionRequest => VersionResponse,
    StopPodSandboxRequest => StopPodSandboxResponse,
    RemovePodSandboxRequest => RemovePodSandboxResponse,
    StartContainerRequest => StartContainerResponse,
    StopContainerRequest => StopContainerResponse,
    RemoveContainerRequest => RemoveContainerResponse,
    ContainerStatusRequest => ContainerStatusResponse,
    UpdateContainerResourcesRequest => UpdateContainerResourcesResponse,
    ReopenContainerLogRequest => ReopenContainerLogResponse,
    ExecSyncRequest => ExecSyncResponse,
    ExecRequest => ExecResponse,
    AttachRequest => AttachResponse,
    PortForwardRequest => PortForwardResponse,
    ContainerStatsRequest => ContainerStatsResponse,
    ListContainerStatsRequest => ListContainerStatsResponse,
    PodSandboxStatsRequest => PodSandboxStatsResponse,
    ListPodSandboxStatsRequest => ListPodSandboxStatsResponse,
    UpdateRuntimeConfigRequest => UpdateRuntimeConfigResponse,
    StatusRequest => StatusResponse,
    RuntimeConfigRequest => RuntimeConfigResponse,
    ListImagesRequest => ListImagesResponse,
    ImageStatusRequest => ImageStatusResponse,
    PullImageRequest => PullImageResponse,
    RemoveImageRequest => RemoveImageResponse,
    ImageFsInfoRequest => ImageFsInfoResponse,
);

/// Implements a generated server trait by forwarding through `Shared::call`
/// with client `$client`; `|r| target` says which pod a request names.
macro_rules! forward {
    ($trait:ident, $client:ident: $($fn:ident $name:literal $req:ident => $resp:ident, |$r:ident| $target:expr;)*) => {
        #[tonic::async_trait]
        impl $trait for Proxy {
            $(
                async fn $fn(
                    &self,
                    request: Request<pb::$req>,
                ) -> Result<Response<pb::$resp>, Status> {
                    let deadline = client_deadline(request.metadata());
                    let $r = request.into_inner();
                    let target: Target = $target;
                    let client = self.0.$client.clone();
                    self.0
                        .call($name, deadline, target, $r, move |req| async move {
                            let mut client = client;
                            client.$fn(req).await
                        })
                        .await
                }
            )*
        }
    };
}

forward!(RuntimeService, runtime:
    version "Version" VersionRequest => VersionResponse, |r| { let _ = &r; Target::default() };
    run_pod_sandbox "RunPodSandbox" RunPodSandboxRequest => RunPodSandboxResponse,
        |r| Target::config(r.config.as_ref());
    stop_pod_sandbox "StopPodSandbox" StopPodSandboxRequest => StopPodSandboxResponse,
        |r| Target::sandbox(&r.pod_sandbox_id);
    remove_pod_sandbox "RemovePodSandbox" RemovePodSandboxRequest => RemovePodSandboxResponse,
        |r| Target::sandbox(&r.pod_sandbox_id);
    pod_sandbox_status "PodSandboxStatus" PodSandboxStatusRequest => PodSandboxStatusResponse,
        |r| Target::sandbox(&r.pod_sandbox_id);
    list_pod_sandbox "ListPodSandbox" ListPodSandboxRequest => ListPodSandboxResponse,
        |r| Target::sandbox(r.filter.as_ref().map_or("", |f| f.id.as_str()));
    create_container "CreateContainer" CreateContainerRequest => CreateContainerResponse,
        |r| Target::sandbox(&r.pod_sandbox_id);
    start_container "StartContainer" StartContainerRequest => StartContainerResponse,
        |r| Target::container(&r.container_id);
    stop_container "StopContainer" StopContainerRequest => StopContainerResponse,
        |r| Target::container(&r.container_id);
    remove_container "RemoveContainer" RemoveContainerRequest => RemoveContainerResponse,
        |r| Target::container(&r.container_id);
    list_containers "ListContainers" ListContainersRequest => ListContainersResponse,
        |r| Target::sandbox(r.filter.as_ref().map_or("", |f| f.pod_sandbox_id.as_str()));
    container_status "ContainerStatus" ContainerStatusRequest => ContainerStatusResponse,
        |r| Target::container(&r.container_id);
    update_container_resources "UpdateContainerResources"
        UpdateContainerResourcesRequest => UpdateContainerResourcesResponse,
        |r| Target::container(&r.container_id);
    reopen_container_log "ReopenContainerLog" ReopenContainerLogRequest => ReopenContainerLogResponse,
        |r| Target::container(&r.container_id);
    exec_sync "ExecSync" ExecSyncRequest => ExecSyncResponse,
        |r| Target::container(&r.container_id);
    exec "Exec" ExecRequest => ExecResponse, |r| Target::container(&r.container_id);
    attach "Attach" AttachRequest => AttachResponse, |r| Target::container(&r.container_id);
    port_forward "PortForward" PortForwardRequest => PortForwardResponse,
        |r| Target::sandbox(&r.pod_sandbox_id);
    container_stats "ContainerStats" ContainerStatsRequest => ContainerStatsResponse,
        |r| Target::container(&r.container_id);
    list_container_stats "ListContainerStats" ListContainerStatsRequest => ListContainerStatsResponse,
        |r| Target::sandbox(r.filter.as_ref().map_or("", |f| f.pod_sandbox_id.as_str()));
    pod_sandbox_stats "PodSandboxStats" PodSandboxStatsRequest => PodSandboxStatsResponse,
        |r| Target::sandbox(&r.pod_sandbox_id);
    list_pod_sandbox_stats "ListPodSandboxStats" ListPodSandboxStatsRequest => ListPodSandboxStatsResponse,
        |r| Target::sandbox(r.filter.as_ref().map_or("", |f| f.id.as_str()));
    update_runtime_config "UpdateRuntimeConfig" UpdateRuntimeConfigRequest => UpdateRuntimeConfigResponse,
        |r| { let _ = &r; Target::default() };
    status "Status" StatusRequest => StatusResponse, |r| { let _ = &r; Target::default() };
    runtime_config "RuntimeConfig" RuntimeConfigRequest => RuntimeConfigResponse,
        |r| { let _ = &r; Target::default() };
);

forward!(ImageService, image:
    list_images "ListImages" ListImagesRequest => ListImagesResponse, |r| { let _ = &r; Target::default() };
    image_status "ImageStatus" ImageStatusRequest => ImageStatusResponse, |r| { let _ = &r; Target::default() };
    pull_image "PullImage" PullImageRequest => PullImageResponse,
        |r| Target::config(r.sandbox_config.as_ref());
    remove_image "RemoveImage" RemoveImageRequest => RemoveImageResponse, |r| { let _ = &r; Target::default() };
    image_fs_info "ImageFsInfo" ImageFsInfoRequest => ImageFsInfoResponse, |r| { let _ = &r; Target::default() };
);
