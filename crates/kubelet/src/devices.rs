//! Device plugins in the kubelet (upstream `ContainerManager`'s device manager
//! hooks): the pods the device manager may free devices of, admission
//! (`GetAllocateResourcesPodAdmitHandler`, `UpdatePluginResources`), node
//! capacity (`GetDevicePluginResourceCapacity`,
//! `ShouldResetExtendedResourceCapacity`) and the pod-resources API's pods
//! and devices, each over `kubelet-devicemanager` or the pod manager.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kubelet_devicemanager::{ActivePods, DeviceManager, ResourceDeviceInstances};
use kubelet_node::{DeviceCapacity, ExtendedResources};
use kubelet_podconfig::SourcesReady;
use kubelet_podresources::pb::ContainerDevices;
use kubelet_podresources::{
    ApiMethod, DeviceInstance, DevicesProvider, PodInfo, PodResourcesMetrics, PodsProvider,
    container_devices,
};
use kubelet_types::pod;
use tracing::{info, warn};

use crate::lifecycle::{Rejection, ResourceAllocator};
use crate::pod_manager::PodManager;
use crate::status::StatusManager;

/// Pods admitted and not in a terminal phase (upstream
/// `filterOutInactivePods`): a rejected pod is `Failed`; a pod this kubelet
/// has no status for yet goes by its own (a finished pod seen again after a
/// restart).
pub fn active_pods(pods: &PodManager, status: &StatusManager) -> Vec<Arc<Pod>> {
    pods.get_pods()
        .into_iter()
        .filter(|p| {
            let phase = status
                .get_pod_status(pod::uid(p))
                .and_then(|s| s.phase)
                .or_else(|| p.status.as_ref().and_then(|s| s.phase.clone()));
            !phase
                .and_then(|ph| ph.parse::<kubelet_types::PodPhase>().ok())
                .is_some_and(kubelet_types::PodPhase::is_terminal)
        })
        .collect()
}

struct Bound {
    pods: PodManager,
    status: Arc<StatusManager>,
    sources: Arc<SourcesReady>,
}

/// The kubelet's pods as the device manager reads them (upstream
/// `ActivePodsFunc` and `sourcesReady`). The device manager starts before
/// the pod pipeline exists, so the pod manager is bound later; until then
/// there are no pods and the sources are not ready.
#[derive(Default)]
pub struct KubeletActivePods {
    bound: OnceLock<Bound>,
}

impl KubeletActivePods {
    /// Binds the pod manager, the status manager and the sources.
    pub fn bind(&self, pods: PodManager, status: Arc<StatusManager>, sources: Arc<SourcesReady>) {
        if self
            .bound
            .set(Bound {
                pods,
                status,
                sources,
            })
            .is_err()
        {
            warn!("The device manager's pod source was bound twice; keeping the first");
        }
    }
}

impl ActivePods for KubeletActivePods {
    fn active_pod_uids(&self) -> HashSet<String> {
        let Some(b) = self.bound.get() else {
            return HashSet::new();
        };
        active_pods(&b.pods, &b.status)
            .iter()
            .map(|p| pod::uid(p).to_string())
            .collect()
    }

    fn sources_ready(&self) -> bool {
        // Upstream `sourcesReady.AllReady()`: every source's first update
        // handled by the sync loop, so the pods it carries are admitted.
        self.bound.get().is_some_and(|b| b.sources.all_handled())
    }
}

/// How long start waits for the runtime's container list.
const LIST_DEADLINE: Duration = Duration::from_secs(10);

/// The (pod UID, container name) pairs the runtime runs (upstream
/// `buildContainerMapAndRunningSetFromRuntime`); empty when the runtime
/// cannot be listed, as upstream logs and goes on.
pub async fn running_containers(runtime: &dyn cri::RuntimeService) -> HashSet<(String, String)> {
    let containers = match tokio::time::timeout(LIST_DEADLINE, runtime.list_containers(None)).await
    {
        Ok(Ok(c)) => c,
        Ok(Err(error)) => {
            warn!(%error, "Failed to list running containers; the device manager assumes none run");
            return HashSet::new();
        }
        Err(_) => {
            warn!(deadline = ?LIST_DEADLINE, "Listing running containers timed out; the device manager assumes none run");
            return HashSet::new();
        }
    };
    let running: HashSet<(String, String)> = containers
        .into_iter()
        .filter(|c| c.state == cri::pb::ContainerState::ContainerRunning as i32)
        .filter_map(|c| {
            let uid = c.labels.get(kubelet_types::labels::POD_UID)?.clone();
            let name = c.labels.get(kubelet_types::labels::CONTAINER_NAME)?.clone();
            Some((uid, name))
        })
        .collect();
    info!(
        running = running.len(),
        "Containers running at start, for the device manager"
    );
    running
}

/// The device manager as an admit handler (upstream resource allocator).
pub struct DeviceAllocator(pub DeviceManager);

impl ResourceAllocator for DeviceAllocator {
    fn allocate(&self, p: &Pod) -> Result<(), Rejection> {
        // A pod the apiserver already reports finished never runs again: it
        // holds no devices (the admitter does not even ask).
        if crate::lifecycle::api_phase_terminal(p) || !self.0.requests_devices(p) {
            return Ok(());
        }
        // Admission runs inside the sync loop, which waits for it as
        // upstream's does; plugin calls have their own deadlines.
        let handle = tokio::runtime::Handle::current();
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err((
                kubelet_devicemanager::UNEXPECTED_ADMISSION_ERROR.into(),
                "Allocate failed due to a runtime that cannot wait for device plugins, which is unexpected".into(),
            ));
        }
        let dm = self.0.clone();
        tokio::task::block_in_place(|| handle.block_on(dm.admit_pod(p)))
            .map_err(|r| (r.reason.to_string(), r.message))
    }

    fn update_plugin_resources(&self, p: &Pod, allocatable: &mut BTreeMap<String, ApiQuantity>) {
        if !self.0.has_pod(pod::uid(p)) {
            return;
        }
        for (resource, held) in self.0.allocated_device_counts() {
            let have = allocatable
                .get(&resource)
                .and_then(|q| kubelet_types::quantity::Quantity::from_api(q).ok())
                .map_or(0, |q| q.value());
            if have < held {
                info!(%resource, allocatable = have, allocated = held,
                    "Raising node allocatable to the devices allocated");
                allocatable.insert(resource, ApiQuantity(held.to_string()));
            }
        }
    }
}

/// The device manager as node status reads it.
pub struct NodeDevices(pub DeviceManager);

#[async_trait::async_trait]
impl ExtendedResources for NodeDevices {
    async fn capacity(&self) -> DeviceCapacity {
        let c = self.0.get_capacity().await;
        DeviceCapacity {
            capacity: c.capacity,
            allocatable: c.allocatable,
            deleted: c.deleted,
        }
    }

    async fn should_reset_capacity(&self) -> bool {
        self.0.should_reset_extended_resource_capacity().await
    }
}

/// The kubelet's pods as the pod-resources API reads them.
pub struct ResourcePods {
    /// Desired pods.
    pub pods: PodManager,
    /// Their statuses (terminal ones are not active).
    pub status: Arc<StatusManager>,
}

impl PodsProvider for ResourcePods {
    fn pods(&self) -> Vec<PodInfo> {
        self.pods
            .get_pods()
            .iter()
            .map(|p| PodInfo::from_pod(p))
            .collect()
    }

    fn active_pods(&self) -> Vec<PodInfo> {
        active_pods(&self.pods, &self.status)
            .iter()
            .map(|p| PodInfo::from_pod(p))
            .collect()
    }

    fn pod_by_name(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.pods
            .get_pods()
            .iter()
            .find(|p| pod::namespace(p) == namespace && p.metadata.name.as_deref() == Some(name))
            .map(|p| PodInfo::from_pod(p))
    }
}

fn instances(devs: ResourceDeviceInstances) -> Vec<ContainerDevices> {
    container_devices(devs.into_iter().flat_map(|(resource, by_id)| {
        by_id.into_values().map(move |d| DeviceInstance {
            resource: resource.clone(),
            id: d.id,
            numa_nodes: d
                .topology
                .map(|t| t.nodes.into_iter().map(|n| n.id).collect::<Vec<_>>())
                .filter(|n| !n.is_empty()),
        })
    }))
}

/// The device manager as the pod-resources API reads it.
pub struct ResourceDevices(pub DeviceManager);

impl DevicesProvider for ResourceDevices {
    fn update_allocated_devices(&self) {
        self.0.update_allocated_devices();
    }

    fn devices(&self, pod_uid: &str, container: &str) -> Vec<ContainerDevices> {
        instances(self.0.get_devices(pod_uid, container))
    }

    fn allocatable_devices(&self) -> Vec<ContainerDevices> {
        instances(self.0.get_allocatable_devices())
    }
}

/// The pod-resources request counters in the kubelet's registry.
pub struct ResourceMetrics(pub Arc<kubelet_metrics::KubeletMetrics>);

impl PodResourcesMetrics for ResourceMetrics {
    fn request(&self, method: ApiMethod) {
        self.0
            .pod_resources_request(method.api_version(), method.as_str());
    }

    fn error(&self, method: ApiMethod) {
        self.0
            .pod_resources_error(method.api_version(), method.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_devicemanager::v1beta1::{Device, NumaNode, TopologyInfo};

    #[test]
    fn devices_with_topology_are_reported_per_numa_node() {
        let devs = BTreeMap::from([(
            "example.com/resource".to_string(),
            BTreeMap::from([
                (
                    "a".to_string(),
                    Device {
                        id: "a".into(),
                        health: "Healthy".into(),
                        topology: Some(TopologyInfo {
                            nodes: vec![NumaNode { id: 0 }],
                        }),
                    },
                ),
                (
                    "b".to_string(),
                    Device {
                        id: "b".into(),
                        health: "Healthy".into(),
                        topology: Some(TopologyInfo { nodes: vec![] }),
                    },
                ),
            ]),
        )]);
        let got: Vec<_> = instances(devs)
            .into_iter()
            .map(|d| {
                (
                    d.resource_name,
                    d.device_ids.join(","),
                    d.topology.map(|t| t.nodes[0].id),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("example.com/resource".to_string(), "a".to_string(), Some(0)),
                ("example.com/resource".to_string(), "b".to_string(), None),
            ]
        );
    }

    #[test]
    fn sources_are_ready_once_the_sync_loop_handled_each_first_update() {
        let ready = Arc::new(SourcesReady::new([kubelet_types::Source::File]));
        let active = KubeletActivePods::default();
        assert!(!active.sources_ready(), "nothing bound");
        active.bind(PodManager::default(), Arc::default(), ready.clone());
        assert!(!active.sources_ready(), "the file source has not reported");
        ready.mark(kubelet_types::Source::File);
        assert!(
            !active.sources_ready(),
            "reported, but its pods are not admitted yet"
        );
        ready.mark_handled(kubelet_types::Source::File);
        assert!(active.sources_ready());
    }
}
