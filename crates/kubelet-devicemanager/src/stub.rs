//! A small device plugin (upstream `plugin/v1beta1/stub.go`), for tests of
//! the kubelet against the deviceplugin API: it serves `DevicePlugin` on a
//! socket, streams its device list on every change, answers
//! `GetPreferredAllocation` from a fixed preference, `Allocate` with an env,
//! a mount and a device node per device (or what a custom function
//! returns), records every call, and registers with the kubelet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream, WatchStream};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Endpoint, Uri};
use tonic::{Request, Response, Status};

use crate::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::v1beta1::registration_client::RegistrationClient;
use crate::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, DeviceSpec, Empty, HEALTHY, ListAndWatchResponse, Mount,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest, UNHEALTHY, VERSION,
};

type ListAndWatchStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>,
>;

/// What the stub answers to `Allocate` for one container's device ids.
pub type AllocateFn = Arc<dyn Fn(&[String]) -> ContainerAllocateResponse + Send + Sync>;

/// Awaited inside each `GetPreferredAllocation` before it answers (tests
/// change the devices while the kubelet waits for the answer).
pub type PreferredHook =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A device with the given id and health.
pub fn device(id: &str, healthy: bool) -> Device {
    Device {
        id: id.to_string(),
        health: if healthy { HEALTHY } else { UNHEALTHY }.to_string(),
        topology: None,
    }
}

/// The stub's default `Allocate` answer: `STUB_DEVICES=<ids joined by ,>`,
/// a read-only mount of `/opt/stub` at `/usr/local/stub`, `/dev/host-<id>`
/// as `/dev/<id>` (rw), an annotation and a CDI device per id.
pub fn default_allocate(ids: &[String]) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: BTreeMap::from([("STUB_DEVICES".to_string(), ids.join(","))]),
        mounts: vec![Mount {
            container_path: "/usr/local/stub".into(),
            host_path: "/opt/stub".into(),
            read_only: true,
        }],
        devices: ids
            .iter()
            .map(|d| DeviceSpec {
                container_path: format!("/dev/{d}"),
                host_path: format!("/dev/host-{d}"),
                permissions: "rw".into(),
            })
            .collect(),
        annotations: BTreeMap::from([("stub/annotation".to_string(), "yes".to_string())]),
        cdi_devices: ids
            .iter()
            .map(|d| CdiDevice {
                name: format!("stub.example.com/dev={d}"),
            })
            .collect(),
    }
}

/// The calls the stub received.
#[derive(Debug, Default, Clone)]
pub struct Calls {
    /// Device ids of each `Allocate` container request.
    pub allocate: Vec<Vec<String>>,
    /// Each `GetPreferredAllocation` container request.
    pub preferred: Vec<ContainerPreferredAllocationRequest>,
    /// Device ids of each `PreStartContainer`.
    pub pre_start: Vec<Vec<String>>,
}

/// How the stub behaves.
#[derive(Clone)]
pub struct StubConfig {
    /// Its `GetDevicePluginOptions` answer.
    pub options: DevicePluginOptions,
    /// Device ids it prefers, in order, among those offered.
    pub preferred: Vec<String>,
    /// Its `Allocate` answer per container.
    pub allocate: AllocateFn,
    /// Awaited in `GetPreferredAllocation` before it answers.
    pub preferred_hook: Option<PreferredHook>,
}

impl Default for StubConfig {
    fn default() -> Self {
        Self {
            options: DevicePluginOptions::default(),
            preferred: Vec::new(),
            allocate: Arc::new(default_allocate),
            preferred_hook: None,
        }
    }
}

impl std::fmt::Debug for StubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StubConfig")
            .field("options", &self.options)
            .field("preferred", &self.preferred)
            .finish_non_exhaustive()
    }
}

struct Service {
    config: StubConfig,
    devices: watch::Receiver<Vec<Device>>,
    calls: Arc<Mutex<Calls>>,
    stop: CancellationToken,
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.config.options))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<ListAndWatchStream>, Status> {
        // Forward every device list until the stub stops; then the stream ends.
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let mut devices = WatchStream::new(self.devices.clone());
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    next = devices.next() => match next {
                        Some(devices) => {
                            if tx.send(Ok(ListAndWatchResponse { devices })).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let r = req.into_inner();
        self.calls
            .lock()
            .preferred
            .extend(r.container_requests.clone());
        if let Some(hook) = &self.config.preferred_hook {
            hook().await;
        }
        let container_responses = r
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: self
                    .config
                    .preferred
                    .iter()
                    .filter(|d| c.available_device_i_ds.contains(d))
                    .take(usize::try_from(c.allocation_size).unwrap_or(0))
                    .cloned()
                    .collect(),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let r = req.into_inner();
        let mut container_responses = Vec::new();
        for c in r.container_requests {
            self.calls.lock().allocate.push(c.devices_ids.clone());
            container_responses.push((self.config.allocate)(&c.devices_ids));
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        req: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.calls
            .lock()
            .pre_start
            .push(req.into_inner().devices_ids);
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A running stub device plugin.
pub struct Stub {
    socket: PathBuf,
    config: StubConfig,
    devices: watch::Sender<Vec<Device>>,
    calls: Arc<Mutex<Calls>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Stub {
    /// Serves the stub on `socket` (a stale file there is replaced).
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn start(socket: &Path, devices: Vec<Device>, config: StubConfig) -> std::io::Result<Self> {
        let (tx, _) = watch::channel(devices);
        let calls = Arc::new(Mutex::new(Calls::default()));
        let (stop, task) = serve(socket, &config, &tx, &calls)?;
        Ok(Self {
            socket: socket.to_path_buf(),
            config,
            devices: tx,
            calls,
            stop,
            task,
        })
    }

    /// Stops serving and serves again on a fresh socket at the same path,
    /// keeping its devices and recorded calls: what upstream's sample plugin
    /// does when it sees the kubelet restart (the kubelet removes plugin
    /// sockets on start). Register again afterwards.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub async fn serve_again(&mut self) -> std::io::Result<()> {
        self.stop.cancel();
        let old = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = tokio::time::timeout(Duration::from_secs(5), old).await;
        let (stop, task) = serve(&self.socket, &self.config, &self.devices, &self.calls)?;
        self.stop = stop;
        self.task = task;
        Ok(())
    }

    /// The socket the stub serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Replaces the device list; the kubelet receives it on `ListAndWatch`.
    pub fn set_devices(&self, devices: Vec<Device>) {
        self.devices.send_replace(devices);
    }

    /// The calls received so far.
    pub fn calls(&self) -> Calls {
        self.calls.lock().clone()
    }

    /// Registers with the kubelet's `Registration` socket as `resource`
    /// speaking `version`; the endpoint is the stub's socket file name (it
    /// must be in the same directory as `kubelet_sock`).
    ///
    /// # Errors
    /// The kubelet's refusal, or a connection failure as `Status::unavailable`.
    pub async fn register(
        &self,
        kubelet_sock: &Path,
        resource: &str,
        version: &str,
    ) -> Result<(), Status> {
        let endpoint = self
            .socket
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let mut client = registration_client(kubelet_sock, Duration::from_secs(10)).await?;
        let req = RegisterRequest {
            version: version.to_string(),
            endpoint,
            resource_name: resource.to_string(),
            options: None,
        };
        match tokio::time::timeout(Duration::from_secs(30), client.register(req)).await {
            Ok(res) => res.map(|_| ()),
            Err(_) => Err(Status::deadline_exceeded("Register timed out")),
        }
    }

    /// Registers as `resource` with this kubelet's API version.
    ///
    /// # Errors
    /// As [`Stub::register`].
    pub async fn register_v1beta1(
        &self,
        kubelet_sock: &Path,
        resource: &str,
    ) -> Result<(), Status> {
        self.register(kubelet_sock, resource, VERSION).await
    }

    /// Stops serving and removes the socket: the kubelet's `ListAndWatch` ends.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        let _ = tokio::fs::remove_file(&self.socket).await;
    }
}

/// Binds `socket` (replacing a stale file) and serves the plugin on it until
/// the returned token is cancelled.
fn serve(
    socket: &Path,
    config: &StubConfig,
    devices: &watch::Sender<Vec<Device>>,
    calls: &Arc<Mutex<Calls>>,
) -> std::io::Result<(CancellationToken, tokio::task::JoinHandle<()>)> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(socket)?;
    let stop = CancellationToken::new();
    let svc = Service {
        config: config.clone(),
        devices: devices.subscribe(),
        calls: calls.clone(),
        stop: stop.clone(),
    };
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(svc))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                token.cancelled_owned(),
            )
            .await;
    });
    Ok((stop, task))
}

async fn registration_client(
    sock: &Path,
    timeout: Duration,
) -> Result<RegistrationClient<tonic::transport::Channel>, Status> {
    let path = sock.to_path_buf();
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(timeout);
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| Status::unavailable(format!("connecting to {}: {e}", sock.display())))?;
    Ok(RegistrationClient::new(channel))
}
