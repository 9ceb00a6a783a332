//! The device manager (upstream `devicemanager/manager.go`): registered
//! plugins and their devices, node capacity, the checkpoint, and freeing the
//! devices of pods that are gone. Allocation lives in `allocate.rs`, the
//! registration socket in `registration.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{self, CHECKPOINT_NAME, Checkpoint, CheckpointData};
use crate::endpoint::PluginClient;
use crate::error::Result;
use crate::pod_devices::{PodDevices, ResourceDeviceInstances};
use crate::seams::{ActivePods, Clock, NoActivePods, SystemClock};
use crate::v1beta1::{self, Device, DevicePluginOptions, ListAndWatchResponse};

/// How the device manager is set up.
#[derive(Debug, Clone)]
pub struct DeviceManagerConfig {
    /// `<root-dir>/device-plugins`: the registration socket, plugin sockets and the checkpoint.
    pub socket_dir: PathBuf,
    /// Deadline of dialing a plugin and of each unary call to it
    /// (upstream dials with 10 s; PreStartContainer has 30 s).
    pub plugin_timeout: Duration,
    /// How long the resources of a plugin that went away stay in the node
    /// status (as unhealthy) before they are removed (upstream
    /// `endpointStopGracePeriod`, 5 minutes).
    pub stop_grace_period: Duration,
}

impl DeviceManagerConfig {
    /// Upstream's settings for a kubelet whose `--root-dir` is `root_dir`.
    pub fn new(root_dir: &Path) -> Self {
        Self {
            socket_dir: root_dir.join(v1beta1::DEVICE_PLUGINS_DIR),
            plugin_timeout: Duration::from_secs(30),
            stop_grace_period: Duration::from_secs(5 * 60),
        }
    }
}

/// Extended resources for the node status (upstream `GetCapacity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Devices per resource, healthy or not.
    pub capacity: BTreeMap<String, i64>,
    /// Healthy devices per resource.
    pub allocatable: BTreeMap<String, i64>,
    /// Resources whose plugin is gone for good: the node status must set them to 0.
    pub deleted: Vec<String>,
}

pub(crate) struct EndpointInfo {
    pub(crate) id: u64,
    pub(crate) client: Option<PluginClient>,
    pub(crate) opts: Option<DevicePluginOptions>,
    pub(crate) stopped_at: Option<Instant>,
    pub(crate) task: Option<AbortHandle>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) endpoints: HashMap<String, EndpointInfo>,
    pub(crate) all_devices: HashMap<String, BTreeMap<String, Device>>,
    pub(crate) healthy: HashMap<String, BTreeSet<String>>,
    pub(crate) unhealthy: HashMap<String, BTreeSet<String>>,
    pub(crate) allocated: HashMap<String, BTreeSet<String>>,
    pub(crate) pod_devices: PodDevices,
    pub(crate) devices_to_reuse: HashMap<String, HashMap<String, BTreeSet<String>>>,
    /// The UID of the pod last being admitted (upstream
    /// `pendingAdmissionPod`): the kubelet adds a pod to its pod manager only
    /// after admission, so until then this pod counts as active. Replaced by
    /// the next admission, never cleared, as upstream.
    pub(crate) pending_admission: Option<String>,
    next_id: u64,
}

impl State {
    fn mark_resource_unhealthy(&mut self, resource: &str) {
        let healthy = self
            .healthy
            .insert(resource.to_string(), BTreeSet::new())
            .unwrap_or_default();
        self.unhealthy
            .entry(resource.to_string())
            .or_default()
            .extend(healthy);
    }
}

pub(crate) struct Inner {
    pub(crate) config: DeviceManagerConfig,
    pub(crate) state: Mutex<State>,
    pub(crate) active_pods: RwLock<Arc<dyn ActivePods>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) running_at_start: RwLock<HashSet<(String, String)>>,
    checkpoint_lock: tokio::sync::Mutex<()>,
    pub(crate) alloc_lock: tokio::sync::Mutex<()>,
    pub(crate) shutdown: CancellationToken,
}

/// The device manager. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct DeviceManager {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("socket_dir", &self.inner.config.socket_dir)
            .finish_non_exhaustive()
    }
}

impl DeviceManager {
    /// A manager that has not started yet (no pods known, system clock).
    pub fn new(config: DeviceManagerConfig) -> Self {
        Self::with_clock(config, Arc::new(SystemClock))
    }

    /// A manager measuring the stop grace period with `clock`.
    pub fn with_clock(config: DeviceManagerConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(State::default()),
                active_pods: RwLock::new(Arc::new(NoActivePods)),
                clock,
                running_at_start: RwLock::new(HashSet::new()),
                checkpoint_lock: tokio::sync::Mutex::new(()),
                alloc_lock: tokio::sync::Mutex::new(()),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    /// The device-plugins directory.
    pub fn socket_dir(&self) -> &Path {
        &self.inner.config.socket_dir
    }

    /// The registration socket, `<socket_dir>/kubelet.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.inner.config.socket_dir.join(v1beta1::KUBELET_SOCKET)
    }

    pub(crate) fn checkpoint_path(&self) -> PathBuf {
        self.inner.config.socket_dir.join(CHECKPOINT_NAME)
    }

    /// Starts the manager (upstream `Start`): takes the active-pods source and
    /// the (pod UID, container name) pairs the runtime reported running at
    /// kubelet start (a restarted kubelet leaves their devices alone), restores allocations from the checkpoint (a failure is logged and
    /// startup continues, as upstream), removes stale sockets and serves
    /// the registration socket until [`DeviceManager::stop`].
    ///
    /// # Errors
    /// When the directory cannot be created or the socket cannot be bound.
    pub async fn start(
        &self,
        active_pods: Arc<dyn ActivePods>,
        running_containers: HashSet<(String, String)>,
    ) -> Result<()> {
        *self.inner.active_pods.write() = active_pods;
        *self.inner.running_at_start.write() = running_containers;
        if let Err(error) = self.read_checkpoint().await {
            tracing::error!(%error, "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date");
        }
        crate::registration::start(self.clone()).await
    }

    /// Stops the registration server and every plugin stream.
    pub fn stop(&self) {
        self.inner.shutdown.cancel();
        let mut st = self.inner.state.lock();
        for ep in st.endpoints.values_mut() {
            if let Some(t) = ep.task.take() {
                t.abort();
            }
            ep.client = None;
        }
    }

    /// Connects to a plugin that registered `resource` at `socket` (upstream
    /// `connectClient` + `PluginConnected`): dial, `GetDevicePluginOptions`,
    /// then a `ListAndWatch` task. A newer registration of the same resource
    /// replaces the older one.
    pub(crate) async fn connect_plugin(&self, resource: &str, socket: &Path) -> Result<()> {
        let timeout = self.inner.config.plugin_timeout;
        let client = PluginClient::connect(resource, socket, timeout).await?;
        let opts = client.options().await?;
        let id = {
            let mut st = self.inner.state.lock();
            st.next_id += 1;
            let id = st.next_id;
            let old = st.endpoints.insert(
                resource.to_string(),
                EndpointInfo {
                    id,
                    client: Some(client.clone()),
                    opts: Some(opts),
                    stopped_at: None,
                    task: None,
                },
            );
            if let Some(t) = old.and_then(|o| o.task) {
                t.abort();
            }
            id
        };
        tracing::info!(resource, socket = %socket.display(), pre_start_required = opts.pre_start_required,
            get_preferred_allocation_available = opts.get_preferred_allocation_available, "Device plugin connected");
        let me = self.clone();
        let res = resource.to_string();
        let task = tokio::spawn(async move { me.run_list_and_watch(res, id, client).await });
        if let Some(ep) = self.inner.state.lock().endpoints.get_mut(resource)
            && ep.id == id
        {
            ep.task = Some(task.abort_handle());
        }
        Ok(())
    }

    async fn run_list_and_watch(self, resource: String, id: u64, client: PluginClient) {
        let reason = match client.list_and_watch().await {
            Err(e) => e,
            Ok(mut stream) => loop {
                tokio::select! {
                    () = self.inner.shutdown.cancelled() => return,
                    msg = stream.message() => match msg {
                        Ok(Some(resp)) => self.on_list_and_watch(&resource, id, resp).await,
                        Ok(None) => break "stream closed by the plugin".to_string(),
                        Err(status) => break format!("rpc error: code = {:?} desc = {}", status.code(), status.message()),
                    },
                }
            },
        };
        tracing::error!(%resource, socket = %client.socket().display(), error = %reason, "ListAndWatch ended unexpectedly for device plugin");
        self.disconnect(&resource, Some(id));
    }

    /// The plugin's endpoint is gone (stream ended or deregistered): all its
    /// devices become unhealthy and the stop grace period starts (upstream
    /// `PluginDisconnected`). `id` limits this to one endpoint generation.
    pub(crate) fn disconnect(&self, resource: &str, id: Option<u64>) {
        let now = self.inner.clock.now();
        let mut st = self.inner.state.lock();
        let Some(ep) = st.endpoints.get_mut(resource) else {
            return;
        };
        if id.is_some_and(|id| id != ep.id) || ep.stopped_at.is_some() {
            return;
        }
        ep.stopped_at = Some(now);
        ep.client = None;
        if let Some(t) = ep.task.take() {
            t.abort();
        }
        st.mark_resource_unhealthy(resource);
        tracing::info!(%resource, "Endpoint became unhealthy");
    }

    /// The id of the current endpoint of `resource` whose plugin serves `socket`.
    pub(crate) fn endpoint_for_socket(&self, resource: &str, socket: &Path) -> Option<u64> {
        let st = self.inner.state.lock();
        let ep = st.endpoints.get(resource)?;
        ep.client
            .as_ref()
            .filter(|c| c.socket() == socket)
            .map(|_| ep.id)
    }

    async fn on_list_and_watch(&self, resource: &str, id: u64, resp: ListAndWatchResponse) {
        let (total, healthy_count) = {
            let mut st = self.inner.state.lock();
            if st.endpoints.get(resource).is_none_or(|e| e.id != id) {
                return;
            }
            let mut healthy = BTreeSet::new();
            let mut unhealthy = BTreeSet::new();
            let mut all = BTreeMap::new();
            for d in resp.devices {
                if d.health == v1beta1::HEALTHY {
                    healthy.insert(d.id.clone());
                } else {
                    unhealthy.insert(d.id.clone());
                }
                all.insert(d.id.clone(), d);
            }
            let counts = (all.len(), healthy.len());
            st.healthy.insert(resource.to_string(), healthy);
            st.unhealthy.insert(resource.to_string(), unhealthy);
            st.all_devices.insert(resource.to_string(), all);
            counts
        };
        if let Err(error) = self.write_checkpoint().await {
            tracing::error!(%error, "Writing checkpoint encountered");
        }
        tracing::info!(%resource, total, healthy = healthy_count, "Processed device updates for resource");
    }

    /// Extended resources for the node status (upstream `GetCapacity`).
    /// Resources whose plugin has been gone longer than the grace period are
    /// dropped here and listed in [`Capacity::deleted`].
    pub async fn get_capacity(&self) -> Capacity {
        let now = self.inner.clock.now();
        let grace = self.inner.config.stop_grace_period;
        let mut cap = Capacity::default();
        let mut deleted = BTreeSet::new();
        {
            let mut st = self.inner.state.lock();
            let expired = |st: &State, r: &str| match st.endpoints.get(r) {
                None => true,
                Some(ep) => ep
                    .stopped_at
                    .is_some_and(|t| now.saturating_duration_since(t) > grace),
            };
            let names: BTreeSet<String> = st
                .healthy
                .keys()
                .chain(st.unhealthy.keys())
                .cloned()
                .collect();
            for r in names {
                if expired(&st, &r) {
                    st.endpoints.remove(&r);
                    st.healthy.remove(&r);
                    st.unhealthy.remove(&r);
                    st.all_devices.remove(&r);
                    deleted.insert(r);
                    continue;
                }
                let healthy = st.healthy.get(&r).map_or(0, BTreeSet::len) as i64;
                let unhealthy = st.unhealthy.get(&r).map_or(0, BTreeSet::len) as i64;
                cap.capacity.insert(r.clone(), healthy + unhealthy);
                cap.allocatable.insert(r, healthy);
            }
        }
        if !deleted.is_empty() {
            tracing::info!(resources = ?deleted, "Removed device plugin resources after the endpoint stop grace period");
            if let Err(error) = self.write_checkpoint().await {
                tracing::error!(%error, "Failed to write checkpoint file");
            }
        }
        cap.deleted = deleted.into_iter().collect();
        cap
    }

    /// Writes the checkpoint (upstream `writeCheckpoint`).
    pub(crate) async fn write_checkpoint(&self) -> Result<()> {
        let _serial = self.inner.checkpoint_lock.lock().await;
        let data = {
            let st = self.inner.state.lock();
            let entries = st.pod_devices.to_checkpoint();
            CheckpointData {
                pod_device_entries: (!entries.is_empty()).then_some(entries),
                registered_devices: Some(
                    st.healthy
                        .iter()
                        .map(|(r, ids)| (r.clone(), ids.iter().cloned().collect()))
                        .collect(),
                ),
            }
        };
        checkpoint::write(self.checkpoint_path(), &Checkpoint::new(data)).await
    }

    /// Restores allocations from the checkpoint (upstream `readCheckpoint`):
    /// registered resources come back with no devices and a stopped endpoint,
    /// so their capacity stays 0 until the plugin registers again.
    pub(crate) async fn read_checkpoint(&self) -> Result<()> {
        let Some(cp) = checkpoint::read(&self.checkpoint_path()).await? else {
            tracing::info!(path = %self.checkpoint_path().display(), "No device manager checkpoint");
            return Ok(());
        };
        let now = self.inner.clock.now();
        let mut st = self.inner.state.lock();
        st.pod_devices
            .from_checkpoint(cp.data.pod_device_entries.unwrap_or_default());
        st.allocated = st.pod_devices.devices();
        for r in cp.data.registered_devices.unwrap_or_default().into_keys() {
            st.healthy.insert(r.clone(), BTreeSet::new());
            st.unhealthy.insert(r.clone(), BTreeSet::new());
            st.next_id += 1;
            let id = st.next_id;
            st.endpoints.insert(
                r,
                EndpointInfo {
                    id,
                    client: None,
                    opts: None,
                    stopped_at: Some(now),
                    task: None,
                },
            );
        }
        tracing::info!(
            pods = st.pod_devices.pods().len(),
            resources = st.endpoints.len(),
            "Read device manager checkpoint"
        );
        Ok(())
    }

    /// Frees the devices of pods that are no longer active (upstream
    /// `UpdateAllocatedDevices`); does nothing until the pod sources are ready.
    /// The pod under admission counts as active.
    pub fn update_allocated_devices(&self) {
        let pods = self.inner.active_pods.read().clone();
        if !pods.sources_ready() {
            return;
        }
        let mut active = pods.active_pod_uids();
        let mut st = self.inner.state.lock();
        if let Some(pending) = &st.pending_admission {
            active.insert(pending.clone());
        }
        let gone: Vec<String> = st
            .pod_devices
            .pods()
            .into_iter()
            .filter(|p| !active.contains(p))
            .collect();
        if gone.is_empty() {
            return;
        }
        tracing::info!(pods = ?gone, "Freeing devices of pods that are no longer active");
        st.pod_devices.delete(&gone);
        st.allocated = st.pod_devices.devices();
    }

    /// The devices the pod's container holds, per resource (upstream `GetDevices`,
    /// for the pod-resources API).
    pub fn get_devices(&self, pod_uid: &str, container: &str) -> ResourceDeviceInstances {
        self.inner
            .state
            .lock()
            .pod_devices
            .container_device_instances(pod_uid, container)
    }

    /// The devices each container of the pod holds, per resource.
    pub fn pod_devices(&self, pod_uid: &str) -> BTreeMap<String, ResourceDeviceInstances> {
        let st = self.inner.state.lock();
        st.pod_devices
            .containers(pod_uid)
            .into_iter()
            .map(|c| {
                let devs = st.pod_devices.container_device_instances(pod_uid, &c);
                (c, devs)
            })
            .collect()
    }

    /// The healthy devices of every resource (upstream `GetAllocatableDevices`).
    pub fn get_allocatable_devices(&self) -> ResourceDeviceInstances {
        let st = self.inner.state.lock();
        let mut out = ResourceDeviceInstances::new();
        for (r, ids) in &st.healthy {
            let Some(all) = st.all_devices.get(r) else {
                continue;
            };
            let devs = out.entry(r.clone()).or_default();
            for id in ids {
                if let Some(d) = all.get(id) {
                    devs.insert(id.clone(), d.clone());
                }
            }
        }
        out
    }

    /// Devices allocated per resource, for admission (upstream
    /// `sanitizeNodeAllocatable`): the node's allocatable for each resource
    /// must be raised to at least this count so pods already holding devices
    /// pass the resource predicate even while their plugin is away.
    pub fn allocated_device_counts(&self) -> BTreeMap<String, i64> {
        let st = self.inner.state.lock();
        st.allocated
            .iter()
            .map(|(r, ids)| (r.clone(), ids.len() as i64))
            .collect()
    }

    /// Whether the pod holds devices (upstream `podDevices.hasPod`).
    pub fn has_pod(&self, pod_uid: &str) -> bool {
        self.inner.state.lock().pod_devices.has_pod(pod_uid)
    }

    /// Whether extended resources in the node status should be zeroed: no
    /// checkpoint means the node was recreated (upstream
    /// `ShouldResetExtendedResourceCapacity`).
    pub async fn should_reset_extended_resource_capacity(&self) -> bool {
        !tokio::fs::try_exists(self.checkpoint_path())
            .await
            .unwrap_or(true)
    }
}
