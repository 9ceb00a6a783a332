//! Device allocation at pod admission and the container's runtime options
//! (upstream `Allocate`, `allocateContainerResources`, `devicesToAllocate`,
//! `GetDeviceRunContainerOptions`, `callPreStartContainerIfNeeded`,
//! `callGetPreferredAllocationIfAvailable`).

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::quantity::Quantity;

use crate::error::{AdmitRejection, DeviceManagerError, Result};
use crate::manager::DeviceManager;
use crate::pod_devices::{DeviceRunContainerOptions, DevicesPerNuma, NODE_WITHOUT_TOPOLOGY};

fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The container's limits as whole device counts (extended resources are
/// never overcommitted, so limits equal requests).
fn limits(container: &Container) -> Vec<(String, i64)> {
    let Some(limits) = container.resources.as_ref().and_then(|r| r.limits.as_ref()) else {
        return Vec::new();
    };
    limits
        .iter()
        .filter_map(|(name, q)| match Quantity::from_api(q) {
            Ok(q) => Some((name.clone(), q.value())),
            Err(error) => {
                tracing::warn!(resource = %name, %error, "Ignoring unparsable limit");
                None
            }
        })
        .collect()
}

impl DeviceManager {
    fn is_device_plugin_resource(&self, resource: &str) -> bool {
        let st = self.inner.state.lock();
        st.healthy.contains_key(resource) || st.allocated.contains_key(resource)
    }

    fn restore_allocated(&self) {
        let mut st = self.inner.state.lock();
        st.allocated = st.pod_devices.devices();
    }

    /// Whether any container of the pod asks for a resource a device plugin
    /// registered (now or before a restart): only such pods need
    /// [`DeviceManager::admit_pod`] to call plugins.
    pub fn requests_devices(&self, pod: &Pod) -> bool {
        let Some(spec) = pod.spec.as_ref() else {
            return false;
        };
        spec.init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .flat_map(limits)
            .any(|(r, n)| n > 0 && self.is_device_plugin_resource(&r))
    }

    /// Admits the pod as upstream's resource allocator admit handler does:
    /// allocates for each init container, then each app container; the
    /// first failure rejects the pod ("Allocate failed due to <error>, which
    /// is unexpected", reason `UnexpectedAdmissionError`).
    ///
    /// # Errors
    /// The rejection to report in the pod's status and event.
    pub async fn admit_pod(&self, pod: &Pod) -> std::result::Result<(), AdmitRejection> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let init = spec.init_containers.iter().flatten();
        for c in init.chain(spec.containers.iter()) {
            if let Err(e) = self.allocate(pod, c).await {
                let rejection = AdmitRejection::from(&e);
                tracing::info!(pod.uid = %pod_uid(pod), container = %c.name, message = %rejection.message, "Failed to admit pod");
                return Err(rejection);
            }
        }
        Ok(())
    }

    /// Allocates devices for one container of an admitted pod (upstream
    /// `Allocate`). The kubelet calls it for each init container, in order,
    /// then for each app container. Devices of a finished (non-restartable)
    /// init container are reused by the containers after it.
    ///
    /// # Errors
    /// Upstream's messages (e.g. "requested number of devices unavailable for
    /// ..."); the kubelet rejects the pod with `UnexpectedAdmissionError` and
    /// the message "Allocate failed due to <error>, which is unexpected".
    pub async fn allocate(&self, pod: &Pod, container: &Container) -> Result<()> {
        let _serial = self.inner.alloc_lock.lock().await;
        let uid = pod_uid(pod).to_string();
        let mut reuse = {
            let mut st = self.inner.state.lock();
            // Not yet in the kubelet's pod manager: keep its devices while
            // other pods' are freed (upstream `setPodPendingAdmission`).
            st.pending_admission = Some(uid.clone());
            st.devices_to_reuse.retain(|k, _| *k == uid);
            st.devices_to_reuse.remove(&uid).unwrap_or_default()
        };
        let result = self
            .allocate_with_reuse(pod, container, &uid, &mut reuse)
            .await;
        self.inner.state.lock().devices_to_reuse.insert(uid, reuse);
        result
    }

    async fn allocate_with_reuse(
        &self,
        pod: &Pod,
        container: &Container,
        uid: &str,
        reuse: &mut HashMap<String, BTreeSet<String>>,
    ) -> Result<()> {
        let init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .and_then(|ics| ics.iter().find(|c| c.name == container.name));
        self.allocate_container_resources(uid, container, reuse)
            .await?;
        let st = self.inner.state.lock();
        match init {
            Some(ic) if !kubelet_types::pod::is_restartable_init_container(ic) => {
                st.pod_devices
                    .add_container_allocated_resources(uid, &container.name, reuse);
            }
            _ => st
                .pod_devices
                .remove_container_allocated_resources(uid, &container.name, reuse),
        }
        Ok(())
    }

    async fn allocate_container_resources(
        &self,
        uid: &str,
        container: &Container,
        reuse: &HashMap<String, BTreeSet<String>>,
    ) -> Result<()> {
        let mut updated = false;
        let mut changed = false;
        for (resource, needed) in limits(container) {
            if !self.is_device_plugin_resource(&resource) {
                continue;
            }
            if !updated {
                self.update_allocated_devices();
                updated = true;
            }
            let devs = match self
                .devices_to_allocate(
                    uid,
                    &container.name,
                    &resource,
                    needed,
                    reuse.get(&resource),
                )
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    self.restore_allocated();
                    return Err(e);
                }
            };
            if devs.is_empty() {
                continue;
            }
            changed = true;
            let client = {
                let st = self.inner.state.lock();
                st.endpoints.get(&resource).map(|ep| ep.client.clone())
            };
            let client = match client {
                None => {
                    self.restore_allocated();
                    return Err(DeviceManagerError::UnknownPlugin(resource));
                }
                Some(None) => {
                    self.restore_allocated();
                    return Err(DeviceManagerError::EndpointStopped(resource));
                }
                Some(Some(c)) => c,
            };
            let ids: Vec<String> = devs.iter().cloned().collect();
            tracing::info!(pod.uid = %uid, container = %container.name, %resource, devices = ?ids, "Making allocation request for device plugin");
            let resp = match client.allocate(ids).await {
                Ok(r) => r,
                Err(e) => {
                    self.restore_allocated();
                    return Err(e);
                }
            };
            let Some(first) = resp.container_responses.first().cloned() else {
                self.restore_allocated();
                return Err(DeviceManagerError::EmptyAllocateResponse(format!(
                    "{resp:?}"
                )));
            };
            let mut st = self.inner.state.lock();
            let mut per_numa = DevicesPerNuma::new();
            for dev in &devs {
                let nodes = st
                    .all_devices
                    .get(&resource)
                    .and_then(|all| all.get(dev))
                    .and_then(|d| d.topology.as_ref())
                    .map(|t| t.nodes.iter().map(|n| n.id).collect::<Vec<_>>())
                    .unwrap_or_default();
                if nodes.is_empty() {
                    per_numa
                        .entry(NODE_WITHOUT_TOPOLOGY)
                        .or_default()
                        .push(dev.clone());
                }
                for n in nodes {
                    per_numa.entry(n).or_default().push(dev.clone());
                }
            }
            st.pod_devices
                .insert(uid, &container.name, &resource, per_numa, first);
        }
        if changed {
            self.write_checkpoint().await?;
        }
        Ok(())
    }

    /// The devices to hand to the container for `resource`: empty when it
    /// already holds them (upstream `devicesToAllocate`). Chosen devices are
    /// reserved at once so no other container gets them.
    async fn devices_to_allocate(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        required: i64,
        reusable: Option<&BTreeSet<String>>,
    ) -> Result<BTreeSet<String>> {
        let sources_ready = self.inner.active_pods.read().sources_ready();
        let mut needed = required;
        let mut allocated = BTreeSet::new();
        let (available, client) = {
            let mut st = self.inner.state.lock();
            let existing = st.pod_devices.container_devices(uid, container, resource);
            if let Some(have) = &existing {
                needed -= have.len() as i64;
                if needed != 0 {
                    return Err(DeviceManagerError::ChangedRequest {
                        pod_uid: uid.to_string(),
                        container: container.to_string(),
                        resource: resource.to_string(),
                        had: have.len(),
                        wants: required,
                    });
                }
            }
            // A kubelet restart: a container that was running keeps its devices.
            if !sources_ready && self.running_at_start(uid, container) {
                tracing::info!(pod.uid = %uid, container, resource, "Container detected running, nothing to do");
                return Ok(BTreeSet::new());
            }
            let Some(healthy) = st.healthy.get(resource).cloned() else {
                return Err(DeviceManagerError::Unregistered(resource.to_string()));
            };
            if healthy.is_empty() {
                return Err(DeviceManagerError::NoHealthyDevices(resource.to_string()));
            }
            if existing.is_some_and(|have| !have.is_subset(&healthy)) {
                return Err(DeviceManagerError::PreviouslyAllocatedUnhealthy(
                    resource.to_string(),
                ));
            }
            if needed <= 0 {
                return Ok(BTreeSet::new());
            }
            let in_use = st.allocated.entry(resource.to_string()).or_default();
            for d in reusable.into_iter().flatten() {
                if needed == 0 {
                    break;
                }
                if allocated.insert(d.clone()) {
                    in_use.insert(d.clone());
                    needed -= 1;
                }
            }
            if needed == 0 {
                return Ok(allocated);
            }
            let available: BTreeSet<String> = healthy.difference(in_use).cloned().collect();
            if (available.len() as i64) < needed {
                return Err(DeviceManagerError::Unavailable {
                    resource: resource.to_string(),
                    requested: needed as usize,
                    available: available.len(),
                });
            }
            let ep = st.endpoints.get(resource);
            let client = ep
                .filter(|ep| {
                    ep.opts
                        .is_some_and(|o| o.get_preferred_allocation_available)
                })
                .and_then(|ep| ep.client.clone());
            (available, client)
        };
        let mut preferred = BTreeSet::new();
        if let Some(client) = client {
            let candidates: Vec<String> = available.union(&allocated).cloned().collect();
            let must: Vec<String> = allocated.iter().cloned().collect();
            let resp = client
                .preferred_allocation(
                    candidates,
                    must,
                    i32::try_from(required).unwrap_or(i32::MAX),
                )
                .await?;
            if let Some(first) = resp.container_responses.into_iter().next() {
                preferred = first.device_i_ds.into_iter().collect();
            }
            tracing::info!(pod.uid = %uid, container, resource, preferred = ?preferred, "Device plugin preferred allocation");
        }
        let mut st = self.inner.state.lock();
        // Devices may have turned unhealthy during the plugin call.
        let healthy = st.healthy.get(resource).cloned().unwrap_or_default();
        let available: BTreeSet<String> = available.intersection(&healthy).cloned().collect();
        let in_use = st.allocated.entry(resource.to_string()).or_default();
        let order = preferred
            .intersection(&available)
            .chain(available.iter())
            .cloned()
            .collect::<Vec<_>>();
        for d in order {
            if needed == 0 {
                break;
            }
            if !in_use.contains(&d) && allocated.insert(d.clone()) {
                in_use.insert(d);
                needed -= 1;
            }
        }
        if needed > 0 {
            return Err(DeviceManagerError::AllocatedLess {
                requested: required,
                got: required - needed,
            });
        }
        Ok(allocated)
    }

    fn running_at_start(&self, uid: &str, container: &str) -> bool {
        self.inner
            .running_at_start
            .read()
            .contains(&(uid.to_string(), container.to_string()))
    }

    /// What the runtime must add to the container for its devices (upstream
    /// `GetDeviceRunContainerOptions`); calls `PreStartContainer` for plugins
    /// that asked for it, and allocates again when the container should hold
    /// devices but none are cached (a node restart race). `None` when the
    /// container holds no devices.
    ///
    /// # Errors
    /// The PreStartContainer or re-allocation failure, with upstream's message.
    pub async fn get_device_run_container_options(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Option<DeviceRunContainerOptions>> {
        let uid = pod_uid(pod);
        let mut realloc = false;
        for (resource, n) in limits(container) {
            if n == 0 || !self.is_device_plugin_resource(&resource) {
                continue;
            }
            self.call_pre_start_container_if_needed(uid, &container.name, &resource)
                .await?;
            if !self
                .inner
                .active_pods
                .read()
                .active_pod_uids()
                .contains(uid)
            {
                continue;
            }
            let cached = self.inner.state.lock().pod_devices.container_devices(
                uid,
                &container.name,
                &resource,
            );
            if cached.is_none() {
                realloc = true;
            }
        }
        if realloc {
            tracing::info!(pod.uid = %uid, container = %container.name, "Needs to re-allocate device plugin resources for pod");
            self.allocate(pod, container).await?;
        }
        Ok(self
            .inner
            .state
            .lock()
            .pod_devices
            .run_container_options(uid, &container.name))
    }

    async fn call_pre_start_container_if_needed(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
    ) -> Result<()> {
        let (client, devs) = {
            let st = self.inner.state.lock();
            let Some(ep) = st.endpoints.get(resource) else {
                return Err(DeviceManagerError::EndpointNotFound(resource.to_string()));
            };
            if !ep.opts.is_some_and(|o| o.pre_start_required) {
                return Ok(());
            }
            let Some(devs) = st.pod_devices.container_devices(uid, container, resource) else {
                return Err(DeviceManagerError::NoDevicesInCache {
                    pod_uid: uid.to_string(),
                    container: container.to_string(),
                    resource: resource.to_string(),
                });
            };
            let Some(client) = ep.client.clone() else {
                return Err(DeviceManagerError::EndpointStopped(resource.to_string()));
            };
            (client, devs)
        };
        tracing::info!(pod.uid = %uid, container, resource, "Issuing a PreStartContainer call for container");
        client.pre_start_container(devs.into_iter().collect()).await
    }
}
