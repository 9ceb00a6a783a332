//! Node registration and status (upstream `kubelet_node_status.go`):
//! [`register`] creates the Node or reconciles an existing one; the status loop
//! computes the status every `nodeStatusUpdateFrequency` and patches
//! `nodes/status` (strategic merge) only when something other than heartbeat
//! times changed, or when `nodeStatusReportFrequency` passed since the last
//! report. Condition changes become node events (NodeReady, NodeNotReady, ...).
//!
//! As upstream (whose `lastStatusReportTime` starts at zero), the first status
//! is reported as soon as the node is registered: a Node that already existed,
//! as after a restart, still carries the old process's heartbeats. A Node
//! created just now carries this process's status, which counts as the first
//! report. Each sync is bounded by upstream's heartbeat client timeout, the
//! smaller of `nodeStatusUpdateFrequency` and the lease duration.

pub mod machine;
pub mod register;
pub mod setters;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cri::{ImageService, RuntimeService};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubelet_types::events::{EventType, Recorder, node_ref};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::RuntimeState;
use kubelet_client::clock::Clock;
use kubelet_config::{ClusterConfig, Taint};
use machine::MachineInfo;

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
    /// Wall clock for heartbeats.
    pub clock: Arc<dyn Clock>,
    /// Events.
    pub recorder: Arc<dyn Recorder>,
    /// Set to the Node's UID once registered.
    pub registered: watch::Sender<Option<String>>,
    /// The Node as the apiserver last returned it (registration, each
    /// status patch): labels and taints others set, for pod admission.
    pub latest: watch::Sender<Option<Node>>,
}

/// Runtime facts for one status computation.
struct RuntimeFacts {
    version: String,
    not_ready: Vec<String>,
    images: Vec<cri::pb::Image>,
}

/// What the status loop remembers between syncs.
struct Reported {
    /// The status last reported (or found on the Node at registration).
    last: NodeStatus,
    /// The addresses the apiserver holds.
    api_addresses: Vec<NodeAddress>,
    /// When status was last reported by this process; `None`: not yet.
    at: Option<Instant>,
}

impl NodeStatusManager {
    async fn runtime_facts(&self, last_version: &str) -> RuntimeFacts {
        // The runtime's state as the health check last saw it (upstream `runtimeState`):
        // no second status call to the runtime.
        let mut not_ready = self.runtime_state.runtime_errors();
        not_ready.extend(self.runtime_state.network_errors());
        let version = match self.runtime.version().await {
            Ok(v) => setters::container_runtime_version(&v.runtime_name, &v.runtime_version),
            Err(_) => last_version.to_string(),
        };
        let images = self.images.list_images().await.unwrap_or_default();
        RuntimeFacts {
            version,
            not_ready,
            images,
        }
    }

    /// The status now, given the last reported conditions.
    async fn compute(&self, previous: &[NodeCondition], last_version: &str) -> NodeStatus {
        let facts = self.runtime_facts(last_version).await;
        let now = Time(self.clock.now());
        let capacity = setters::capacity(&self.machine, self.max_pods);
        let allocatable = setters::allocatable(&capacity, &self.cfg);
        NodeStatus {
            addresses: Some(setters::addresses(&self.node_ips, &self.node_name)),
            allocatable: Some(allocatable),
            capacity: Some(capacity),
            conditions: Some(setters::conditions(previous, &facts.not_ready, &now)),
            daemon_endpoints: Some(setters::daemon_endpoints(self.cfg.port)),
            images: Some(setters::images(&facts.images)),
            node_info: Some(setters::node_info(
                &self.machine,
                &facts.version,
                kubelet_types::KUBERNETES_VERSION,
            )),
            ..Default::default()
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
    ) -> Result<Node, kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut body = serde_json::json!({ "status": status });
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
        let initial = self.compute(&[], "").await;
        let Some(registered) = register::register(&self, &initial, &stop).await else {
            return;
        };
        let node = registered.node;
        self.latest.send_replace(Some(node.clone()));
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let last: NodeStatus = node.status.clone().unwrap_or_default();
        self.record_transitions(&[], &last.conditions.clone().unwrap_or_default());
        self.registered.send_replace(Some(uid));
        let mut reported = Reported {
            api_addresses: last.addresses.clone().unwrap_or_default(),
            last,
            at: registered.created.then(Instant::now),
        };
        let mut tick = tokio::time::interval(self.cfg.node_status_update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Not yet reported: sync at once rather than a period from now.
        let mut now = reported.at.is_none();
        loop {
            if !std::mem::take(&mut now) {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.sync(&mut reported) => {}
            }
        }
    }

    /// One status sync: compute, and report when changed or due.
    async fn sync(&self, reported: &mut Reported) {
        let conditions = |s: &NodeStatus| s.conditions.clone().unwrap_or_default();
        let version = reported
            .last
            .node_info
            .as_ref()
            .map(|i| i.container_runtime_version.clone())
            .unwrap_or_default();
        let mut status = self.compute(&conditions(&reported.last), &version).await;
        let due = reported
            .at
            .is_none_or(|at| at.elapsed() >= self.cfg.node_status_report_frequency);
        let report = async {
            let mut own_addresses = true;
            if self.cfg.external_cloud_provider
                && let Ok(current) = Api::<Node>::all(self.client.clone())
                    .get(&self.node_name)
                    .await
            {
                reported.api_addresses =
                    current.status.and_then(|s| s.addresses).unwrap_or_default();
            }
            if self.cfg.external_cloud_provider
                && !reported.api_addresses.is_empty()
                && status.addresses.as_ref() != Some(&reported.api_addresses)
            {
                // A cloud-controller-manager set them; its addresses take precedence (upstream).
                status.addresses = Some(reported.api_addresses.clone());
                own_addresses = false;
            }
            if !setters::changed(&reported.last, &status) && !due {
                debug!("Node status unchanged; not reporting");
                return None;
            }
            Some(self.patch_status(&status, own_addresses).await)
        };
        let timeout = self.heartbeat_timeout();
        // A zero timeout means none, as for client-go's `Timeout` (the client's
        // own request deadline still applies).
        let outcome = if timeout.is_zero() {
            Ok(report.await)
        } else {
            tokio::time::timeout(timeout, report).await
        };
        match outcome {
            Ok(None) => {}
            Ok(Some(Ok(node))) => {
                reported.api_addresses = node
                    .status
                    .as_ref()
                    .and_then(|s| s.addresses.clone())
                    .unwrap_or_default();
                self.latest.send_replace(Some(node));
                self.record_transitions(&conditions(&reported.last), &conditions(&status));
                reported.last = status;
                reported.at = Some(Instant::now());
                debug!("Node status reported");
            }
            Ok(Some(Err(e))) => warn!(error = %e, "Error updating node status, will retry"),
            Err(_) => warn!(?timeout, "Node status update timed out, will retry"),
        }
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
