//! What the eviction manager reads (upstream `statsapi.Summary` as
//! `makeSignalObservations` and the rankers use it), and the observations
//! made from it: the available amount and capacity of each signal.

use std::collections::HashMap;
use std::time::SystemTime;

use crate::api::Signal;

/// A filesystem's free space and inodes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FsSignal {
    /// Bytes available.
    pub available_bytes: Option<u64>,
    /// Bytes in all.
    pub capacity_bytes: Option<u64>,
    /// Inodes free.
    pub inodes_free: Option<u64>,
    /// Inodes in all.
    pub inodes: Option<u64>,
    /// When it was read.
    pub time: Option<SystemTime>,
}

/// Memory of the node or of node allocatable.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemorySignal {
    /// Bytes available (capacity minus the working set).
    pub available_bytes: u64,
    /// The working set.
    pub working_set_bytes: u64,
    /// When it was read.
    pub time: Option<SystemTime>,
}

/// Node-level stats.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStats {
    /// The root cgroup's memory.
    pub memory: Option<MemorySignal>,
    /// The pods' cgroup's memory against allocatable.
    pub allocatable_memory: Option<MemorySignal>,
    /// The filesystem of the kubelet's root directory.
    pub nodefs: Option<FsSignal>,
    /// The runtime's image filesystem.
    pub imagefs: Option<FsSignal>,
    /// `(max pids, running processes, time)`.
    pub pids: Option<(u64, u64, Option<SystemTime>)>,
    /// Whether the image filesystem is another device than the node's
    /// (upstream `HasDedicatedImageFs`).
    pub dedicated_imagefs: bool,
}

/// Bytes and inodes a filesystem consumer uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsUsage {
    /// Bytes used.
    pub used_bytes: Option<u64>,
    /// Inodes used.
    pub inodes_used: Option<u64>,
}

/// A running container's usage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerStats {
    /// The container's name.
    pub name: String,
    /// Memory working set.
    pub memory_working_set: Option<u64>,
    /// The writable layer.
    pub rootfs: FsUsage,
    /// Its logs.
    pub logs: FsUsage,
}

/// A pod's usage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodStats {
    /// The pod's UID.
    pub uid: String,
    /// Memory working set of the pod.
    pub memory_working_set: Option<u64>,
    /// Processes in the pod.
    pub process_count: Option<u64>,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// Its volumes by name.
    pub volumes: Vec<(String, FsUsage)>,
    /// All its ephemeral storage (writable layers, logs, local volumes).
    pub ephemeral_used_bytes: Option<u64>,
}

/// One summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// The pods.
    pub pods: Vec<PodStats>,
}

/// One signal's observation (upstream `signalObservation`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// Available now.
    pub available: i64,
    /// Capacity.
    pub capacity: i64,
    /// When it was read.
    pub time: Option<SystemTime>,
}

/// Observations by signal.
pub type Observations = HashMap<Signal, Observation>;

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn fs_observations(out: &mut Observations, fs: &FsSignal, bytes: Signal, inodes: Signal) {
    if let (Some(a), Some(c)) = (fs.available_bytes, fs.capacity_bytes) {
        out.insert(
            bytes,
            Observation {
                available: i(a),
                capacity: i(c),
                time: fs.time,
            },
        );
    }
    if let (Some(a), Some(c)) = (fs.inodes_free, fs.inodes) {
        out.insert(
            inodes,
            Observation {
                available: i(a),
                capacity: i(c),
                time: fs.time,
            },
        );
    }
}

/// Upstream `makeSignalObservations`. The container filesystem is the
/// node's (kubelet-rs knows no split container filesystem).
pub fn observe(node: &NodeStats) -> Observations {
    let mut out = Observations::new();
    let mem = |m: &MemorySignal| Observation {
        available: i(m.available_bytes),
        capacity: i(m.available_bytes.saturating_add(m.working_set_bytes)),
        time: m.time,
    };
    if let Some(m) = &node.memory {
        out.insert(Signal::MemoryAvailable, mem(m));
    }
    if let Some(m) = &node.allocatable_memory {
        out.insert(Signal::AllocatableMemoryAvailable, mem(m));
    }
    if let Some(fs) = &node.nodefs {
        fs_observations(
            &mut out,
            fs,
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
        );
        fs_observations(
            &mut out,
            fs,
            Signal::ContainerFsAvailable,
            Signal::ContainerFsInodesFree,
        );
    }
    if let Some(fs) = &node.imagefs {
        fs_observations(
            &mut out,
            fs,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
        );
    }
    if let Some((max, running, time)) = node.pids {
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: i(max) - i(running),
                capacity: i(max),
                time,
            },
        );
    }
    out
}
