//! The pod-resources API (upstream `pkg/kubelet/apis/podresources`, API
//! `k8s.io/kubelet/pkg/apis/podresources/v1`): `List`, `Get` and
//! `GetAllocatableResources` on `<root-dir>/pod-resources/kubelet.sock`,
//! answering from the kubelet's pods and the device, CPU and memory managers
//! through the provider traits, rate limited as upstream.

mod client;
mod error;
mod metrics;
mod providers;
mod ratelimit;
mod serve;
mod server;
mod server_v1alpha1;

#[cfg(test)]
mod tests;

pub use client::{v1_client, v1alpha1_client};
pub use error::Error;
pub use metrics::{ApiMethod, NoMetrics, PodResourcesMetrics};
pub use providers::{
    CpusProvider, DeviceInstance, DevicesProvider, MemoryProvider, NoCpus, NoDevices, NoMemory,
    PodInfo, PodResourcesProviders, PodsProvider, container_devices,
};
pub use ratelimit::{DEFAULT_BURST_TOKENS, DEFAULT_QPS, RateLimit};
pub use serve::{POD_RESOURCES_DIR_MODE, bind, serve, socket_path};
pub use server::{GET_FEATURE_GATE, PodResourcesServer};

/// The directory of the socket under the kubelet's root directory (upstream
/// `config.DefaultKubeletPodResourcesDirName`).
pub const POD_RESOURCES_DIR_NAME: &str = "pod-resources";
/// The socket's file name (upstream `podresources.Socket` + `.sock`).
pub const SOCKET_NAME: &str = "kubelet.sock";

/// Generated protobuf messages and gRPC stubs for `podresources.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("v1");
}

/// Generated protobuf messages and gRPC stubs for the deprecated
/// `podresources.v1alpha1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}
