//! Node-level settings of the runtime manager (the `KubeletConfiguration`
//! fields upstream's `kuberuntime` reads: pod log and root directories, DNS,
//! cgroup driver and root, QoS cgroups and CFS settings, runtime handler).

use std::path::PathBuf;

use kubelet_cm::CfsSettings;
use kubelet_types::CgroupDriver;

use crate::cgroups::PodCgroupsHandle;

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
    /// `cgroupsPerQOS` (default true): pods get `kubepods[/<qos>]/pod<uid>`
    /// as their cgroup parent; off, the runtime's default.
    pub cgroups_per_qos: bool,
    /// `cpuCFSQuota`, `cpuCFSQuotaPeriod` and the `CustomCPUCFSQuotaPeriod` gate.
    pub cfs: CfsSettings,
    /// The host's huge page sizes (`2MB`, `1GB`): each container gets a
    /// limit for every size, 0 unless it asks for that size.
    pub hugepage_sizes: Vec<String>,
    /// The kubelet's pod cgroups (upstream `cm.PodContainerManager`): the
    /// pod's cgroup is made before its sandbox and removed with the pod.
    /// `None` (tests, tools): the runtime creates the cgroup path itself.
    pub pod_cgroups: Option<PodCgroupsHandle>,
    /// Each container's cgroup is one OOM unit (`memory.oom.group`, CRI
    /// `unified`): cgroup v2 without `singleProcessOOMKill` (upstream 1.32+).
    pub oom_group_kill: bool,
    /// Node memory, for Burstable OOM score adjustment.
    pub machine_memory_bytes: i64,
    /// CRI runtime handler for sandboxes ("" = default).
    pub runtime_handler: String,
    /// `seccompDefault`: a container whose pod sets no seccomp profile runs
    /// with the runtime's default profile, not unconfined.
    pub seccomp_default: bool,
    /// Dead instances of a container kept when it is started again
    /// (`--maximum-dead-containers-per-container`, at least 1: the
    /// `lastState` and `kubectl logs --previous` read the newest); container
    /// GC applies the rest of the policy every minute.
    pub max_dead_per_container: usize,
    /// The image credential provider plugins
    /// (`--image-credential-provider-config`); their credentials are tried
    /// after the pod's pull secrets and the node's keyring.
    pub image_credential_providers:
        Option<std::sync::Arc<dyn crate::credentialprovider::ExternalCredentialProviders>>,
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
            cgroups_per_qos: true,
            cfs: CfsSettings::default(),
            hugepage_sizes: vec![],
            pod_cgroups: None,
            oom_group_kill: false,
            machine_memory_bytes: 0,
            runtime_handler: String::new(),
            seccomp_default: false,
            max_dead_per_container: 1,
            image_credential_providers: None,
        }
    }
}
