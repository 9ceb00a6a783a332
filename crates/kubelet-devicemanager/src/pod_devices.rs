//! Which devices each container of each pod holds (upstream
//! `devicemanager/pod_devices.go`): the device ids per NUMA node and the
//! plugin's `ContainerAllocateResponse`, and the runtime options merged from
//! those responses (upstream `deviceRunContainerOptions`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use prost::Message;

use crate::checkpoint::PodDevicesEntry;
use crate::v1beta1::{
    CdiDevice, ContainerAllocateResponse, Device, DeviceSpec, Mount, NumaNode, TopologyInfo,
};

/// Device ids by NUMA node id (upstream `checkpoint.DevicesPerNUMA`).
pub type DevicesPerNuma = BTreeMap<i64, Vec<String>>;

/// The NUMA node id of devices without topology (upstream `nodeWithoutTopology`).
pub const NODE_WITHOUT_TOPOLOGY: i64 = -1;

/// Devices by id, per resource name (upstream `ResourceDeviceInstances`).
pub type ResourceDeviceInstances = BTreeMap<String, BTreeMap<String, Device>>;

/// Device ids a container holds for one resource, and how to expose them.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceAllocateInfo {
    /// Allocated device ids by NUMA node.
    pub device_ids: DevicesPerNuma,
    /// The plugin's answer to `Allocate` for these devices.
    pub alloc_resp: ContainerAllocateResponse,
}

/// What the runtime must add to a container for its devices (upstream
/// `DeviceRunContainerOptions`), merged over all its resources; the first
/// setting of an env name, container path or annotation wins.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceRunContainerOptions {
    /// Environment variables, in order.
    pub envs: Vec<(String, String)>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Device nodes.
    pub devices: Vec<DeviceSpec>,
    /// Container annotations, in order.
    pub annotations: Vec<(String, String)>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<CdiDevice>,
}

/// Pod UID → container name → resource name → allocation.
#[derive(Debug, Clone, Default)]
pub struct PodDevices {
    devs: BTreeMap<String, BTreeMap<String, BTreeMap<String, DeviceAllocateInfo>>>,
}

/// The union of the device ids of all NUMA nodes.
pub fn all_ids(ids: &DevicesPerNuma) -> BTreeSet<String> {
    ids.values().flatten().cloned().collect()
}

impl PodDevices {
    /// UIDs of the pods holding devices.
    pub fn pods(&self) -> BTreeSet<String> {
        self.devs.keys().cloned().collect()
    }

    /// Whether the pod holds devices.
    pub fn has_pod(&self, pod_uid: &str) -> bool {
        self.devs.contains_key(pod_uid)
    }

    /// Names of the pod's containers holding devices.
    pub fn containers(&self, pod_uid: &str) -> Vec<String> {
        self.devs
            .get(pod_uid)
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Records an allocation, replacing the container's earlier one for the resource.
    pub fn insert(
        &mut self,
        pod_uid: &str,
        container: &str,
        resource: &str,
        device_ids: DevicesPerNuma,
        alloc_resp: ContainerAllocateResponse,
    ) {
        self.devs
            .entry(pod_uid.to_string())
            .or_default()
            .entry(container.to_string())
            .or_default()
            .insert(
                resource.to_string(),
                DeviceAllocateInfo {
                    device_ids,
                    alloc_resp,
                },
            );
    }

    /// Forgets the pods.
    pub fn delete(&mut self, pod_uids: &[String]) {
        for uid in pod_uids {
            self.devs.remove(uid);
        }
    }

    /// Device ids the container holds for the resource, `None` when it holds none.
    pub fn container_devices(
        &self,
        pod_uid: &str,
        container: &str,
        resource: &str,
    ) -> Option<BTreeSet<String>> {
        self.devs
            .get(pod_uid)?
            .get(container)?
            .get(resource)
            .map(|info| all_ids(&info.device_ids))
    }

    /// Adds the container's devices to `reusable` (an init container that has
    /// finished leaves its devices to the containers after it).
    pub fn add_container_allocated_resources(
        &self,
        pod_uid: &str,
        container: &str,
        reusable: &mut HashMap<String, BTreeSet<String>>,
    ) {
        let Some(resources) = self.devs.get(pod_uid).and_then(|c| c.get(container)) else {
            return;
        };
        for (resource, info) in resources {
            reusable
                .entry(resource.clone())
                .or_default()
                .extend(all_ids(&info.device_ids));
        }
    }

    /// Removes the container's devices from `reusable` (they are its own now).
    pub fn remove_container_allocated_resources(
        &self,
        pod_uid: &str,
        container: &str,
        reusable: &mut HashMap<String, BTreeSet<String>>,
    ) {
        let Some(resources) = self.devs.get(pod_uid).and_then(|c| c.get(container)) else {
            return;
        };
        for (resource, info) in resources {
            if let Some(set) = reusable.get_mut(resource) {
                for id in all_ids(&info.device_ids) {
                    set.remove(&id);
                }
            }
        }
    }

    /// All allocated device ids per resource (upstream `devices()`).
    pub fn devices(&self) -> HashMap<String, BTreeSet<String>> {
        let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
        for containers in self.devs.values() {
            for resources in containers.values() {
                for (resource, info) in resources {
                    out.entry(resource.clone())
                        .or_default()
                        .extend(all_ids(&info.device_ids));
                }
            }
        }
        out
    }

    /// The checkpoint entries (upstream `toCheckpointData`).
    pub fn to_checkpoint(&self) -> Vec<PodDevicesEntry> {
        let mut out = Vec::new();
        for (pod, containers) in &self.devs {
            for (container, resources) in containers {
                for (resource, info) in resources {
                    out.push(PodDevicesEntry {
                        pod_uid: pod.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: info.device_ids.clone(),
                        alloc_resp: info.alloc_resp.encode_to_vec(),
                    });
                }
            }
        }
        out
    }

    /// Restores entries read from the checkpoint; an entry whose response
    /// does not decode is skipped, as upstream does.
    pub fn from_checkpoint(&mut self, entries: Vec<PodDevicesEntry>) {
        for e in entries {
            match ContainerAllocateResponse::decode(e.alloc_resp.as_slice()) {
                Ok(resp) => self.insert(
                    &e.pod_uid,
                    &e.container_name,
                    &e.resource_name,
                    e.device_ids,
                    resp,
                ),
                Err(error) => tracing::error!(
                    %error,
                    pod.uid = %e.pod_uid,
                    container = %e.container_name,
                    resource = %e.resource_name,
                    "Can't unmarshal allocResp"
                ),
            }
        }
    }

    /// The container's devices per resource, with their NUMA nodes (upstream
    /// `getContainerDevices`, read by the pod-resources API).
    pub fn container_device_instances(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> ResourceDeviceInstances {
        let mut out = ResourceDeviceInstances::new();
        let Some(resources) = self.devs.get(pod_uid).and_then(|c| c.get(container)) else {
            return out;
        };
        for (resource, info) in resources {
            if info.device_ids.values().all(Vec::is_empty) {
                continue;
            }
            let devices: &mut BTreeMap<String, Device> = out.entry(resource.clone()).or_default();
            for (numa, ids) in &info.device_ids {
                for id in ids {
                    let dev = devices.entry(id.clone()).or_insert_with(|| Device {
                        id: id.clone(),
                        ..Device::default()
                    });
                    if *numa != NODE_WITHOUT_TOPOLOGY {
                        dev.topology
                            .get_or_insert_with(TopologyInfo::default)
                            .nodes
                            .push(NumaNode { id: *numa });
                    }
                }
            }
        }
        out
    }

    /// The merged runtime options of the container, `None` when it holds no devices.
    pub fn run_container_options(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Option<DeviceRunContainerOptions> {
        let resources = self.devs.get(pod_uid)?.get(container)?;
        let mut opts = DeviceRunContainerOptions::default();
        let mut envs: HashMap<&str, &str> = HashMap::new();
        let mut devs: HashMap<&str, &str> = HashMap::new();
        let mut mounts: HashMap<&str, &str> = HashMap::new();
        let mut annotations: HashMap<&str, &str> = HashMap::new();
        let mut cdi: BTreeSet<&str> = BTreeSet::new();
        for (resource, info) in resources {
            let resp = &info.alloc_resp;
            for (k, v) in &resp.envs {
                if let Some(prev) = envs.get(k.as_str()) {
                    if prev != v {
                        tracing::error!(%resource, env = %k, expected = %v, got = %prev, "Environment variable has conflicting setting");
                    }
                    continue;
                }
                envs.insert(k, v);
                opts.envs.push((k.clone(), v.clone()));
            }
            for d in &resp.devices {
                if let Some(prev) = devs.get(d.container_path.as_str()) {
                    if *prev != d.host_path {
                        tracing::error!(%resource, container_path = %d.container_path, got = %prev, expected = %d.host_path, "Container device has conflicting mapping host devices");
                    }
                    continue;
                }
                devs.insert(&d.container_path, &d.host_path);
                opts.devices.push(d.clone());
            }
            for m in &resp.mounts {
                if let Some(prev) = mounts.get(m.container_path.as_str()) {
                    if *prev != m.host_path {
                        tracing::error!(%resource, container_path = %m.container_path, conflicting_path = %prev, host_path = %m.host_path, "Container mount has conflicting mapping host mounts");
                    }
                    continue;
                }
                mounts.insert(&m.container_path, &m.host_path);
                opts.mounts.push(m.clone());
            }
            for (k, v) in &resp.annotations {
                if let Some(prev) = annotations.get(k.as_str()) {
                    if prev != v {
                        tracing::error!(%resource, annotation = %k, expected = %prev, got = %v, "Annotation has conflicting setting");
                    }
                    continue;
                }
                annotations.insert(k, v);
                opts.annotations.push((k.clone(), v.clone()));
            }
            for c in &resp.cdi_devices {
                if cdi.insert(&c.name) {
                    opts.cdi_devices.push(c.clone());
                }
            }
        }
        Some(opts)
    }
}
