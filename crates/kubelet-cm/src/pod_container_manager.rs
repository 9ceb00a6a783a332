//! Pod cgroups (upstream `cm/pod_container_manager_linux.go`): `pod<uid>`
//! below the pod's QoS tier, created with the pod's resources before its
//! sandbox, and removed (after killing what is left in it) once the pod is
//! gone.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::qos::pod_qos;
use tracing::{debug, info};

use crate::CgroupError;
use crate::cgroup_manager::CgroupManager;
use crate::cgroup_name::CgroupName;
use crate::helpers::{CfsSettings, resource_config_for_pod};
use crate::qos_container_manager::QosContainersInfo;

/// Prefix of a pod cgroup's name (upstream `podCgroupNamePrefix`).
pub const POD_CGROUP_NAME_PREFIX: &str = "pod";

/// What the runtime manager and the kubelet ask of pod cgroups (upstream
/// `cm.PodContainerManager`, the calls kubelet-rs makes).
#[async_trait::async_trait]
pub trait PodContainerManager: Send + Sync {
    /// Creates the pod's cgroup with its resources if it does not exist
    /// (upstream `EnsureExists`; the kubelet updates the QoS tiers first).
    async fn ensure_exists(&self, pod: &Pod) -> Result<(), CgroupError>;
    /// Kills what is left in the pod's cgroup and removes it (upstream `Destroy`).
    async fn destroy(&self, pod_uid: &str) -> Result<(), CgroupError>;
    /// The cgroup parent to give the runtime for the pod's sandbox
    /// (upstream `GetPodCgroupParent`), in the driver's syntax; "" when
    /// `cgroupsPerQOS` is off.
    fn cgroup_parent(&self, pod: &Pod) -> String;
}

/// Pod cgroups below the QoS tiers (upstream `podContainerManagerImpl`).
pub struct PodCgroups {
    cgroups: Arc<CgroupManager>,
    qos: QosContainersInfo,
    pod_pids_limit: i64,
    cfs: CfsSettings,
}

impl PodCgroups {
    /// A manager of pod cgroups below `qos`; `pod_pids_limit` > 0 sets
    /// `pids.max` (`podPidsLimit`).
    pub fn new(
        cgroups: Arc<CgroupManager>,
        qos: QosContainersInfo,
        pod_pids_limit: i64,
        cfs: CfsSettings,
    ) -> Self {
        Self {
            cgroups,
            qos,
            pod_pids_limit,
            cfs,
        }
    }

    /// The pod's cgroup name (upstream `GetPodContainerName`).
    pub fn pod_container_name(&self, p: &Pod) -> CgroupName {
        let uid = p.metadata.uid.as_deref().unwrap_or_default();
        self.qos
            .parent(pod_qos(p))
            .child(&format!("{POD_CGROUP_NAME_PREFIX}{uid}"))
    }

    /// Whether the pod's cgroup exists (upstream `Exists`). Blocking IO.
    pub fn exists(&self, p: &Pod) -> bool {
        self.cgroups.exists(&self.pod_container_name(p))
    }

    /// Creates the pod's cgroup unless it exists (upstream `EnsureExists`). Blocking IO.
    pub fn ensure_exists(&self, p: &Pod) -> Result<(), CgroupError> {
        let name = self.pod_container_name(p);
        if self.cgroups.exists(&name) {
            return Ok(());
        }
        let mut rc = resource_config_for_pod(p, self.cfs);
        if self.pod_pids_limit > 0 {
            rc.pids_limit = Some(self.pod_pids_limit);
        }
        debug!(cgroup = %name, ?rc, "Creating pod cgroup");
        self.cgroups.create(&name, &rc)
    }

    /// Kills every process left in the cgroup and below, trying up to five
    /// times (upstream `tryKillingCgroupProcesses`). Blocking.
    fn kill_processes(&self, name: &CgroupName) -> Result<(), CgroupError> {
        let pids = self.cgroups.pids(name);
        if pids.is_empty() {
            return Ok(());
        }
        let mut errors = vec![];
        let mut killed = std::collections::BTreeSet::new();
        for attempt in 0..5 {
            if attempt > 0 {
                debug!(attempt, cgroup = %name, "Attempt failed to kill all unwanted process from cgroup, retrying");
            }
            errors.clear();
            for pid in &pids {
                if killed.contains(pid) {
                    continue;
                }
                debug!(pid, cgroup = %name, "Attempting to kill process from cgroup");
                let r = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                match r {
                    Ok(()) | Err(nix::errno::Errno::ESRCH) => {
                        killed.insert(*pid);
                    }
                    Err(e) => errors.push(format!("{pid}: {e}")),
                }
            }
            if errors.is_empty() {
                return Ok(());
            }
        }
        Err(CgroupError::Kill {
            name: name.to_cgroupfs(),
            message: errors.join(", "),
        })
    }

    /// Kills what is left in `name` and removes it (upstream `Destroy`). Blocking.
    pub fn destroy(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if let Err(e) = self.kill_processes(name) {
            info!(cgroup = %name, error = %e, "Failed to kill all the processes attached to cgroup");
            return Err(e);
        }
        self.cgroups.destroy(name).inspect_err(|e| {
            info!(cgroup = %name, error = %e, "Failed to delete cgroup paths");
        })
    }

    /// Every pod cgroup found in the hierarchies, by pod UID (upstream
    /// `GetAllPodsFromCgroups`). Blocking IO.
    pub fn all_pods_from_cgroups(&self) -> BTreeMap<String, CgroupName> {
        let mut found = BTreeMap::new();
        let tiers = [
            &self.qos.besteffort,
            &self.qos.burstable,
            &self.qos.guaranteed,
        ];
        for mount in self.cgroups.subsystems().mount_points.values() {
            for tier in tiers {
                let literal = self.cgroups.name(tier);
                let dir = mount.join(literal.trim_start_matches('/'));
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    if !e.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let child = format!(
                        "{}/{}",
                        literal.trim_end_matches('/'),
                        e.file_name().to_string_lossy()
                    );
                    let name = self.cgroups.cgroup_name(&child);
                    if let Some(uid) = name.base().strip_prefix(POD_CGROUP_NAME_PREFIX)
                        && !uid.is_empty()
                    {
                        // Systemd names parse from the slice alone: rebuild below the tier.
                        found.insert(uid.to_string(), tier.child(name.base()));
                    }
                }
            }
        }
        found
    }

    /// The pod's cgroup as the runtime's cgroup parent (upstream
    /// `GetPodCgroupParent`, `cgroupCommon.Name`): the path for cgroupfs, the
    /// expanded slice path for systemd (containerd uses its last element as
    /// runc's slice, and the whole path for the sandbox's stats).
    pub fn cgroup_parent(&self, p: &Pod) -> String {
        let name = self.pod_container_name(p);
        match self.cgroups.driver() {
            kubelet_types::CgroupDriver::Cgroupfs => name.to_cgroupfs(),
            kubelet_types::CgroupDriver::Systemd => name.to_systemd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup_manager::CgroupSubsystems;
    use kubelet_types::CgroupDriver;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    fn read(p: std::path::PathBuf) -> String {
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn manager(subs: CgroupSubsystems, driver: CgroupDriver, pids: i64) -> PodCgroups {
        let root = CgroupName::root().child("kubepods");
        PodCgroups::new(
            Arc::new(CgroupManager::new(subs, driver, vec![])),
            QosContainersInfo::new(&root),
            pids,
            CfsSettings::default(),
        )
    }

    fn guaranteed() -> Pod {
        pod(
            serde_json::json!({"metadata": {"uid": "1234-abcd"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"},
                                        "requests": {"cpu": "500m", "memory": "64Mi"}}}]}}),
        )
    }

    #[test]
    fn v1_pod_cgroup_is_created_with_the_pods_resources_and_destroyed() {
        let mnt = tempfile::tempdir().expect("tempdir");
        let m = manager(
            CgroupSubsystems::v1(mnt.path(), &["cpu", "cpuacct", "memory", "pids"]),
            CgroupDriver::Cgroupfs,
            100,
        );
        let p = guaranteed();
        assert!(!m.exists(&p));
        m.ensure_exists(&p).expect("create");
        assert!(m.exists(&p));
        let dir = |c: &str| mnt.path().join(c).join("kubepods/pod1234-abcd");
        assert_eq!(read(dir("cpu").join("cpu.shares")), "512");
        assert_eq!(read(dir("cpu").join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(dir("cpu").join("cpu.cfs_period_us")), "100000");
        assert_eq!(
            read(dir("memory").join("memory.limit_in_bytes")),
            (64 << 20).to_string()
        );
        assert_eq!(read(dir("pids").join("pids.max")), "100");
        assert!(dir("cpuacct").is_dir());
        assert_eq!(m.cgroup_parent(&p), "/kubepods/pod1234-abcd");
        let found = m.all_pods_from_cgroups();
        assert_eq!(found.get("1234-abcd"), Some(&m.pod_container_name(&p)));
        // Left-over container cgroups below the pod go with it.
        std::fs::create_dir_all(dir("memory").join("ctr")).expect("mkdir");
        m.destroy(&m.pod_container_name(&p)).expect("destroy");
        assert!(!dir("cpu").exists() && !dir("memory").exists());
        assert!(m.all_pods_from_cgroups().is_empty());
    }

    #[test]
    fn v2_pod_cgroup_uses_unified_files() {
        let mnt = tempfile::tempdir().expect("tempdir");
        std::fs::write(mnt.path().join("cgroup.controllers"), "cpu memory pids").expect("write");
        let m = manager(
            CgroupSubsystems::v2(mnt.path(), &["cpu", "memory", "pids"]),
            CgroupDriver::Cgroupfs,
            0,
        );
        let b = pod(
            serde_json::json!({"metadata": {"uid": "u2"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}}]}}),
        );
        m.ensure_exists(&b).expect("create");
        let dir = mnt.path().join("kubepods/burstable/podu2");
        assert_eq!(read(dir.join("cpu.weight")), "39");
        assert_eq!(read(dir.join("cpu.max")), "200000 100000");
        assert_eq!(read(dir.join("memory.max")), (1i64 << 30).to_string());
        assert!(
            !dir.join("pids.max").exists(),
            "podPidsLimit 0 leaves pids alone"
        );
        assert_eq!(
            read(mnt.path().join("cgroup.subtree_control")),
            "+cpu +memory +pids",
            "controllers are enabled down the path"
        );
    }

    #[test]
    fn systemd_names_and_paths() {
        let mnt = tempfile::tempdir().expect("tempdir");
        let m = manager(
            CgroupSubsystems::v1(mnt.path(), &["cpu", "memory"]),
            CgroupDriver::Systemd,
            0,
        );
        let b = pod(
            serde_json::json!({"metadata": {"uid": "12-34"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}}}]}}),
        );
        assert_eq!(
            m.cgroup_parent(&b),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
        );
        let paths = m.cgroups.paths(&m.pod_container_name(&b));
        assert_eq!(
            paths["cpu"],
            mnt.path().join(
                "cpu/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
            )
        );
        // Pods found on disk under systemd names map back to their UIDs.
        std::fs::create_dir_all(&paths["memory"]).expect("mkdir");
        let found = m.all_pods_from_cgroups();
        assert_eq!(found.get("12-34"), Some(&m.pod_container_name(&b)));
    }
}
