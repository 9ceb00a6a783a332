//! The `/stats/summary` document (upstream `k8s.io/kubelet/pkg/apis/stats/v1alpha1`
//! types): field names as upstream's JSON tags, optional fields omitted when
//! absent as upstream's `omitempty` does. Times are `metav1.Time` (RFC 3339,
//! seconds); an unset time serializes as `null`, as upstream's zero time does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// The whole summary (upstream `Summary`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// The pods the kubelet manages.
    pub pods: Vec<PodStats>,
}

/// Node-level stats (upstream `NodeStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// Stats of system daemons' containers (kubelet, runtime, pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// When the node started (boot time).
    pub start_time: Option<Time>,
    /// CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the kubelet's root directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The container runtime's filesystems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// Process limits of the node (upstream `RlimitStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    /// When sampled.
    pub time: Option<Time>,
    /// The maximum number of processes (`kernel.pid_max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    /// The number of processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

/// The runtime's filesystems (upstream `RuntimeStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Where images are stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// Where containers' writable layers are stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// A pod's reference (upstream `PodReference`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// Pod-level stats (upstream `PodStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// The pod.
    pub pod_ref: PodReference,
    /// When the kubelet first saw the pod's sandbox.
    pub start_time: Option<Time>,
    /// The pod's containers.
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
    /// CPU of the pod's cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the pod's cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Network of the pod's sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Volumes (none until volume plugins exist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    /// Ephemeral storage: writable layers, logs and emptyDir volumes.
    #[serde(
        rename = "ephemeral-storage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ephemeral_storage: Option<FsStats>,
    /// Processes.
    #[serde(
        rename = "process_stats",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub process_stats: Option<ProcessStats>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// Container-level stats (upstream `ContainerStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name in the pod spec.
    pub name: String,
    /// When the container started.
    pub start_time: Option<Time>,
    /// CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// The container's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// CPU usage (upstream `CPUStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When sampled.
    pub time: Option<Time>,
    /// Average usage over the last sampling interval, in nanocores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time in core-nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage (upstream `MemoryStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When sampled.
    pub time: Option<Time>,
    /// Memory left before the limit (or node capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Total usage, including page cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages: what the OOM logic and eviction see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous and swap cache memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Cumulative minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Cumulative major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// Swap usage (upstream `SwapStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapStats {
    /// When sampled.
    pub time: Option<Time>,
    /// Swap left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_available_bytes: Option<u64>,
    /// Swap in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_usage_bytes: Option<u64>,
}

/// One network interface (upstream `InterfaceStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// Interface name.
    pub name: String,
    /// Cumulative bytes received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Cumulative receive errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Cumulative bytes transmitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Cumulative transmit errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// Network usage (upstream `NetworkStats`): the default interface inline,
/// and every interface.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkStats {
    /// When sampled.
    pub time: Option<Time>,
    /// The default interface (`eth0`), inline.
    #[serde(flatten)]
    pub default_interface: InterfaceStats,
    /// Every interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// Filesystem usage (upstream `FsStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When sampled.
    pub time: Option<Time>,
    /// Bytes available to non-root users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used by this object (for a filesystem: all used bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Total inodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used by this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// A volume's usage (upstream `VolumeStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// Usage, inline.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The claim it comes from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

/// A claim's reference (upstream `PVCReference`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PvcReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// Process counts (upstream `ProcessStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Processes in the pod.
    #[serde(
        rename = "process_count",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub process_count: Option<u64>,
}

impl Summary {
    /// Keeps only what upstream's `GetCPUAndMemoryStats` reports: the node's
    /// and each pod's and container's name, start time, CPU, memory and swap.
    pub fn cpu_and_memory_only(self) -> Summary {
        let strip = |c: ContainerStats| ContainerStats {
            name: c.name,
            start_time: c.start_time,
            cpu: c.cpu,
            memory: c.memory,
            swap: c.swap,
            ..Default::default()
        };
        Summary {
            node: NodeStats {
                node_name: self.node.node_name,
                system_containers: self.node.system_containers.into_iter().map(strip).collect(),
                start_time: self.node.start_time,
                cpu: self.node.cpu,
                memory: self.node.memory,
                swap: self.node.swap,
                ..Default::default()
            },
            pods: self
                .pods
                .into_iter()
                .map(|p| PodStats {
                    pod_ref: p.pod_ref,
                    start_time: p.start_time,
                    containers: p.containers.into_iter().map(strip).collect(),
                    cpu: p.cpu,
                    memory: p.memory,
                    swap: p.swap,
                    ..Default::default()
                })
                .collect(),
        }
    }
}
