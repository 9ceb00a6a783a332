//! Device plugins for kubelet-rs (upstream `pkg/kubelet/cm/devicemanager`,
//! API `deviceplugin/v1beta1`): the `Registration` service on
//! `<root-dir>/device-plugins/kubelet.sock`, one `ListAndWatch` stream per
//! plugin, extended resources for the node status, device allocation at pod
//! admission (`GetPreferredAllocation`, `Allocate`, `PreStartContainer`) and
//! upstream's `kubelet_internal_checkpoint`.
//!
//! The kubelet drives a [`DeviceManager`]:
//! - at start, [`DeviceManager::start`] (reads the checkpoint, cleans stale
//!   sockets, serves the registration socket);
//! - per pod to admit, [`DeviceManager::admit_pod`] (upstream's resource
//!   allocator admit handler: [`DeviceManager::allocate`] for each init
//!   container then each app container; a failure rejects the pod with
//!   `UnexpectedAdmissionError`);
//! - per container start, [`DeviceManager::get_device_run_container_options`];
//! - per node status update, [`DeviceManager::get_capacity`];
//! - on housekeeping, [`DeviceManager::update_allocated_devices`].

mod allocate;
pub mod checkpoint;
mod endpoint;
mod error;
mod handler;
mod manager;
pub mod pod_devices;
mod registration;
pub mod resource_name;
mod seams;
pub mod stub;

#[cfg(test)]
mod tests;

pub use error::{AdmitRejection, DeviceManagerError, Result, UNEXPECTED_ADMISSION_ERROR};
pub use manager::{Capacity, DeviceManager, DeviceManagerConfig};
pub use pod_devices::{DeviceRunContainerOptions, ResourceDeviceInstances};
pub use seams::{ActivePods, Clock, NoActivePods, SystemClock};

/// The generated deviceplugin v1beta1 API (messages, `Registration` and
/// `DevicePlugin` clients and servers).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");

    /// API version this kubelet speaks (upstream `Version`).
    pub const VERSION: &str = "v1beta1";
    /// Versions a plugin may register with (upstream `SupportedVersions`).
    pub const SUPPORTED_VERSIONS: &[&str] = &[VERSION];
    /// `Device.health` of a usable device.
    pub const HEALTHY: &str = "Healthy";
    /// `Device.health` of a device the plugin withdrew.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// Name of the kubelet's registration socket in the device-plugins directory.
    pub const KUBELET_SOCKET: &str = "kubelet.sock";
    /// Directory of device plugin sockets under the kubelet root directory.
    pub const DEVICE_PLUGINS_DIR: &str = "device-plugins";
}
