//! Node registration and status (upstream `kubelet_node_status.go`):
//! [`register`] creates the Node or reconciles an existing one; the status loop
//! computes the status every `nodeStatusUpdateFrequency` and patches
//! `nodes/status` (strategic merge) only when something other than heartbeat
//! times changed, or when `nodeStatusReportFrequency` passed since the last
//! report. Condition changes become node events (NodeReady, NodeNotReady, ...).

pub mod machine;
pub mod register;
pub mod setters;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cri::{ImageService, RuntimeService};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubelet_types::events::{EventType, Recorder, node_ref};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::config::{ClusterConfig, Taint};
use crate::healthz::Health;
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
    /// Host facts.
    pub machine: MachineInfo,
    /// Runtime (version, status).
    pub runtime: Arc<dyn RuntimeService>,
    /// Images (for `status.images`).
    pub images: Arc<dyn ImageService>,
    /// Kubelet health (runtime, PLEG).
    pub health: Arc<Health>,
    /// Wall clock for heartbeats.
    pub clock: Arc<dyn Clock>,
    /// Events.
    pub recorder: Arc<dyn Recorder>,
    /// Set to the Node's UID once registered.
    pub registered: watch::Sender<Option<String>>,
}

/// Runtime facts for one status computation.
struct RuntimeFacts {
    version: String,
    not_ready: Vec<String>,
    images: Vec<cri::pb::Image>,
}

impl NodeStatusManager {
    async fn runtime_facts(&self, last_version: &str) -> RuntimeFacts {
        let mut not_ready = vec![];
        if self.health.runtime_error.read().is_some() {
            not_ready.push("container runtime is down".to_string());
        }
        if let Err(e) = self.health.pleg.healthy() {
            not_ready.push(format!("PLEG is not healthy: {e}"));
        }
        match self.runtime.status().await {
            Ok(st) => {
                for c in st.conditions.iter().filter(|c| !c.status) {
                    match c.r#type.as_str() {
                        "RuntimeReady" => not_ready.push(format!(
                            "container runtime status check may not have completed yet: RuntimeReady=false reason:{} message:{}",
                            c.reason, c.message
                        )),
                        "NetworkReady" => not_ready.push(format!(
                            "container runtime network not ready: NetworkReady=false reason:{} message:{}",
                            c.reason, c.message
                        )),
                        _ => {}
                    }
                }
            }
            Err(_) if !not_ready.is_empty() => {}
            Err(_) => not_ready.push("container runtime is down".to_string()),
        }
        let version = match self.runtime.version().await {
            Ok(v) => format!("{}://{}", v.runtime_name, v.runtime_version),
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

    async fn patch_status(&self, status: &NodeStatus) -> Result<Node, kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let body = serde_json::json!({ "status": status });
        api.patch_status(
            &self.node_name,
            &PatchParams::default(),
            &Patch::Strategic(body),
        )
        .await
    }

    /// Registers the node, then keeps its status current until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let initial = self.compute(&[], "").await;
        let Some(node) = register::register_until_done(&self, &initial, &stop).await else {
            return;
        };
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let mut last: NodeStatus = node.status.clone().unwrap_or_default();
        let conditions = |s: &NodeStatus| s.conditions.clone().unwrap_or_default();
        self.record_transitions(&[], &conditions(&last));
        self.registered.send_replace(Some(uid));
        let mut last_report = Instant::now();
        let mut tick = tokio::time::interval(self.cfg.node_status_update_frequency);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let version = last
                .node_info
                .as_ref()
                .map(|i| i.container_runtime_version.clone())
                .unwrap_or_default();
            let status = self.compute(&conditions(&last), &version).await;
            let due = last_report.elapsed() >= self.cfg.node_status_report_frequency;
            if !setters::changed(&last, &status) && !due {
                debug!("Node status unchanged; not reporting");
                continue;
            }
            match tokio::time::timeout(Duration::from_secs(30), self.patch_status(&status)).await {
                Ok(Ok(_)) => {
                    self.record_transitions(&conditions(&last), &conditions(&status));
                    last = status;
                    last_report = Instant::now();
                    debug!("Node status reported");
                }
                Ok(Err(e)) => warn!(error = %e, "Error updating node status, will retry"),
                Err(_) => warn!("Node status update timed out, will retry"),
            }
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
