//! Resource management of kubelet-rs (upstream `pkg/kubelet/cm` and
//! `pkg/kubelet/qos`): the cgroup tree the kubelet keeps for its pods.
//!
//! ```text
//! <cgroupRoot>/kubepods            node allocatable (node_container_manager), Guaranteed pods
//! <cgroupRoot>/kubepods/burstable  shares = sum of Burstable CPU requests (qos_container_manager)
//! <cgroupRoot>/kubepods/besteffort shares = 2
//! .../pod<uid>                     the pod's requests and limits (pod_container_manager)
//! ```
//!
//! [`cgroup_manager::CgroupManager`] writes cgroupfs for v1 and v2 hosts;
//! [`ContainerManager`] ties the tiers together and is what the kubelet
//! builds; the runtime manager reaches it through [`PodContainerManager`].
//! Nothing here depends on the runtime crate: `kubelet-runtime` uses the
//! conversions ([`helpers`], [`policy`]) and names ([`cgroup_name`]).

pub mod cgroup_manager;
pub mod cgroup_name;
mod container_manager;
pub mod helpers;
pub mod node_container_manager;
pub mod pod_container_manager;
pub mod policy;
pub mod qos_container_manager;
pub mod systemd_dbus;
pub mod systemd_unit;

use std::path::PathBuf;

pub use cgroup_manager::{CgroupManager, CgroupSubsystems, ResourceConfig};
pub use cgroup_name::CgroupName;
pub use container_manager::{ActivePods, ContainerManager, NodeConfig};
pub use helpers::CfsSettings;
pub use pod_container_manager::PodContainerManager;

/// Event reasons of the container manager (upstream `pkg/kubelet/events`).
pub mod reason {
    /// Node allocatable limits were written on the pods' cgroup.
    pub const SUCCESSFUL_NODE_ALLOCATABLE_ENFORCEMENT: &str = "NodeAllocatableEnforced";
    /// Node allocatable limits could not be written.
    pub const FAILED_NODE_ALLOCATABLE_ENFORCEMENT: &str = "FailedNodeAllocatableEnforcement";
    /// A pod's cgroup could not be created.
    pub const FAILED_TO_CREATE_POD_CONTAINER: &str = "FailedCreatePodContainer";
}

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file or directory could not be read, written or removed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No cgroup hierarchy is mounted.
    #[error("failed to find cgroup mounts")]
    NoMounts,
    /// A cgroup is missing from some hierarchies (upstream `Validate`).
    #[error("cgroup {name:?} has some missing paths: {paths}")]
    Missing {
        /// The cgroup.
        name: String,
        /// The missing directories.
        paths: String,
    },
    /// Processes of a cgroup to be removed could not be killed.
    #[error("failed to kill all the processes attached to the {name} cgroups: {message}")]
    Kill {
        /// The cgroup.
        name: String,
        /// The signal errors.
        message: String,
    },
    /// The host runs cgroup v1 and `failCgroupV1` is on (upstream
    /// `validateKubeletOSConfiguration`; the default of a config file since 1.35).
    #[error(
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is unsupported and will be removed in a future release (set failCgroupV1: false in the kubelet config file, or --fail-cgroupv1=false, to run on this host)"
    )]
    CgroupV1Refused,
    /// `singleProcessOOMKill: false` on a cgroup v1 host (upstream
    /// `validateKubeletOSConfiguration`): v1 has no group OOM kill.
    #[error(
        "invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
    )]
    GroupOomKillOnV1,
    /// systemd refused or did not finish an operation on a slice.
    #[error("systemd {op} of {unit}: {reason}")]
    Systemd {
        /// The slice unit (`-` for the connection).
        unit: String,
        /// The D-Bus method.
        op: &'static str,
        /// systemd's or the bus's answer.
        reason: String,
    },
    /// The operation did not finish before its deadline, or its task died.
    #[error("cgroup operation on {name} did not complete: {reason}")]
    Incomplete {
        /// The cgroup.
        name: String,
        /// Deadline passed or task failure.
        reason: String,
    },
}
