//! The kubelet's Node (upstream `kubelet_node_status.go`, `pkg/kubelet/nodestatus`,
//! `pkg/kubelet/nodelease`): registration and the status loop ([`nodestatus`]),
//! the node lease ([`nodelease`]), the node's addresses ([`node_ip`]) and host
//! facts ([`nodestatus::machine`]), and upstream's version parsing
//! ([`version`]) for the runtime's version.
//!
//! Node status reads the runtime's health through [`RuntimeState`], which the
//! agent implements (upstream passes `runtimeState.runtimeErrors` and
//! `networkErrors` into the setters the same way), and resource pressure
//! through [`NodePressure`] (upstream passes the eviction manager's
//! `IsUnderMemoryPressure`, `IsUnderDiskPressure`, `IsUnderPIDPressure`).
//! Extended resources from device plugins come through [`ExtendedResources`]
//! (upstream's `devicePluginResourceCapacityFunc` and
//! `ShouldResetExtendedResourceCapacity`).

pub mod node_ip;
pub mod nodelease;
pub mod nodestatus;
pub mod version;

pub use nodestatus::extended::{DeviceCapacity, ExtendedResources, NoExtendedResources};
pub use nodestatus::volumes::{NoVolumesInUse, VolumesInUse};

/// The runtime's health as node status sees it (upstream `runtimeState`'s
/// `runtimeErrors` and `networkErrors`): non-empty means the node is NotReady.
pub trait RuntimeState: Send + Sync + 'static {
    /// Why the runtime is unusable (runtime down, not ready, PLEG unhealthy).
    fn runtime_errors(&self) -> Vec<String>;
    /// Why the pod network is unusable.
    fn network_errors(&self) -> Vec<String>;
    /// The node shutdown manager's error while the node shuts down
    /// (upstream `ShutdownStatus`); the Ready message lists it after the
    /// runtime's and the network's, as upstream. None by default.
    fn shutdown_errors(&self) -> Vec<String> {
        vec![]
    }
    /// Woken when the Ready condition changed in a way that must be
    /// reported now rather than on the next status tick (upstream's
    /// shutdown manager calls `syncNodeStatus` when a shutdown starts).
    /// The status loop asks once; the default never fires.
    fn status_changed(&self) -> std::sync::Arc<tokio::sync::Notify> {
        std::sync::Arc::new(tokio::sync::Notify::new())
    }
}

/// Resource pressure as node status sees it (upstream's eviction manager
/// as `MemoryPressureCondition`, `DiskPressureCondition` and
/// `PIDPressureCondition` read it).
pub trait NodePressure: Send + Sync + 'static {
    /// `MemoryPressure`.
    fn memory_pressure(&self) -> bool;
    /// `DiskPressure`.
    fn disk_pressure(&self) -> bool;
    /// `PIDPressure`.
    fn pid_pressure(&self) -> bool;
}

/// A node never under pressure (no eviction manager).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPressure;

impl NodePressure for NoPressure {
    fn memory_pressure(&self) -> bool {
        false
    }
    fn disk_pressure(&self) -> bool {
        false
    }
    fn pid_pressure(&self) -> bool {
        false
    }
}
