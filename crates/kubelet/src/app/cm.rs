//! The container manager at start (upstream `cmd/kubelet/app/server.go`
//! building `cm.NodeConfig` and `NewContainerManager`, and
//! `Kubelet.initializeRuntimeDependentModules` starting it): reads the
//! cgroup settings, checks `cgroupRoot`, creates `kubepods` with node
//! allocatable and the QoS tiers, hands pod cgroups to the runtime manager,
//! and keeps the tiers current while the kubelet runs.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kubelet_cm::node_container_manager::{ENFORCE_PODS, PIDS, host_max_pids};
use kubelet_cm::systemd_dbus::{DbusUnits, system_bus_address};
use kubelet_cm::systemd_unit::SystemdUnits;
use kubelet_cm::{CfsSettings, CgroupSubsystems, ContainerManager, NodeConfig};
use kubelet_config::{KubeletConfig, SettingValue};
use kubelet_node::nodestatus::machine::MachineInfo;
use kubelet_runtime::RuntimeConfig;
use kubelet_runtime::cgroups::PodCgroupsHandle;
use kubelet_types::CgroupDriver;
use kubelet_types::quantity::{Format, Quantity};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info_span};

use super::spawn::spawn_in;
use crate::pod_manager::PodManager;

/// Feature gate that lets `cpuCFSQuotaPeriod` move the quota's period.
const CUSTOM_CFS_PERIOD_GATE: &str = "CustomCPUCFSQuotaPeriod";

fn bool_setting(cfg: &KubeletConfig, key: &str, default: bool) -> bool {
    match cfg.settings.get(key) {
        Some(SettingValue::Bool(b)) => *b,
        _ => default,
    }
}

fn quantities(m: &BTreeMap<String, String>) -> BTreeMap<String, Quantity> {
    m.iter()
        .filter_map(|(k, v)| Quantity::parse(v).ok().map(|q| (k.clone(), q)))
        .collect()
}

/// The container manager's settings from the kubelet's configuration
/// (upstream defaults: `cgroupsPerQOS` true, `cpuCFSQuota` true,
/// `cpuCFSQuotaPeriod` 100ms, `podPidsLimit` -1, `enforceNodeAllocatable` [pods]).
pub fn node_config(
    cfg: &KubeletConfig,
    machine: &MachineInfo,
    max_pids: Option<i64>,
) -> NodeConfig {
    let period_us = match cfg.settings.get("cpuCFSQuotaPeriod") {
        Some(SettingValue::Duration(d)) => d.as_nanos() / 1000,
        _ => kubelet_cm::helpers::QUOTA_PERIOD,
    };
    let pod_pids_limit = match cfg.settings.get("podPidsLimit") {
        Some(SettingValue::Int(i)) => *i,
        _ => -1,
    };
    let enforce_node_allocatable = match cfg.settings.get("enforceNodeAllocatable") {
        Some(SettingValue::List(l)) => l.clone(),
        _ => vec![ENFORCE_PODS.to_string()],
    };
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "cpu".to_string(),
        Quantity::new(
            i64::try_from(machine.num_cores).unwrap_or(0),
            Format::DecimalSI,
        ),
    );
    let huge: u64 = machine.hugepages.iter().map(|(_, b)| b).sum();
    capacity.insert(
        "memory".to_string(),
        Quantity::new(
            i64::try_from(machine.memory_bytes.saturating_sub(huge)).unwrap_or(i64::MAX),
            Format::BinarySI,
        ),
    );
    if let Some(p) = max_pids {
        capacity.insert(PIDS.to_string(), Quantity::new(p, Format::DecimalSI));
    }
    NodeConfig {
        node_name: cfg.node_name.clone(),
        cgroup_driver: cfg.cgroup_driver,
        cgroup_root: cfg.cgroup_root.clone(),
        cgroups_per_qos: bool_setting(cfg, "cgroupsPerQOS", true),
        cfs: CfsSettings {
            enforce_cpu_limits: bool_setting(cfg, "cpuCFSQuota", true),
            period_us,
            custom_period: cfg
                .feature_gates
                .get(CUSTOM_CFS_PERIOD_GATE)
                .copied()
                .unwrap_or(false),
        },
        pod_pids_limit,
        enforce_node_allocatable,
        capacity,
        kube_reserved: quantities(&cfg.cluster.kube_reserved),
        system_reserved: quantities(&cfg.cluster.system_reserved),
    }
}

/// Upstream `validateKubeletOSConfiguration` on this host's cgroup version:
/// cgroup v1 refused with `failCgroupV1`, `singleProcessOOMKill: false`
/// refused on v1. Returns whether containers are OOM-killed as a group
/// (upstream's default: on v2 unless `singleProcessOOMKill`).
fn validate_os_config(v2: bool, cfg: &KubeletConfig) -> Result<bool, kubelet_cm::CgroupError> {
    if !v2 && bool_setting(cfg, "failCgroupV1", false) {
        return Err(kubelet_cm::CgroupError::CgroupV1Refused);
    }
    let single_process_oom_kill = match cfg.settings.get("singleProcessOOMKill") {
        Some(SettingValue::Bool(b)) => Some(*b),
        _ => None,
    };
    if !v2 && single_process_oom_kill == Some(false) {
        return Err(kubelet_cm::CgroupError::GroupOomKillOnV1);
    }
    Ok(v2 && !single_process_oom_kill.unwrap_or(false))
}

/// Builds and starts the container manager, and points `rcfg` at it
/// (pod cgroups, CFS settings, huge page sizes, `cgroupsPerQOS`). An error
/// stops the kubelet, as upstream's "Failed to start ContainerManager".
pub async fn start(
    cfg: &KubeletConfig,
    machine: &MachineInfo,
    rcfg: &mut RuntimeConfig,
) -> Result<Arc<ContainerManager>, kubelet_cm::CgroupError> {
    // Reads /proc and /sys: off the async runtime.
    let probe = tokio::task::spawn_blocking(|| {
        (
            CgroupSubsystems::detect(),
            kubelet_cm::helpers::host_hugepage_sizes(Path::new("/sys/kernel/mm/hugepages")),
            host_max_pids(Path::new("/proc/sys/kernel")),
        )
    })
    .await;
    let (subsystems, hugepage_sizes, max_pids) =
        probe.map_err(|e| kubelet_cm::CgroupError::Incomplete {
            name: "/".into(),
            reason: e.to_string(),
        })?;
    let subsystems = subsystems?;
    rcfg.oom_group_kill = match validate_os_config(subsystems.is_v2(), cfg) {
        Ok(group) => group,
        Err(e) => {
            error!(error = %e, "Failed to validate kubelet configuration");
            return Err(e);
        }
    };
    let node = node_config(cfg, machine, max_pids);
    // The systemd driver's slices are systemd units: without systemd's bus
    // the kubelet cannot create them, and stops as upstream does.
    let units: Option<Arc<dyn SystemdUnits>> = if node.cgroup_driver == CgroupDriver::Systemd
        && node.cgroups_per_qos
    {
        match DbusUnits::connect(&system_bus_address()).await {
            Ok(u) => Some(Arc::new(u)),
            Err(e) => {
                error!(error = %e, "Failed to start ContainerManager: the systemd cgroup driver needs systemd on the system bus");
                return Err(e);
            }
        }
    } else {
        None
    };
    let cm = Arc::new(ContainerManager::with_units(
        node.clone(),
        subsystems,
        hugepage_sizes.clone(),
        units,
    ));
    if let Err(e) = cm.start().await {
        error!(error = %e, "Failed to start ContainerManager");
        return Err(e);
    }
    rcfg.cgroups_per_qos = node.cgroups_per_qos;
    rcfg.cfs = node.cfs;
    rcfg.hugepage_sizes = hugepage_sizes;
    rcfg.pod_cgroups = Some(PodCgroupsHandle(cm.clone()));
    Ok(cm)
}

/// Orphaned pod cgroups, for the sync loop's housekeeping (upstream
/// `cleanupOrphanedPodCgroups`): a pod whose volumes are still on disk
/// (`<root-dir>/pods/<uid>/volumes` not empty) is kept, as upstream keeps it
/// until its volumes are cleaned up.
pub struct Orphans {
    cm: Arc<ContainerManager>,
    pods_dir: PathBuf,
    tasks: TaskTracker,
    /// One pass at a time: a slow systemd does not stack passes up.
    running: Arc<std::sync::atomic::AtomicBool>,
}

/// The orphan cleanup when the kubelet manages pod cgroups; its passes run
/// on `tasks`.
pub fn orphans(
    cm: &Arc<ContainerManager>,
    root_dir: &Path,
    tasks: &TaskTracker,
) -> Option<Arc<dyn crate::sync_loop::OrphanPodCgroups>> {
    cm.manages_cgroups().then(|| {
        Arc::new(Orphans {
            cm: cm.clone(),
            pods_dir: root_dir.join("pods"),
            tasks: tasks.clone(),
            running: Arc::default(),
        }) as Arc<dyn crate::sync_loop::OrphanPodCgroups>
    })
}

/// UIDs under `pods_dir` whose `volumes` directory has anything in it.
fn pods_with_volumes(pods_dir: &Path) -> HashSet<String> {
    let Ok(entries) = std::fs::read_dir(pods_dir) else {
        return HashSet::new();
    };
    entries
        .flatten()
        .filter(|e| {
            std::fs::read_dir(e.path().join("volumes")).is_ok_and(|mut d| d.next().is_some())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[async_trait::async_trait]
impl crate::sync_loop::OrphanPodCgroups for Orphans {
    async fn cleanup(&self, mut possibly_running: HashSet<String>) {
        use std::sync::atomic::Ordering;
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (dir, cm, running) = (self.pods_dir.clone(), self.cm.clone(), self.running.clone());
        let pass = async move {
            match tokio::task::spawn_blocking(move || pods_with_volumes(&dir)).await {
                Ok(with_volumes) => {
                    possibly_running.extend(with_volumes);
                    let removed = cm.cleanup_orphaned_pod_cgroups(possibly_running).await;
                    if !removed.is_empty() {
                        tracing::info!(pods = ?removed, "Removed orphaned pod cgroups");
                    }
                }
                // Without knowing, remove nothing this pass.
                Err(e) => tracing::warn!(error = %e, "Cannot list pod volume directories"),
            }
            running.store(false, Ordering::Release);
        };
        spawn_in(&self.tasks, info_span!("orphaned_pod_cgroups"), pass);
    }
}

/// Keeps the QoS tiers current with the desired pods and enforces node
/// allocatable, until `stop`.
pub fn spawn(
    cm: &Arc<ContainerManager>,
    pods: PodManager,
    recorder: Option<Arc<dyn kubelet_types::events::Recorder>>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    cm.set_active_pods(Arc::new(move || pods.get_pods()));
    if let Some(r) = recorder {
        cm.set_recorder(r);
    }
    spawn_in(
        tasks,
        info_span!("container_manager"),
        cm.clone().run(stop.child_token()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v1_and_group_oom_kill_are_validated_as_upstream() {
        use kubelet_cm::CgroupError;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
        )
        .expect("write");
        let flags = kubelet_config::Flags::default();
        let flags_only = KubeletConfig::resolve(&flags, None, "n1").expect("config");
        let loaded = kubelet_config::KubeletConfiguration::load(&file)
            .expect("file")
            .0;
        let with_file = KubeletConfig::resolve(&flags, Some(&loaded), "n1").expect("config");
        // A config file refuses cgroup v1 by default since 1.35; flags alone do not.
        assert!(matches!(
            validate_os_config(false, &with_file),
            Err(CgroupError::CgroupV1Refused)
        ));
        assert_eq!(validate_os_config(false, &flags_only).ok(), Some(false));
        // Group OOM kill: v2's default, never on v1.
        assert_eq!(validate_os_config(true, &with_file).ok(), Some(true));
        let mut single = flags_only.clone();
        single
            .settings
            .insert("singleProcessOOMKill", SettingValue::Bool(true));
        assert_eq!(validate_os_config(true, &single).ok(), Some(false));
        single
            .settings
            .insert("singleProcessOOMKill", SettingValue::Bool(false));
        assert!(matches!(
            validate_os_config(false, &single),
            Err(CgroupError::GroupOomKillOnV1)
        ));
        assert_eq!(validate_os_config(true, &single).ok(), Some(true));
    }

    #[test]
    fn pods_with_volumes_on_disk_are_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let pods = root.path().join("pods");
        std::fs::create_dir_all(pods.join("a/volumes/kubernetes.io~empty-dir/x")).expect("a");
        std::fs::create_dir_all(pods.join("b/volumes")).expect("b");
        std::fs::create_dir_all(pods.join("c")).expect("c");
        assert_eq!(pods_with_volumes(&pods), HashSet::from(["a".to_string()]));
        assert!(pods_with_volumes(&root.path().join("none")).is_empty());
    }

    #[test]
    fn settings_map_to_the_node_config_with_upstream_defaults() {
        let mut cfg =
            KubeletConfig::resolve(&kubelet_config::Flags::default(), None, "n1").expect("config");
        let machine = MachineInfo {
            num_cores: 2,
            memory_bytes: 4 << 30,
            ..Default::default()
        };
        let n = node_config(&cfg, &machine, Some(4096));
        assert!(n.cgroups_per_qos);
        assert_eq!(n.cfs, CfsSettings::default());
        assert_eq!(n.pod_pids_limit, -1);
        assert_eq!(n.enforce_node_allocatable, vec!["pods"]);
        assert_eq!(n.capacity["cpu"].milli_value(), 2000);
        assert_eq!(n.capacity["memory"].value(), 4 << 30);
        assert_eq!(n.capacity["pid"].value(), 4096);
        cfg.settings
            .insert("cpuCFSQuota", SettingValue::Bool(false));
        cfg.settings.insert("podPidsLimit", SettingValue::Int(100));
        cfg.settings
            .insert("enforceNodeAllocatable", SettingValue::List(vec![]));
        let n = node_config(&cfg, &machine, None);
        assert!(!n.cfs.enforce_cpu_limits);
        assert_eq!(n.pod_pids_limit, 100);
        assert!(n.enforce_node_allocatable.is_empty());
    }
}
