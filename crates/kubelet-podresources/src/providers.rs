//! What the pod-resources server reads (upstream `podresources/types.go`:
//! `PodsProvider`, `DevicesProvider`, `CPUsProvider`, `MemoryProvider`).
//! The kubelet implements them over its pod manager and resource managers;
//! `NoDevices`, `NoCpus` and `NoMemory` stand in for managers the node does
//! not run. Every method answers from memory: it must not block.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pb::{ContainerDevices, ContainerMemory, NumaNode, TopologyInfo};

/// A pod as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.uid`: the key of the managers' assignments.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// Restartable init containers (sidecars), reported by v1 before the
    /// regular containers. Other init containers are never reported.
    pub sidecars: Vec<String>,
    /// The regular containers.
    pub containers: Vec<String>,
}

impl PodInfo {
    /// The pod's reported identity and containers.
    pub fn from_pod(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|c| kubelet_types::pod::is_restartable_init_container(c))
            .map(|c| c.name.clone())
            .collect();
        let regular = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            sidecars,
            containers: regular.iter().map(|c| c.name.clone()).collect(),
        }
    }

    /// The containers v1 reports, in upstream's order: sidecars first.
    pub fn v1_containers(&self) -> impl Iterator<Item = &String> {
        self.sidecars.iter().chain(&self.containers)
    }
}

/// One device a plugin advertised: its resource, its id, and the NUMA nodes
/// of its `TopologyInfo` (`None` when the plugin reported no topology).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInstance {
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// The plugin's device id.
    pub id: String,
    /// NUMA node ids, when the plugin reported them.
    pub numa_nodes: Option<Vec<i64>>,
}

/// Devices as the API reports them (upstream
/// `containerDevicesFromResourceDeviceInstances`): one entry per device, or
/// one per device and NUMA node when the plugin reported a topology; a
/// device without topology is still reported.
pub fn container_devices(
    devices: impl IntoIterator<Item = DeviceInstance>,
) -> Vec<ContainerDevices> {
    let mut out = Vec::new();
    for dev in devices {
        match dev.numa_nodes {
            None => out.push(ContainerDevices {
                resource_name: dev.resource,
                device_ids: vec![dev.id],
                topology: None,
            }),
            Some(nodes) => out.extend(nodes.into_iter().map(|id| ContainerDevices {
                resource_name: dev.resource.clone(),
                device_ids: vec![dev.id.clone()],
                topology: Some(TopologyInfo {
                    nodes: vec![NumaNode { id }],
                }),
            })),
        }
    }
    out
}

/// The kubelet's pods (upstream `PodsProvider`).
pub trait PodsProvider: Send + Sync + 'static {
    /// Every pod the kubelet knows, terminated ones included (upstream
    /// `GetPods`; v1alpha1 lists these).
    fn pods(&self) -> Vec<PodInfo>;
    /// Pods admitted and not yet terminated (upstream `GetActivePods`).
    fn active_pods(&self) -> Vec<PodInfo>;
    /// Any pod the kubelet knows by namespace and name (upstream
    /// `GetPodByName`).
    fn pod_by_name(&self, namespace: &str, name: &str) -> Option<PodInfo>;
}

/// Devices from device plugins (upstream `DevicesProvider`).
pub trait DevicesProvider: Send + Sync + 'static {
    /// Refreshes the assignments before a `List` (upstream
    /// `UpdateAllocatedDevices`: forgets the devices of containers gone).
    fn update_allocated_devices(&self) {}
    /// Devices assigned to one container.
    fn devices(&self, pod_uid: &str, container: &str) -> Vec<ContainerDevices>;
    /// Every healthy device the node has, assigned or not.
    fn allocatable_devices(&self) -> Vec<ContainerDevices>;
}

/// Exclusive CPUs from the CPU manager (upstream `CPUsProvider`).
pub trait CpusProvider: Send + Sync + 'static {
    /// CPUs assigned to one container.
    fn cpus(&self, pod_uid: &str, container: &str) -> Vec<i64>;
    /// CPUs the CPU manager may assign.
    fn allocatable_cpus(&self) -> Vec<i64>;
}

/// Memory and huge pages from the memory manager (upstream `MemoryProvider`).
pub trait MemoryProvider: Send + Sync + 'static {
    /// Memory pinned for one container.
    fn memory(&self, pod_uid: &str, container: &str) -> Vec<ContainerMemory>;
    /// Memory the memory manager may assign.
    fn allocatable_memory(&self) -> Vec<ContainerMemory>;
}

/// A node without device plugins.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDevices;

impl DevicesProvider for NoDevices {
    fn devices(&self, _: &str, _: &str) -> Vec<ContainerDevices> {
        Vec::new()
    }
    fn allocatable_devices(&self) -> Vec<ContainerDevices> {
        Vec::new()
    }
}

/// A node without the static CPU manager policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCpus;

impl CpusProvider for NoCpus {
    fn cpus(&self, _: &str, _: &str) -> Vec<i64> {
        Vec::new()
    }
    fn allocatable_cpus(&self) -> Vec<i64> {
        Vec::new()
    }
}

/// A node without the static memory manager policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMemory;

impl MemoryProvider for NoMemory {
    fn memory(&self, _: &str, _: &str) -> Vec<ContainerMemory> {
        Vec::new()
    }
    fn allocatable_memory(&self) -> Vec<ContainerMemory> {
        Vec::new()
    }
}

/// The providers the server reads (upstream `PodResourcesProviders`).
#[derive(Clone)]
pub struct PodResourcesProviders {
    /// The kubelet's pods.
    pub pods: Arc<dyn PodsProvider>,
    /// Device plugins' devices.
    pub devices: Arc<dyn DevicesProvider>,
    /// The CPU manager.
    pub cpus: Arc<dyn CpusProvider>,
    /// The memory manager.
    pub memory: Arc<dyn MemoryProvider>,
}

impl PodResourcesProviders {
    /// Providers for a node with pods only: no devices, CPUs or memory.
    pub fn pods_only(pods: Arc<dyn PodsProvider>) -> Self {
        Self {
            pods,
            devices: Arc::new(NoDevices),
            cpus: Arc::new(NoCpus),
            memory: Arc::new(NoMemory),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn container(name: &str, restart: Option<&str>) -> Container {
        Container {
            name: name.into(),
            restart_policy: restart.map(str::to_string),
            ..Container::default()
        }
    }

    #[test]
    fn one_entry_per_device_and_numa_node() {
        let got = container_devices(vec![
            DeviceInstance {
                resource: "example.com/gpu".into(),
                id: "gpu0".into(),
                numa_nodes: Some(vec![0, 1]),
            },
            DeviceInstance {
                resource: "example.com/nic".into(),
                id: "nic0".into(),
                numa_nodes: None,
            },
        ]);
        let flat: Vec<_> = got
            .iter()
            .map(|d| {
                let numa = d.topology.as_ref().map(|t| t.nodes[0].id);
                (d.resource_name.as_str(), d.device_ids.join(","), numa)
            })
            .collect();
        assert_eq!(
            flat,
            vec![
                ("example.com/gpu", "gpu0".to_string(), Some(0)),
                ("example.com/gpu", "gpu0".to_string(), Some(1)),
                ("example.com/nic", "nic0".to_string(), None),
            ]
        );
    }

    #[test]
    fn sidecars_come_first_and_plain_init_containers_are_left_out() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(vec![
                    container("setup", None),
                    container("proxy", Some("Always")),
                ]),
                containers: vec![container("app", None), container("log", None)],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let info = PodInfo::from_pod(&pod);
        assert_eq!(info.uid, "u1");
        assert_eq!(info.name, "p");
        assert_eq!(info.namespace, "ns");
        assert_eq!(info.sidecars, vec!["proxy"]);
        assert_eq!(info.containers, vec!["app", "log"]);
        let v1: Vec<_> = info.v1_containers().collect();
        assert_eq!(v1, vec!["proxy", "app", "log"]);
    }
}
