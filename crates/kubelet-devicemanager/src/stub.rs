//! A small device plugin (what upstream's `stub.go` does): serves
//! `DevicePlugin` on `<dir>/<name>`, streams its device list on every change,
//! answers `Allocate` with an env, a mount and a device node per device, and
//! registers with the kubelet's `Registration` socket.

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
use crate::v1beta1::*;

type ListAndWatchStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>,
>;

pub(crate) fn device(id: &str, healthy: bool) -> Device {
    Device {
        id: id.to_string(),
        health: if healthy { HEALTHY } else { UNHEALTHY }.to_string(),
        topology: None,
    }
}

#[derive(Default)]
pub(crate) struct Calls {
    pub allocate: Vec<Vec<String>>,
    pub preferred: Vec<ContainerPreferredAllocationRequest>,
    pub pre_start: Vec<Vec<String>>,
}

struct Service {
    opts: DevicePluginOptions,
    devices: watch::Receiver<Vec<Device>>,
    preferred: Vec<String>,
    calls: Arc<Mutex<Calls>>,
    stop: CancellationToken,
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.opts))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<ListAndWatchStream>, Status> {
        // Forward every device list until the plugin stops; then the stream ends.
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
        let container_responses = r
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: self
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
        let mut out = Vec::new();
        for c in r.container_requests {
            self.calls.lock().allocate.push(c.devices_ids.clone());
            out.push(ContainerAllocateResponse {
                envs: BTreeMap::from([("FAKE_DEVICES".to_string(), c.devices_ids.join(","))]),
                mounts: vec![Mount {
                    container_path: "/usr/local/fake".into(),
                    host_path: "/opt/fake".into(),
                    read_only: true,
                }],
                devices: c
                    .devices_ids
                    .iter()
                    .map(|d| DeviceSpec {
                        container_path: format!("/dev/{d}"),
                        host_path: format!("/dev/host-{d}"),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: BTreeMap::from([("fake/annotation".to_string(), "yes".to_string())]),
                cdi_devices: c
                    .devices_ids
                    .iter()
                    .map(|d| CdiDevice {
                        name: format!("fake.com/dev={d}"),
                    })
                    .collect(),
            });
        }
        Ok(Response::new(AllocateResponse {
            container_responses: out,
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

/// A running fake plugin.
pub(crate) struct FakePlugin {
    pub socket: PathBuf,
    pub devices: watch::Sender<Vec<Device>>,
    pub calls: Arc<Mutex<Calls>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl FakePlugin {
    pub(crate) async fn start(
        dir: &Path,
        name: &str,
        devices: Vec<Device>,
        opts: DevicePluginOptions,
        preferred: Vec<String>,
    ) -> Self {
        let socket = dir.join(name);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind plugin socket");
        let (tx, rx) = watch::channel(devices);
        let calls = Arc::new(Mutex::new(Calls::default()));
        let stop = CancellationToken::new();
        let svc = Service {
            opts,
            devices: rx,
            preferred,
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
        Self {
            socket,
            devices: tx,
            calls,
            stop,
            task,
        }
    }

    /// Registers with the kubelet socket as `resource`.
    pub(crate) async fn register(
        &self,
        kubelet_sock: &Path,
        resource: &str,
        version: &str,
    ) -> Result<(), Status> {
        let endpoint = self
            .socket
            .file_name()
            .and_then(|n| n.to_str())
            .expect("socket name")
            .to_string();
        let mut client = registration_client(kubelet_sock).await;
        client
            .register(RegisterRequest {
                version: version.to_string(),
                endpoint,
                resource_name: resource.to_string(),
                options: None,
            })
            .await
            .map(|_| ())
    }

    /// Stops serving: the kubelet's ListAndWatch stream ends.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

pub(crate) async fn registration_client(
    sock: &Path,
) -> RegistrationClient<tonic::transport::Channel> {
    let path = sock.to_path_buf();
    let channel = Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .expect("connect to kubelet.sock");
    RegistrationClient::new(channel)
}
