//! The kubelet's side of one device plugin (upstream `endpoint.go` and
//! `plugin/v1beta1/client.go`): a gRPC channel to the plugin's socket, each
//! call under a deadline, and the `ListAndWatch` stream.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{DeviceManagerError, Result};
use crate::v1beta1::device_plugin_client::DevicePluginClient;
use crate::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest,
    ContainerPreferredAllocationRequest, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreferredAllocationRequest, PreferredAllocationResponse,
};

/// A connected device plugin.
#[derive(Clone, Debug)]
pub(crate) struct PluginClient {
    resource: String,
    socket: PathBuf,
    client: DevicePluginClient<Channel>,
    timeout: Duration,
}

impl PluginClient {
    /// Dials `socket` within `timeout` (upstream dials with a 10 s deadline and
    /// blocks until connected).
    pub(crate) async fn connect(resource: &str, socket: &Path, timeout: Duration) -> Result<Self> {
        let path = socket.to_path_buf();
        // The authority is ignored by the connector; tonic needs some URI.
        let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(timeout);
        let channel = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }));
        let channel = tokio::time::timeout(timeout, channel)
            .await
            .map_err(|_| {
                DeviceManagerError::Dial(format!(
                    "timed out after {timeout:?} dialing {}",
                    socket.display()
                ))
            })?
            .map_err(|e| DeviceManagerError::Dial(format!("{}: {e}", socket.display())))?;
        Ok(Self {
            resource: resource.to_string(),
            socket: socket.to_path_buf(),
            client: DevicePluginClient::new(channel),
            timeout,
        })
    }

    /// The plugin's socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    async fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> std::result::Result<T, String> {
        match tokio::time::timeout(self.timeout, fut).await {
            Err(_) => Err(format!(
                "{what} to device plugin {} timed out after {:?}",
                self.resource, self.timeout
            )),
            Ok(Err(status)) => Err(format!(
                "rpc error: code = {:?} desc = {}",
                status.code(),
                status.message()
            )),
            Ok(Ok(resp)) => Ok(resp.into_inner()),
        }
    }

    /// `GetDevicePluginOptions`.
    pub(crate) async fn options(&self) -> Result<DevicePluginOptions> {
        let mut c = self.client.clone();
        self.call(
            "GetDevicePluginOptions",
            c.get_device_plugin_options(Empty {}),
        )
        .await
        .map_err(DeviceManagerError::GetOptions)
    }

    /// `Allocate` for one container.
    pub(crate) async fn allocate(&self, devices: Vec<String>) -> Result<AllocateResponse> {
        let mut c = self.client.clone();
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: devices,
            }],
        };
        self.call("Allocate", c.allocate(req))
            .await
            .map_err(DeviceManagerError::Rpc)
    }

    /// `GetPreferredAllocation` for one container.
    pub(crate) async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: i32,
    ) -> Result<PreferredAllocationResponse> {
        let mut c = self.client.clone();
        let req = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must_include,
                allocation_size: size,
            }],
        };
        self.call("GetPreferredAllocation", c.get_preferred_allocation(req))
            .await
            .map_err(DeviceManagerError::PreferredAllocation)
    }

    /// `PreStartContainer`.
    pub(crate) async fn pre_start_container(&self, devices: Vec<String>) -> Result<()> {
        let mut c = self.client.clone();
        let req = PreStartContainerRequest {
            devices_ids: devices,
        };
        self.call("PreStartContainer", c.pre_start_container(req))
            .await
            .map(|_| ())
            .map_err(DeviceManagerError::PreStart)
    }

    /// Opens `ListAndWatch` (the open is under the deadline, the stream is not).
    pub(crate) async fn list_and_watch(
        &self,
    ) -> std::result::Result<tonic::Streaming<ListAndWatchResponse>, String> {
        let mut c = self.client.clone();
        self.call("ListAndWatch", c.list_and_watch(Empty {})).await
    }
}
