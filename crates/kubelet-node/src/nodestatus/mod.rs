//! Node registration and status (upstream `kubelet_node_status.go`):
//! [`register`] creates the Node or reconciles an existing one; every
//! `nodeStatusUpdateFrequency` the status loop reads the Node, computes the
//! status over the conditions the apiserver holds, and patches `nodes/status`
//! (strategic merge) when the result differs from the server's in anything
//! but heartbeat times ([`compare`]), or when `nodeStatusReportFrequency`
//! passed since the last report (upstream `tryUpdateNodeStatus`). Comparing
//! with the server, not with what was last sent, is what brings a node back
//! to Ready after the node lifecycle controller set it Unknown during an
//! apiserver outage. Condition changes become node events (NodeReady,
//! NodeNotReady, ...).
//!
//! As upstream (whose `lastStatusReportTime` starts at zero), the first status
//! is reported as soon as the node is registered: a Node that already existed,
//! as after a restart, still carries the old process's heartbeats. A Node
//! created just now carries this process's status, which counts as the first
//! report. Each interval reads the runtime once ([`runtime_facts`], under its
//! own short deadline) and has up to five tries (upstream
//! `nodeStatusUpdateRetry`); as upstream, only each try's GET and PATCH are
//! bounded by the heartbeat client timeout, the smaller of
//! `nodeStatusUpdateFrequency` and the lease duration, so a hung runtime
//! cannot keep the status (NotReady) from being posted. A failed try after
//! the first closes every connection of the kubelet's client (upstream
//! `onRepeatedHeartbeatFailure`, `closeAllConns`): a request waiting on a
//! connection whose peer vanished fails at once, and the next try dials a
//! fresh one.

pub mod compare;
pub mod extended;
pub mod machine;
pub mod register;
pub mod runtime_facts;
pub mod setters;
pub mod volumes;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cri::{ImageService, RuntimeService};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, GetParams, Patch, PatchParams};
use kubelet_types::events::{EventType, Recorder, node_ref};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::RuntimeState;
use kubelet_client::clock::Clock;
use kubelet_config::{ClusterConfig, Taint};
use machine::MachineInfo;
use runtime_facts::{LastKnown, RuntimeFacts};

/// Everything node status is made from.
pub struct NodeStatusManager {
    /// Client.
    pub client: Client,
    /// Node name.
    pub node_name: String,
    /// Cluster settings.
    pub cfg: ClusterConfig,
    /// `maxPods`.
    pub max_pods: u32,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    /// `--provider-id`.
    pub provider_id: Option<String>,
    /// Node addresses.
    pub node_ips: Vec<IpAddr>,
    /// `--node-ip` as given (for the cloud-controller-manager's annotation).
    pub provided_node_ips: Vec<IpAddr>,
    /// Host facts.
    pub machine: MachineInfo,
    /// Runtime (version).
    pub runtime: Arc<dyn RuntimeService>,
    /// Images (for `status.images`).
    pub images: Arc<dyn ImageService>,
    /// The runtime's health (runtime, network, PLEG), as the agent last saw it.
    pub runtime_state: Arc<dyn RuntimeState>,
    /// Resource pressure, as the eviction manager last computed it.
    pub pressure: Arc<dyn crate::NodePressure>,
    /// Device plugins' extended resources.
    pub extended: Arc<dyn crate::ExtendedResources>,
    /// The attachable volumes in use (`status.volumesInUse`).
    pub volumes: Arc<dyn crate::VolumesInUse>,
    /// Wall clock for heartbeats.
    pub clock: Arc<dyn Clock>,
    /// Events.
    pub recorder: Arc<dyn Recorder>,
    /// Set to the Node's UID once registered.
    pub registered: watch::Sender<Option<String>>,
    /// The Node as the apiserver last returned it (registration, each
    /// status patch): labels and taints others set, for pod admission.
    pub latest: watch::Sender<Option<Node>>,
    /// The client's connections, all closed on repeated failures (upstream
    /// `OnHeartbeatFailure`).
    pub connections: Option<Arc<kubelet_client::Connections>>,
    /// The apiserver's version, for the kubelet version the Node reports
    /// (`cfg.reported_version`).
    pub discovery: Option<kubelet_client::discovery::Discovery>,
    /// What the Node reported so far: the version never rises while the
    /// process runs (`LowestReported`).
    pub reported: kubelet_types::version::LowestReported,
}

/// How long registration waits for the apiserver's version.
const SERVER_VERSION_WAIT: Duration = Duration::from_secs(10);

/// Upstream `nodeStatusUpdateRetry`: tries per status interval.
pub const NODE_STATUS_UPDATE_RETRY: usize = 5;

impl NodeStatusManager {
    /// Reads the runtime (bounded; see [`runtime_facts`]).
    async fn runtime_facts(&self, known: &mut LastKnown) -> RuntimeFacts {
        known
            .read(
                self.runtime.as_ref(),
                self.images.as_ref(),
                self.runtime_state.as_ref(),
            )
            .await
    }

    /// The status now, given the last reported conditions and the runtime
    /// version the server holds (reported if the runtime's was never read).
    fn compute(
        &self,
        previous: &[NodeCondition],
        facts: &RuntimeFacts,
        devices: &extended::DeviceCapacity,
        server_version: &str,
    ) -> NodeStatus {
        let version = facts.version.as_deref().unwrap_or(server_version);
        let now = Time(self.clock.now());
        let mut capacity = setters::capacity(&self.machine, self.max_pods);
        let mut allocatable = setters::allocatable(&capacity, &self.cfg);
        extended::apply(&mut capacity, &mut allocatable, devices);
        NodeStatus {
            addresses: Some(setters::addresses(&self.node_ips, &self.node_name)),
            allocatable: Some(allocatable),
            capacity: Some(capacity),
            conditions: Some(setters::conditions(
                previous,
                &facts.not_ready,
                setters::Pressures::of(self.pressure.as_ref()),
                &now,
            )),
            daemon_endpoints: Some(setters::daemon_endpoints(self.cfg.port)),
            // Never read (a runtime hung since start): the server's stay.
            images: facts.images.as_deref().map(setters::images),
            node_info: Some(setters::node_info(
                &self.machine,
                version,
                &self.kubelet_version(),
            )),
            // An empty list is left out, as upstream's `omitempty`
            // (`try_update_node_status` clears a list the server holds).
            volumes_in_use: self.volumes.volumes_in_use().filter(|v| !v.is_empty()),
            ..Default::default()
        }
    }

    /// The kubelet version the Node reports: the control plane's when it
    /// is older than kubelet-rs (the skew policy forbids a kubelet newer than
    /// its apiserver), unless `--version=vX.Y.Z` pinned one.
    pub fn kubelet_version(&self) -> String {
        let server = self
            .discovery
            .as_ref()
            .and_then(kubelet_client::discovery::Discovery::current);
        let candidate = self.cfg.reported_version.report(
            server
                .as_deref()
                .map(|s| (s.git_version.as_str(), s.major, s.minor)),
        );
        match self.cfg.reported_version {
            kubelet_types::version::ReportedVersion::Pinned(_) => candidate,
            kubelet_types::version::ReportedVersion::Auto => self.reported.settle(candidate),
        }
    }

    /// Waits (a bounded time) for the first read of the apiserver's version,
    /// so that a new Node is registered with the version it will keep.
    async fn await_server_version(&self) {
        let Some(d) = &self.discovery else { return };
        let mut rx = d.subscribe();
        let first = rx.wait_for(Option::is_some);
        if tokio::time::timeout(SERVER_VERSION_WAIT, first)
            .await
            .is_err()
        {
            warn!(after = ?SERVER_VERSION_WAIT, "The apiserver's version is not known yet; registering with kubelet-rs's own");
        }
    }

    fn record_transitions(&self, old: &[NodeCondition], new: &[NodeCondition]) {
        let node = node_ref(&self.node_name);
        for c in new {
            if old
                .iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status)
            {
                continue;
            }
            let (reason, message) = match (c.type_.as_str(), c.status.as_str()) {
                ("Ready", "True") => ("NodeReady", "status is now: NodeReady"),
                ("Ready", _) => ("NodeNotReady", "status is now: NodeNotReady"),
                ("MemoryPressure", "False") => (
                    "NodeHasSufficientMemory",
                    "status is now: NodeHasSufficientMemory",
                ),
                ("MemoryPressure", _) => (
                    "NodeHasInsufficientMemory",
                    "status is now: NodeHasInsufficientMemory",
                ),
                ("DiskPressure", "False") => (
                    "NodeHasNoDiskPressure",
                    "status is now: NodeHasNoDiskPressure",
                ),
                ("DiskPressure", _) => {
                    ("NodeHasDiskPressure", "status is now: NodeHasDiskPressure")
                }
                ("PIDPressure", "False") => (
                    "NodeHasSufficientPID",
                    "status is now: NodeHasSufficientPID",
                ),
                _ => (
                    "NodeHasInsufficientPID",
                    "status is now: NodeHasInsufficientPID",
                ),
            };
            self.recorder
                .event(&node, EventType::Normal, reason, message.to_string());
        }
    }

    async fn patch_status(
        &self,
        status: &NodeStatus,
        own_addresses: bool,
        stale_allocatable: &[String],
    ) -> Result<Node, kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut body = serde_json::json!({ "status": status });
        if let Some(a) = body
            .get_mut("status")
            .and_then(|s| s.get_mut("allocatable"))
            .and_then(serde_json::Value::as_object_mut)
        {
            for k in stale_allocatable {
                a.insert(k.clone(), serde_json::Value::Null);
            }
        }
        if !own_addresses && let Some(s) = body["status"].as_object_mut() {
            s.remove("addresses");
        }
        // The kubelet owns the whole address list, and two addresses may share a
        // type (dual-stack), which merging by type cannot express: replace it.
        if let Some(list) = body
            .get_mut("status")
            .and_then(|s| s.get_mut("addresses"))
            .and_then(serde_json::Value::as_array_mut)
        {
            list.insert(0, serde_json::json!({"$patch": "replace"}));
        }
        api.patch_status(
            &self.node_name,
            &PatchParams::default(),
            &Patch::Strategic(body),
        )
        .await
    }

    /// Upstream's heartbeat client timeout: `nodeStatusUpdateFrequency`, or
    /// the lease duration if that is shorter.
    pub fn heartbeat_timeout(&self) -> Duration {
        let frequency = self.cfg.node_status_update_frequency;
        match u64::try_from(self.cfg.node_lease_duration_seconds) {
            Ok(lease) if lease > 0 => frequency.min(Duration::from_secs(lease)),
            _ => frequency,
        }
    }

    /// Registers the node, then keeps its status current until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        self.await_server_version().await;
        let mut known = LastKnown::default();
        let facts = self.runtime_facts(&mut known).await;
        let devices = self.extended.capacity().await;
        let initial = self.compute(&[], &facts, &devices, "");
        let Some(registered) = register::register(&self, &initial, &stop).await else {
            return;
        };
        let node = registered.node;
        self.latest.send_replace(Some(node.clone()));
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        self.record_transitions(&[], &conditions);
        self.registered.send_replace(Some(uid));
        // Upstream `lastStatusReportTime`: a Node created just now carries this
        // process's status, which counts as a report.
        let mut last_status_report = registered.created.then(Instant::now);
        let mut tick = tokio::time::interval(self.cfg.node_status_update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Not yet reported: sync at once rather than a period from now.
        let mut now = last_status_report.is_none();
        // A change that must be reported at once (the node shutting down).
        let changed = self.runtime_state.status_changed();
        loop {
            if !std::mem::take(&mut now) {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                    () = changed.notified() => debug!("Node status sync requested"),
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.update_node_status(&mut known, &mut last_status_report) => {}
            }
        }
    }

    /// One status interval (upstream `updateNodeStatus`): the runtime is
    /// read once (under its own deadline), then up to
    /// [`NODE_STATUS_UPDATE_RETRY`] tries.
    async fn update_node_status(
        &self,
        known: &mut LastKnown,
        last_status_report: &mut Option<Instant>,
    ) {
        let facts = self.runtime_facts(known).await;
        let devices = self.extended.capacity().await;
        for try_number in 0..NODE_STATUS_UPDATE_RETRY {
            match self
                .try_update_node_status(try_number, &facts, &devices, last_status_report)
                .await
            {
                Ok(()) => return,
                Err(e) => {
                    if try_number > 0
                        && let Some(c) = &self.connections
                    {
                        c.close_all();
                    }
                    warn!(error = %e, try_number, "Error updating node status, will retry")
                }
            }
        }
        warn!("Unable to update node status: update node status exceeds retry count");
    }

    /// `request` bounded by the heartbeat timeout (upstream's heartbeat
    /// client). A zero timeout means none, as for client-go's `Timeout` (the
    /// client's own request deadline still applies).
    async fn heartbeat_request<T>(
        &self,
        what: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, TryError> {
        let timeout = self.heartbeat_timeout();
        if timeout.is_zero() {
            return request.await.map_err(TryError::Api);
        }
        match tokio::time::timeout(timeout, request).await {
            Ok(r) => r.map_err(TryError::Api),
            Err(_) => Err(TryError::Timeout(what, timeout)),
        }
    }

    /// One try (upstream `tryUpdateNodeStatus`): read the Node, compute the
    /// status over the server's conditions (so transition times follow what
    /// the server holds), and patch when the result differs from the server
    /// in anything but heartbeats, or when `nodeStatusReportFrequency` passed
    /// since the last report.
    async fn try_update_node_status(
        &self,
        try_number: usize,
        facts: &RuntimeFacts,
        devices: &extended::DeviceCapacity,
        last_status_report: &mut Option<Instant>,
    ) -> Result<(), TryError> {
        // The first try may be served from the apiserver's cache; retries are
        // not (upstream `FromApiserverCache` on try 0).
        let params = if try_number == 0 {
            GetParams::any()
        } else {
            GetParams::default()
        };
        let api = Api::<Node>::all(self.client.clone());
        let node = self
            .heartbeat_request("GET", api.get_with(&self.node_name, &params))
            .await?;
        let server = node.status.clone().unwrap_or_default();
        let server_conditions = server.conditions.clone().unwrap_or_default();
        let version = server
            .node_info
            .as_ref()
            .map(|i| i.container_runtime_version.clone())
            .unwrap_or_default();
        let mut status = self.compute(&server_conditions, facts, devices, &version);
        // Nothing in use any more while the server still lists volumes: the
        // list is cleared (upstream's two-way patch of an emptied list).
        if status.volumes_in_use.is_none()
            && server
                .volumes_in_use
                .as_ref()
                .is_some_and(|v| !v.is_empty())
            && self.volumes.volumes_in_use().is_some()
        {
            status.volumes_in_use = Some(Vec::new());
        }
        // A cloud-controller-manager that set the addresses owns them (upstream).
        let own_addresses = !(self.cfg.external_cloud_provider
            && server.addresses.as_ref().is_some_and(|a| !a.is_empty())
            && status.addresses != server.addresses);
        self.publish(node);
        let now = Instant::now();
        let due = last_status_report
            .is_none_or(|at| now.duration_since(at) >= self.cfg.node_status_report_frequency);
        let stale = extended::stale_allocatable(&server, &status);
        if !due
            && stale.is_empty()
            && !compare::changed(&server, &compare::patched(&server, &status, own_addresses))
        {
            debug!("Node status unchanged; not reporting");
            return Ok(());
        }
        let updated = self
            .heartbeat_request("PATCH", self.patch_status(&status, own_addresses, &stale))
            .await?;
        *last_status_report = Some(now);
        let conditions = status.conditions.unwrap_or_default();
        self.record_transitions(&server_conditions, &conditions);
        self.publish(updated);
        debug!("Node status reported");
        Ok(())
    }

    /// Publishes the Node the apiserver returned, if it is news.
    fn publish(&self, node: Node) {
        self.latest.send_if_modified(|current| {
            if current.as_ref() == Some(&node) {
                return false;
            }
            *current = Some(node);
            true
        });
    }
}

impl NodeStatusManager {
    /// Labels every node gets (upstream `initialNode` + `updateDefaultLabels`).
    pub fn default_labels(&self) -> BTreeMap<String, String> {
        let arch = self.machine.architecture.clone();
        [
            ("kubernetes.io/hostname", self.node_name.clone()),
            ("kubernetes.io/os", "linux".to_string()),
            ("kubernetes.io/arch", arch.clone()),
            ("beta.kubernetes.io/os", "linux".to_string()),
            ("beta.kubernetes.io/arch", arch),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Why one try to update node status failed.
#[derive(Debug, thiserror::Error)]
enum TryError {
    #[error(transparent)]
    Api(kube::Error),
    #[error("{0} of the Node timed out after {1:?}")]
    Timeout(&'static str, Duration),
}

/// Logs the node being registered.
pub(crate) fn log_registered(name: &str, created: bool) {
    if created {
        info!(node = %name, "Successfully registered node");
    } else {
        info!(node = %name, "Node was previously registered; reconciled");
    }
}

#[cfg(test)]
mod tests;
