//! The QoS tiers (upstream `cm/qos_container_manager_linux.go`):
//! Guaranteed pods live directly in `kubepods`, the others in
//! `kubepods/burstable` and `kubepods/besteffort`. BestEffort gets the
//! minimum 2 cpu.shares, Burstable the shares of its pods' summed CPU
//! requests, updated when pods change and every minute. Huge pages stay
//! unbounded on the tiers. (`qosReserved`, an alpha feature, is not done.)

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::qos::{QosClass, pod_qos};

use crate::CgroupError;
use crate::cgroup_manager::{CgroupManager, ResourceConfig};
use crate::cgroup_name::CgroupName;
use crate::helpers::{MIN_SHARES, hugepage_unit_size_to_bytes, milli_cpu_to_shares, pod_requests};

/// How often the tiers are brought back to the desired state (upstream `periodicQOSCgroupUpdateInterval`).
pub const PERIODIC_UPDATE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// The names of the three tiers (upstream `QOSContainersInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QosContainersInfo {
    /// `kubepods` itself.
    pub guaranteed: CgroupName,
    /// `kubepods/burstable`.
    pub burstable: CgroupName,
    /// `kubepods/besteffort`.
    pub besteffort: CgroupName,
}

impl QosContainersInfo {
    /// The tiers below `root` (the node allocatable cgroup, `kubepods`).
    pub fn new(root: &CgroupName) -> Self {
        Self {
            guaranteed: root.clone(),
            burstable: root.child("burstable"),
            besteffort: root.child("besteffort"),
        }
    }

    /// The parent cgroup of a pod of class `qos`.
    pub fn parent(&self, qos: QosClass) -> &CgroupName {
        match qos {
            QosClass::Guaranteed => &self.guaranteed,
            QosClass::Burstable => &self.burstable,
            QosClass::BestEffort => &self.besteffort,
        }
    }
}

/// Keeps the QoS tiers (upstream `qosContainerManagerImpl`).
pub struct QosContainerManager {
    cgroups: Arc<CgroupManager>,
    info: QosContainersInfo,
    /// Serialises updates, as upstream's mutex does.
    lock: parking_lot::Mutex<()>,
}

/// Every huge page size of the host unbounded (upstream `setHugePagesUnbounded`).
fn hugepages_unbounded(cgroups: &CgroupManager, rc: &mut ResourceConfig) {
    for size in cgroups_hugepage_sizes(cgroups) {
        rc.hugepage_limit.insert(size, 1 << 62);
    }
}

fn cgroups_hugepage_sizes(cgroups: &CgroupManager) -> Vec<i64> {
    cgroups
        .hugepage_sizes()
        .iter()
        .filter_map(|s| hugepage_unit_size_to_bytes(s))
        .collect()
}

impl QosContainerManager {
    /// A manager of the tiers below `root`.
    pub fn new(cgroups: Arc<CgroupManager>, root: &CgroupName) -> Self {
        Self {
            cgroups,
            info: QosContainersInfo::new(root),
            lock: parking_lot::Mutex::new(()),
        }
    }

    /// The tiers' names.
    pub fn info(&self) -> &QosContainersInfo {
        &self.info
    }

    /// Creates the Burstable and BestEffort tiers, or brings existing ones
    /// to the start state (upstream `Start`). Blocking IO.
    pub fn start(&self) -> Result<(), CgroupError> {
        self.cgroups.validate(&self.info.guaranteed)?;
        for (qos, name) in [
            (QosClass::Burstable, &self.info.burstable),
            (QosClass::BestEffort, &self.info.besteffort),
        ] {
            let mut rc = ResourceConfig::default();
            if qos == QosClass::BestEffort {
                rc.cpu_shares = Some(MIN_SHARES);
            }
            hugepages_unbounded(&self.cgroups, &mut rc);
            if self.cgroups.exists(name) {
                self.cgroups.update(name, &rc)?;
            } else {
                self.cgroups.create(name, &rc)?;
            }
        }
        Ok(())
    }

    /// The tiers' settings for `pods` (upstream `setCPUCgroupConfig` and
    /// `setHugePagesConfig`).
    pub fn desired(&self, pods: &[Arc<Pod>]) -> [(CgroupName, ResourceConfig); 3] {
        let burstable_milli: i64 = pods
            .iter()
            .filter(|p| pod_qos(p) == QosClass::Burstable)
            .filter_map(|p| pod_requests(p).get("cpu").map(|q| q.milli_value()))
            .sum();
        let mut g = ResourceConfig::default();
        let mut b = ResourceConfig {
            cpu_shares: Some(milli_cpu_to_shares(burstable_milli)),
            ..Default::default()
        };
        let mut be = ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..Default::default()
        };
        for rc in [&mut g, &mut b, &mut be] {
            hugepages_unbounded(&self.cgroups, rc);
        }
        [
            (self.info.guaranteed.clone(), g),
            (self.info.burstable.clone(), b),
            (self.info.besteffort.clone(), be),
        ]
    }

    /// Writes the tiers' settings for the active `pods` (upstream
    /// `UpdateCgroups`). Blocking IO.
    pub fn update_cgroups(&self, pods: &[Arc<Pod>]) -> Result<(), CgroupError> {
        let _held = self.lock.lock();
        for (name, rc) in self.desired(pods) {
            self.cgroups.update(&name, &rc)?;
        }
        tracing::debug!("Updated QoS cgroup configuration");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup_manager::CgroupSubsystems;
    use kubelet_types::CgroupDriver;

    fn pod(json: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(json).expect("pod"))
    }

    fn read(p: std::path::PathBuf) -> String {
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn tiers_are_created_and_burstable_shares_follow_requests() {
        let mnt = tempfile::tempdir().expect("tempdir");
        let subs = CgroupSubsystems::v1(mnt.path(), &["cpu", "memory", "pids", "hugetlb"]);
        let cgroups = Arc::new(CgroupManager::new(
            subs,
            CgroupDriver::Cgroupfs,
            vec!["2MB".into()],
        ));
        let root = CgroupName::root().child("kubepods");
        let qos = QosContainerManager::new(cgroups.clone(), &root);
        assert!(qos.start().is_err(), "kubepods must exist first");
        cgroups
            .create(&root, &ResourceConfig::default())
            .expect("kubepods");
        qos.start().expect("start");
        assert_eq!(
            read(mnt.path().join("cpu/kubepods/besteffort/cpu.shares")),
            "2"
        );
        assert!(mnt.path().join("memory/kubepods/burstable").is_dir());
        assert_eq!(
            read(
                mnt.path()
                    .join("hugetlb/kubepods/burstable/hugetlb.2MB.limit_in_bytes")
            ),
            (1i64 << 62).to_string()
        );
        let b = |cpu: &str| {
            pod(
                serde_json::json!({"metadata": {"uid": cpu}, "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": cpu}}}]}}),
            )
        };
        let g = pod(
            serde_json::json!({"metadata": {"uid": "g"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}]}}),
        );
        qos.update_cgroups(&[b("100m"), b("400m"), g])
            .expect("update");
        assert_eq!(
            read(mnt.path().join("cpu/kubepods/burstable/cpu.shares")),
            "512"
        );
        qos.update_cgroups(&[]).expect("update");
        assert_eq!(
            read(mnt.path().join("cpu/kubepods/burstable/cpu.shares")),
            "2"
        );
    }
}
