//! Errors of the device manager. Their texts are upstream's, because the
//! kubelet puts them in pod admission results (`UnexpectedAdmissionError`)
//! and plugins receive them from `Register`.

use std::path::PathBuf;

/// Result with [`DeviceManagerError`].
pub type Result<T, E = DeviceManagerError> = std::result::Result<T, E>;

/// Everything the device manager can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DeviceManagerError {
    /// A plugin registered with a version this kubelet does not speak.
    #[error(
        "requested API version {version:?} is not supported by kubelet. Supported versions are {supported:?}"
    )]
    UnsupportedVersion {
        /// The version the plugin asked for.
        version: String,
        /// The versions this kubelet serves.
        supported: Vec<String>,
    },
    /// A plugin-watcher registration lists no version this kubelet speaks.
    #[error("manager version, {manager}, is not among plugin supported versions [{}]", versions.join(" "))]
    PluginVersions {
        /// This kubelet's API version.
        manager: String,
        /// The versions the plugin offered.
        versions: Vec<String>,
    },
    /// The resource name is not an extended resource name.
    #[error("the ResourceName {0:?} is invalid")]
    InvalidResourceName(String),
    /// The plugin's socket could not be dialled within the deadline.
    #[error("failed to dial device plugin: {0}")]
    Dial(String),
    /// `GetDevicePluginOptions` failed.
    #[error("failed to get device plugin options: {0}")]
    GetOptions(String),
    /// A plugin call failed or timed out.
    #[error("{0}")]
    Rpc(String),
    /// The container asks for a different count than it was given before.
    #[error(
        "pod {pod_uid:?} container {container:?} changed request for resource {resource:?} from {had} to {wants}"
    )]
    ChangedRequest {
        /// Pod UID.
        pod_uid: String,
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Devices already allocated.
        had: usize,
        /// Devices now requested.
        wants: i64,
    },
    /// No plugin for the resource has ever registered.
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    /// The plugin reports no healthy device.
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthyDevices(String),
    /// Devices given earlier to the container are unhealthy now.
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {0}"
    )]
    PreviouslyAllocatedUnhealthy(String),
    /// Not enough free healthy devices.
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        /// Resource name.
        resource: String,
        /// Devices still needed.
        requested: usize,
        /// Free healthy devices.
        available: usize,
    },
    /// Allocation logic could not find enough devices (should not happen).
    #[error(
        "unexpectedly allocated less resources than required. Requested: {requested}, Got: {got}"
    )]
    AllocatedLess {
        /// Devices requested.
        requested: i64,
        /// Devices found.
        got: i64,
    },
    /// No endpoint for the resource.
    #[error("unknown Device Plugin {0}")]
    UnknownPlugin(String),
    /// The plugin answered `Allocate` without a container response.
    #[error("no containers return in allocation response {0}")]
    EmptyAllocateResponse(String),
    /// No endpoint cached for a resource that has devices.
    #[error("endpoint not found in cache for a registered resource: {0}")]
    EndpointNotFound(String),
    /// The endpoint's plugin went away.
    #[error("endpoint {0} has been stopped")]
    EndpointStopped(String),
    /// PreStartContainer asked for a container with no devices.
    #[error(
        "no devices found allocated in local cache for pod {pod_uid}, container {container}, resource {resource}"
    )]
    NoDevicesInCache {
        /// Pod UID.
        pod_uid: String,
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
    },
    /// `PreStartContainer` failed.
    #[error("device plugin PreStartContainer rpc failed with err: {0}")]
    PreStart(String),
    /// `GetPreferredAllocation` failed.
    #[error("device plugin GetPreferredAllocation rpc failed with err: {0}")]
    PreferredAllocation(String),
    /// The checkpoint could not be written.
    #[error("failed to write checkpoint file \"kubelet_internal_checkpoint\": {0}")]
    CheckpointWrite(String),
    /// The checkpoint could not be read or parsed.
    #[error("failed to read checkpoint file {path}: {reason}")]
    CheckpointRead {
        /// Checkpoint path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A plugin registered an endpoint outside the device plugin directory
    /// (upstream joins it to the directory unchecked).
    #[error("invalid endpoint {endpoint:?}: the plugin socket must be inside {}", dir.display())]
    InvalidEndpoint {
        /// The endpoint the plugin sent.
        endpoint: String,
        /// The device plugin directory.
        dir: PathBuf,
    },
    /// The registration socket could not be served.
    #[error("device plugin registration server at {path}: {source}")]
    Serve {
        /// The socket path.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

/// Reason of a pod rejected because allocation failed (upstream
/// `admission.ErrorReasonUnexpected`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// A pod admission refused by the device manager (upstream
/// `lifecycle.PodAdmitResult` from the resource allocator's admit handler).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitRejection {
    /// Always [`UNEXPECTED_ADMISSION_ERROR`].
    pub reason: &'static str,
    /// "Allocate failed due to <error>, which is unexpected".
    pub message: String,
}

impl From<&DeviceManagerError> for AdmitRejection {
    fn from(e: &DeviceManagerError) -> Self {
        Self {
            reason: UNEXPECTED_ADMISSION_ERROR,
            message: format!("Allocate failed due to {e}, which is unexpected"),
        }
    }
}
