//! The agent's one error type: why the kubelet cannot start, and why a pod
//! sync or kill failed, typed so that a worker can tell a retryable runtime
//! failure from a user-visible container error (upstream keeps the
//! `SyncResult` per step for the same reason).

use std::net::SocketAddr;

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CRI endpoint is unusable.
    #[error("container runtime client: {0}")]
    Runtime(#[from] cri::CriError),
    /// The device plugin manager cannot start (its socket directory or
    /// checkpoint); upstream's container manager fails the start too.
    #[error("Failed to start ContainerManager: the device plugin manager: {0}")]
    DeviceManager(#[source] kubelet_devicemanager::DeviceManagerError),
    /// The container manager cannot start: the cgroup root, the systemd
    /// bus, or a cgroup v1 host refused by `failCgroupV1` (upstream's
    /// "Failed to start ContainerManager" and configuration validation).
    #[error("Failed to start ContainerManager: {0}")]
    ContainerManager(#[source] kubelet_cm::CgroupError),
    /// The pod-resources socket cannot be served.
    #[error("Failed to start the pod-resources API server: {0}")]
    PodResources(#[source] kubelet_podresources::Error),
    /// `--image-credential-provider-config` or its plugins are unusable
    /// (upstream stops the kubelet too).
    #[error("Failed to register CRI auth plugins: {0}")]
    CredentialProviders(#[source] kubelet_credentialprovider::Error),
    /// The healthz address cannot be bound.
    #[error("cannot listen on healthz address {addr}: {source}")]
    Healthz {
        /// Address.
        addr: SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A node API port (10250 or the read-only port) cannot be bound;
    /// upstream exits in that case too.
    #[error("cannot listen on the kubelet {what} address {addr}: {source}")]
    Listen {
        /// Which server.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The node API's authentication or authorization cannot be built.
    #[error("kubelet server auth: {0}")]
    Auth(#[from] kubelet_server::auth::AuthError),
    /// The node API's TLS settings or serving certificate are unusable.
    #[error("kubelet server TLS: {0}")]
    Tls(#[from] kubelet_server::tls::TlsError),
    /// The manifest URL source cannot be set up.
    #[error("manifest URL: {0}")]
    ManifestUrl(#[from] kubelet_podconfig::Error),
    /// TLS bootstrap, the client certificate or the apiserver client failed.
    #[error("apiserver client: {0}")]
    Client(#[from] kubelet_client::Error),
    /// Cluster mode is configured inconsistently.
    #[error("{0}")]
    Cluster(&'static str),
    /// `allowedUnsafeSysctls` names a sysctl that is not namespaced.
    #[error("allowedUnsafeSysctls: {0}")]
    Sysctls(#[from] crate::lifecycle::sysctl::NotNamespaced),
    /// An eviction setting is invalid (upstream `NewMainKubelet` returns
    /// `ParseThresholdConfig`'s error).
    #[error(transparent)]
    Eviction(kubelet_eviction::EvictionError),
    /// The runtime's view of the pod could not be read.
    #[error("cannot read pod status from the runtime: {0}")]
    PodStatus(#[source] std::sync::Arc<kubelet_runtime::Error>),
    /// Steps of a sync failed; the pod is retried.
    #[error("{}", join(.0))]
    Sync(Vec<kubelet_runtime::Error>),
    /// The pod's volumes are not set up (upstream `WaitForAttachAndMount`).
    #[error("Unable to attach or mount volumes: {0}")]
    Volumes(#[source] crate::volumemanager::VolumeError),
    /// The pod's containers are stopped but its volumes are still mounted
    /// (upstream `WaitForUnmount`'s error); the kill is retried.
    #[error("volumes of the pod are still mounted")]
    VolumesStillMounted,
    /// Stopping or removing the pod failed.
    #[error("killing pod: {0}")]
    Kill(#[source] kubelet_runtime::Error),
}

fn join(errors: &[kubelet_runtime::Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Error {
    /// The upstream reason of the first failed step (`FailedSync` by default).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::PodStatus(e) => e.reason(),
            Self::Kill(e) => e.reason(),
            Self::Volumes(_) => kubelet_types::events::reason::FAILED_MOUNT,
            Self::Sync(v) => v
                .first()
                .map_or("FailedSync", kubelet_runtime::Error::reason),
            _ => "FailedSync",
        }
    }
}
