//! Node-level settings of the runtime manager (the `KubeletConfiguration`
//! fields upstream's `kuberuntime` reads: pod log and root directories, DNS,
//! cgroup driver and root, runtime handler).

use std::path::PathBuf;

use kubelet_types::CgroupDriver;

/// Node-level settings the runtime manager needs.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// `podLogsDir` (default `/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// `--root-dir` (default `/var/lib/kubelet`): pod data under `pods/<uid>`.
    pub root_dir: PathBuf,
    /// `clusterDNS`.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain`.
    pub cluster_domain: String,
    /// `resolvConf` ("" disables host DNS inheritance).
    pub resolv_conf: String,
    /// `cgroupDriver`.
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot` (default `/`).
    pub cgroup_root: String,
    /// Node memory, for Burstable OOM score adjustment.
    pub machine_memory_bytes: i64,
    /// CRI runtime handler for sandboxes ("" = default).
    pub runtime_handler: String,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            cluster_dns: vec![],
            cluster_domain: String::new(),
            resolv_conf: "/etc/resolv.conf".into(),
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".into(),
            machine_memory_bytes: 0,
            runtime_handler: String::new(),
        }
    }
}
