//! The container manager the kubelet builds at start (upstream
//! `cm/container_manager_linux.go` `NewContainerManager`, `setupNode`,
//! `Start`, `UpdateQOSCgroups`, `NewPodContainerManager`): checks the
//! cgroup root, creates `kubepods` with node allocatable and the QoS tiers,
//! keeps them current, and creates and removes pod cgroups.
//!
//! Cgroup IO runs on the blocking pool with a deadline. With the systemd
//! driver every cgroup is a slice unit, created and changed through
//! systemd's D-Bus API ([`crate::systemd_dbus`]) before its files are
//! written, as upstream's libcontainer manager does.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::CgroupDriver;
use kubelet_types::events::{EventType, Recorder, node_ref};
use kubelet_types::quantity::Quantity;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cgroup_manager::CgroupManager;
use crate::cgroup_name::CgroupName;
use crate::helpers::CfsSettings;
use crate::node_container_manager::{NODE_ALLOCATABLE_CGROUP, node_allocatable_config};
use crate::pod_container_manager::{PodCgroups, PodContainerManager};
use crate::qos_container_manager::{PERIODIC_UPDATE_INTERVAL, QosContainerManager};
use crate::systemd_unit::SystemdUnits;
use crate::{CgroupError, CgroupSubsystems, reason};

/// Deadline of one cgroup operation (a systemd slice operation ends within
/// 15 s, two of them in one operation within 30 s).
const OP_DEADLINE: Duration = Duration::from_secs(45);
/// Wait between attempts to enforce node allocatable (upstream: a minute).
const ENFORCE_RETRY: Duration = Duration::from_secs(60);

/// The pods the kubelet wants running (upstream `ActivePodsFunc`).
pub type ActivePods = Arc<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>;

/// Node-level settings (upstream `NodeConfig`).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Node name, for events.
    pub node_name: String,
    /// `cgroupDriver`.
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot` (cgroupfs syntax, default `/`).
    pub cgroup_root: String,
    /// `cgroupsPerQOS` (default true).
    pub cgroups_per_qos: bool,
    /// `cpuCFSQuota`, `cpuCFSQuotaPeriod`, `CustomCPUCFSQuotaPeriod`.
    pub cfs: CfsSettings,
    /// `podPidsLimit` (-1 or 0: none).
    pub pod_pids_limit: i64,
    /// `enforceNodeAllocatable` (default `["pods"]`).
    pub enforce_node_allocatable: Vec<String>,
    /// Capacity including `pid` (upstream `internalCapacity`).
    pub capacity: BTreeMap<String, Quantity>,
    /// `kubeReserved`.
    pub kube_reserved: BTreeMap<String, Quantity>,
    /// `systemReserved`.
    pub system_reserved: BTreeMap<String, Quantity>,
}

/// The kubelet's container manager (upstream `containerManagerImpl`).
pub struct ContainerManager {
    cfg: NodeConfig,
    cgroups: Arc<CgroupManager>,
    /// `<cgroupRoot>/kubepods` (or `<cgroupRoot>` without `cgroupsPerQOS`).
    root: CgroupName,
    qos: Arc<QosContainerManager>,
    pods: Arc<PodCgroups>,
    active_pods: OnceLock<ActivePods>,
    recorder: OnceLock<Arc<dyn Recorder>>,
}

/// Runs blocking cgroup IO off the async runtime, with a deadline.
async fn blocking<T: Send + 'static>(
    name: &CgroupName,
    f: impl FnOnce() -> Result<T, CgroupError> + Send + 'static,
) -> Result<T, CgroupError> {
    let incomplete = |reason: String| CgroupError::Incomplete {
        name: name.to_cgroupfs(),
        reason,
    };
    match tokio::time::timeout(OP_DEADLINE, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(incomplete(e.to_string())),
        Err(_) => Err(incomplete(format!("no answer within {OP_DEADLINE:?}"))),
    }
}

impl ContainerManager {
    /// A manager over `subsystems` (see [`CgroupSubsystems::detect`]) and the
    /// host's huge page sizes. Touches nothing until [`Self::start`].
    pub fn new(cfg: NodeConfig, subsystems: CgroupSubsystems, hugepage_sizes: Vec<String>) -> Self {
        Self::with_units(cfg, subsystems, hugepage_sizes, None)
    }

    /// As [`Self::new`], with systemd's unit manager for the systemd driver
    /// (without it that driver computes names only and writes nothing).
    pub fn with_units(
        cfg: NodeConfig,
        subsystems: CgroupSubsystems,
        hugepage_sizes: Vec<String>,
        units: Option<Arc<dyn SystemdUnits>>,
    ) -> Self {
        let mut manager = CgroupManager::new(subsystems, cfg.cgroup_driver, hugepage_sizes);
        if let Some(u) = units {
            manager = manager.with_systemd(u);
        }
        let cgroups = Arc::new(manager);
        let mut root = CgroupName::parse_cgroupfs(&cfg.cgroup_root);
        if cfg.cgroups_per_qos {
            root = root.child(NODE_ALLOCATABLE_CGROUP);
        }
        let qos = Arc::new(QosContainerManager::new(cgroups.clone(), &root));
        let pods = Arc::new(PodCgroups::new(
            cgroups.clone(),
            qos.info().clone(),
            cfg.pod_pids_limit,
            cfg.cfs,
        ));
        Self {
            cfg,
            cgroups,
            root,
            qos,
            pods,
            active_pods: OnceLock::new(),
            recorder: OnceLock::new(),
        }
    }

    /// Whether the kubelet writes cgroups (`cgroupsPerQOS`, with the
    /// cgroupfs driver or systemd's units).
    pub fn manages_cgroups(&self) -> bool {
        self.cfg.cgroups_per_qos
            && (self.cfg.cgroup_driver == CgroupDriver::Cgroupfs
                || self.cgroups.uses_systemd_units())
    }

    /// The node allocatable cgroup (`<cgroupRoot>/kubepods`).
    pub fn node_allocatable_root(&self) -> &CgroupName {
        &self.root
    }

    /// The cgroup writer.
    pub fn cgroup_manager(&self) -> &Arc<CgroupManager> {
        &self.cgroups
    }

    /// Pod cgroups.
    pub fn pod_cgroups(&self) -> &Arc<PodCgroups> {
        &self.pods
    }

    /// Where node events go. Set once.
    pub fn set_recorder(&self, recorder: Arc<dyn Recorder>) {
        let _ = self.recorder.set(recorder);
    }

    /// Where the QoS tiers learn the active pods. Set once.
    pub fn set_active_pods(&self, pods: ActivePods) {
        let _ = self.active_pods.set(pods);
    }

    fn event(&self, kind: EventType, reason: &str, message: String) {
        if let Some(r) = self.recorder.get() {
            r.event(&node_ref(&self.cfg.node_name), kind, reason, message);
        }
    }

    /// Checks the cgroup root, creates `kubepods` with node allocatable and
    /// the QoS tiers (upstream `NewContainerManager`'s validation,
    /// `setupNode`, `createNodeAllocatableCgroups`, `qosContainerManager.Start`).
    /// An error here stops the kubelet, as upstream's "Failed to start
    /// ContainerManager" does.
    pub async fn start(&self) -> Result<(), CgroupError> {
        if !self.cfg.cgroups_per_qos {
            return Ok(());
        }
        if !self.manages_cgroups() {
            warn!(
                "cgroupDriver systemd without systemd's bus: no slices are created and no QoS or node allocatable limits are written"
            );
            return Ok(());
        }
        let cgroups = self.cgroups.clone();
        let user_root = CgroupName::parse_cgroupfs(&self.cfg.cgroup_root);
        let root = self.root.clone();
        let rc = self.node_allocatable();
        let qos = self.qos.clone();
        blocking(&self.root, move || {
            cgroups.validate(&user_root)?;
            info!(cgroup_root = %user_root, "Container manager verified user specified cgroup-root exists");
            if !cgroups.exists(&root) {
                cgroups.create(&root, &rc)?;
            }
            qos.start()
        })
        .await?;
        self.update_qos_cgroups().await
    }

    fn node_allocatable(&self) -> crate::ResourceConfig {
        node_allocatable_config(
            &self.cfg.capacity,
            &self.cfg.system_reserved,
            &self.cfg.kube_reserved,
            &self.cfg.enforce_node_allocatable,
            self.cfg.cgroups_per_qos,
        )
    }

    /// Writes node allocatable on `kubepods` once (upstream
    /// `enforceNodeAllocatableCgroups`' update), with its event.
    pub async fn enforce_node_allocatable(&self) -> Result<(), CgroupError> {
        let (cgroups, root, rc) = (
            self.cgroups.clone(),
            self.root.clone(),
            self.node_allocatable(),
        );
        let r = blocking(&self.root, move || cgroups.update(&root, &rc)).await;
        match &r {
            Ok(()) => self.event(
                EventType::Normal,
                reason::SUCCESSFUL_NODE_ALLOCATABLE_ENFORCEMENT,
                "Updated Node Allocatable limit across pods".into(),
            ),
            Err(e) => self.event(
                EventType::Warning,
                reason::FAILED_NODE_ALLOCATABLE_ENFORCEMENT,
                format!(
                    "Failed to update Node Allocatable Limits {:?}: {e}",
                    self.root.to_cgroupfs()
                ),
            ),
        }
        r
    }

    /// Brings the QoS tiers to the active pods' state (upstream `UpdateQOSCgroups`).
    pub async fn update_qos_cgroups(&self) -> Result<(), CgroupError> {
        if !self.manages_cgroups() {
            return Ok(());
        }
        let pods = self.active_pods.get().map(|f| f()).unwrap_or_default();
        let qos = self.qos.clone();
        blocking(&self.root, move || qos.update_cgroups(&pods)).await
    }

    /// Removes the cgroups of pods on disk that are not in `possibly_running`
    /// (upstream `Kubelet.cleanupOrphanedPodCgroups`, called from
    /// housekeeping with the UIDs of pods whose workers have not finished,
    /// and of pods whose volumes are still mounted): cpu.shares go to the
    /// minimum first, then what is left in the cgroup is killed and it is
    /// removed. Returns the UIDs whose cgroups were removed.
    pub async fn cleanup_orphaned_pod_cgroups(
        &self,
        possibly_running: std::collections::HashSet<String>,
    ) -> Vec<String> {
        if !self.manages_cgroups() {
            return vec![];
        }
        let (pods, cgroups) = (self.pods.clone(), self.cgroups.clone());
        let r = blocking(&self.root, move || {
            let mut removed = vec![];
            for (uid, name) in pods.all_pods_from_cgroups() {
                if possibly_running.contains(&uid) {
                    continue;
                }
                info!(pod.uid = %uid, "Orphaned pod found, removing pod cgroups");
                let min = crate::ResourceConfig {
                    cpu_shares: Some(crate::helpers::MIN_SHARES),
                    ..Default::default()
                };
                if let Err(e) = cgroups.update(&name, &min) {
                    warn!(pod.uid = %uid, error = %e, "Failed to reduce cpu time for pod pending volume cleanup");
                }
                match pods.destroy(&name) {
                    Ok(()) => removed.push(uid),
                    Err(e) => warn!(pod.uid = %uid, error = %e, "Failed to destroy orphaned pod cgroup"),
                }
            }
            Ok(removed)
        })
        .await;
        r.unwrap_or_else(|e| {
            warn!(error = %e, "Orphaned pod cgroup cleanup did not complete");
            vec![]
        })
    }

    /// Enforces node allocatable until it sticks (retrying every minute, as
    /// upstream) and updates the QoS tiers every minute, until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        if !self.manages_cgroups() {
            return;
        }
        let mut enforced = self.root.is_root();
        let mut enforce_at = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(PERIODIC_UPDATE_INTERVAL);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(enforce_at), if !enforced => {
                    match self.enforce_node_allocatable().await {
                        Ok(()) => enforced = true,
                        Err(e) => {
                            warn!(error = %e, "Failed to enforce node allocatable");
                            enforce_at = tokio::time::Instant::now() + ENFORCE_RETRY;
                        }
                    }
                }
                _ = tick.tick() => {
                    if let Err(e) = self.update_qos_cgroups().await {
                        info!(error = %e, "Failed to reserve QoS requests");
                    }
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl PodContainerManager for ContainerManager {
    async fn ensure_exists(&self, pod: &Pod) -> Result<(), CgroupError> {
        if !self.manages_cgroups() {
            return Ok(());
        }
        let name = self.pods.pod_container_name(pod);
        let (pods, p) = (self.pods.clone(), pod.clone());
        if blocking(&name, move || Ok(pods.exists(&p))).await? {
            return Ok(());
        }
        if let Err(e) = self.update_qos_cgroups().await {
            warn!(error = %e, "Failed to update QoS cgroups while syncing pod");
        }
        let (pods, p) = (self.pods.clone(), pod.clone());
        blocking(&name, move || pods.ensure_exists(&p)).await
    }

    async fn destroy(&self, pod_uid: &str) -> Result<(), CgroupError> {
        if !self.manages_cgroups() {
            return Ok(());
        }
        let pods = self.pods.clone();
        let uid = pod_uid.to_string();
        let name = self.root.child(&format!("pod{uid}"));
        let r = blocking(&name, move || {
            // The pod may be gone from the pod manager: find its tier on disk.
            match pods.all_pods_from_cgroups().remove(&uid) {
                Some(found) => pods.destroy(&found),
                None => Ok(()),
            }
        })
        .await;
        // The tiers no longer count the pod (upstream `killPod` updates them).
        if let Err(e) = self.update_qos_cgroups().await {
            debug!(error = %e, "Failed to update QoS cgroups while killing pod");
        }
        r
    }

    fn cgroup_parent(&self, pod: &Pod) -> String {
        if !self.cfg.cgroups_per_qos {
            return String::new();
        }
        self.pods.cgroup_parent(pod)
    }
}

#[cfg(test)]
mod tests;
