//! The kubelet's side of `pluginregistration.v1` (upstream
//! `operationexecutor.dial` and `notifyPlugin`): a tonic client over the
//! plugin's registration socket, each call bounded by upstream's deadline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{DialFailure, Error};
use crate::pb::registration_client::RegistrationClient;
use crate::pb::{InfoRequest, PluginInfo, RegistrationStatus};

/// Deadlines of the registration calls (upstream `dialTimeoutDuration`,
/// the 1 s `GetInfo` context and `notifyTimeoutDuration`), and of the
/// connection monitor's `GetInfo` (upstream `getInfoTimeout`).
#[derive(Debug, Clone, Copy)]
pub struct CallTimeouts {
    /// Connecting to the registration socket.
    pub dial: Duration,
    /// `GetInfo`.
    pub get_info: Duration,
    /// `NotifyRegistrationStatus`.
    pub notify: Duration,
    /// The connection monitor's `GetInfo`.
    pub check: Duration,
}

impl Default for CallTimeouts {
    fn default() -> Self {
        Self {
            dial: Duration::from_secs(10),
            get_info: Duration::from_secs(1),
            notify: Duration::from_secs(5),
            check: Duration::from_secs(10),
        }
    }
}

/// A connection to one plugin's registration socket.
pub struct PluginClient {
    socket: PathBuf,
    inner: RegistrationClient<Channel>,
    timeouts: CallTimeouts,
}

impl PluginClient {
    /// Connects to `socket`, failing after `timeouts.dial`.
    pub async fn dial(socket: &Path, timeouts: CallTimeouts) -> Result<Self, Error> {
        let path = socket.to_path_buf();
        // The connector ignores the authority; tonic needs some URI.
        let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(timeouts.dial);
        let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }));
        let channel = match tokio::time::timeout(timeouts.dial, connect).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => {
                return Err(Error::Dial {
                    socket: socket.to_path_buf(),
                    reason: DialFailure::Transport(e),
                });
            }
            Err(_) => {
                return Err(Error::Dial {
                    socket: socket.to_path_buf(),
                    reason: DialFailure::Timeout,
                });
            }
        };
        Ok(Self {
            socket: socket.to_path_buf(),
            inner: RegistrationClient::new(channel),
            timeouts,
        })
    }

    /// Whether the plugin at `socket` answers `GetInfo` (upstream
    /// `checkConnection`), within the monitor's deadline.
    pub async fn check(socket: &Path, timeouts: CallTimeouts) -> Result<(), Error> {
        let mut client = Self::dial(socket, timeouts).await?;
        client.call_get_info(timeouts.check).await.map(drop)
    }

    /// `GetInfo` within its deadline.
    pub async fn get_info(&mut self) -> Result<PluginInfo, Error> {
        self.call_get_info(self.timeouts.get_info).await
    }

    async fn call_get_info(&mut self, deadline: Duration) -> Result<PluginInfo, Error> {
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(deadline);
        let call = self.inner.get_info(request);
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Error::GetInfo {
                socket: self.socket.clone(),
                status,
            }),
            Err(_) => Err(Error::GetInfo {
                socket: self.socket.clone(),
                status: tonic::Status::deadline_exceeded("context deadline exceeded"),
            }),
        }
    }

    /// `NotifyRegistrationStatus` within its deadline.
    pub async fn notify(&mut self, registered: bool, error: &str) -> Result<(), Error> {
        let mut request = tonic::Request::new(RegistrationStatus {
            plugin_registered: registered,
            error: error.to_string(),
        });
        request.set_timeout(self.timeouts.notify);
        let call = self.inner.notify_registration_status(request);
        let status = match tokio::time::timeout(self.timeouts.notify, call).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(status)) => status,
            Err(_) => tonic::Status::deadline_exceeded("context deadline exceeded"),
        };
        Err(Error::Notify {
            socket: self.socket.clone(),
            status,
        })
    }
}
