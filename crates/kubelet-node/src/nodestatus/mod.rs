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
                reported.api_addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
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
mod tests {
    use super::*;
    use cri::fake::FakeRuntime;
    use kubelet_client::clock::TokioClock;
    use kubelet_test_util::{Cluster, RecordingRecorder};
    use parking_lot::RwLock;

    /// The agent's runtime state, reduced to what node status reads.
    #[derive(Default)]
    struct Health {
        runtime_error: RwLock<Option<String>>,
        network_error: RwLock<Option<String>>,
    }

    impl RuntimeState for Health {
        fn runtime_errors(&self) -> Vec<String> {
            self.runtime_error.read().iter().cloned().collect()
        }
        fn network_errors(&self) -> Vec<String> {
            self.network_error.read().iter().cloned().collect()
        }
    }

    fn status_patches(c: &Cluster) -> usize {
        c.api
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path == "/api/v1/nodes/n1/status")
            .count()
    }

    fn ready(c: &Cluster) -> (String, String, String) {
        let n = c.api.get("nodes", "", "n1").expect("node");
        let conds = n["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let r = conds
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .expect("Ready");
        let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
        (s("status"), s("reason"), s("message"))
    }

    #[tokio::test(start_paused = true)]
    async fn registers_then_patches_status_only_on_change_or_report_period() {
        let c = Cluster::start(Default::default()).await;
        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        fake.add_image("localhost:5000/busybox:1.35");
        let (mut m, mut registered, health) =
            manager(c.node_client("n1").await, &fake, cfg(), vec![]);
        m.node_labels = [("node-role.example/edge".to_string(), "".to_string())].into();
        m.taints = vec![Taint {
            key: "dedicated".into(),
            value: "edge".into(),
            effect: "NoSchedule".into(),
        }];
        m.provider_id = Some("kubelet-rs://n1".into());
        m.machine = MachineInfo {
            num_cores: 2,
            memory_bytes: 4 << 30,
            root_fs_bytes: 50 << 30,
            architecture: "amd64".into(),
            ..Default::default()
        };
        let recorder = Arc::new(RecordingRecorder::default());
        m.recorder = recorder.clone();
        tokio::spawn(m.run(stop.clone()));
        registered
            .wait_for(Option::is_some)
            .await
            .expect("registered");
        let node = c.api.get("nodes", "", "n1").expect("node created");
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["node-role.example/edge"], "");
        assert_eq!(
            node["metadata"]["annotations"][register::CMAD_ANNOTATION],
            "true"
        );
        assert_eq!(node["spec"]["taints"][0]["effect"], "NoSchedule");
        assert_eq!(node["spec"]["providerID"], "kubelet-rs://n1");
        assert_eq!(node["status"]["capacity"]["pods"], "110");
        assert_eq!(node["status"]["allocatable"]["memory"], "3996Mi");
        assert_eq!(node["status"]["addresses"][0]["address"], "10.0.0.5");
        assert_eq!(
            node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            10250
        );
        assert_eq!(ready(&c).1, "KubeletReady");
        assert!(
            recorder.reasons().contains(&"NodeReady".to_string()),
            "{:?}",
            recorder.reasons()
        );

        // Nothing changes: three periods, no patch.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(status_patches(&c), 0, "unchanged status is not sent");

        // The runtime goes down: the next period reports NotReady, once.
        fake.set_down(true);
        *health.runtime_error.write() = Some("container runtime is down: injected".into());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(status_patches(&c), 1);
        let (status, reason, message) = ready(&c);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "KubeletNotReady")
        );
        assert!(message.contains("container runtime is down"), "{message}");
        assert!(recorder.reasons().contains(&"NodeNotReady".to_string()));
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(status_patches(&c), 1, "still down: nothing new to report");

        // Back up: Ready again.
        fake.set_down(false);
        *health.runtime_error.write() = None;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(status_patches(&c), 2);
        assert_eq!(ready(&c).0, "True");

        // Unchanged for nodeStatusReportFrequency (5m): reported anyway, once.
        tokio::time::sleep(Duration::from_secs(290)).await;
        assert_eq!(status_patches(&c), 2);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            status_patches(&c),
            3,
            "the report period forces a heartbeat"
        );
        stop.cancel();
    }

    /// The kubelet's own client (kubelet-client's stack, with its request
    /// deadline) for node `n1`.
    async fn kubelet_client(c: &Cluster) -> kube::Client {
        let path = c.dir.path().join("n1-kubelet.conf");
        c.api
            .write_cert_kubeconfig(&path, "system:node:n1", &["system:nodes"])
            .expect("kubeconfig");
        kubelet_client::from_kubeconfig(&path, 50.0, 100)
            .await
            .expect("client")
            .0
    }

    fn heartbeat(node: &serde_json::Value, ty: &str) -> (String, String) {
        let c = node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == ty).cloned())
            .unwrap_or_default();
        let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
        (s("lastHeartbeatTime"), s("lastTransitionTime"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_kubelet_reports_status_at_once() {
        let c = Cluster::start(Default::default()).await;
        // The Node as the previous kubelet process left it: Ready, last heartbeat long ago.
        let old = "2020-01-01T00:00:00Z";
        let conditions: Vec<serde_json::Value> = [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
        .iter()
        .map(|(t, s, r)| {
            serde_json::json!({"type": t, "status": s, "reason": r,
                "lastHeartbeatTime": old, "lastTransitionTime": old})
        })
        .collect();
        let existing: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": conditions}}))
        .expect("node");
        let admin: Api<Node> = Api::all(c.admin().await);
        admin
            .create(&Default::default(), &existing)
            .await
            .expect("node");
        let status = serde_json::json!({"status": {"conditions": conditions}});
        admin
            .patch_status("n1", &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("old status");
        assert_eq!(
            heartbeat(&c.api.get("nodes", "", "n1").expect("node"), "Ready").0,
            old
        );
        let before = status_patches(&c);

        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        fake.set_version("containerd", "1.6.20~ds1");
        let (m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
        let started = jiff::Timestamp::now();
        tokio::spawn(m.run(stop.clone()));
        registered
            .wait_for(Option::is_some)
            .await
            .expect("registered");
        // Well within one nodeStatusUpdateFrequency (10s), let alone the 5m report period.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(status_patches(&c) - before, 1, "status is reported at once");
        let node = c.api.get("nodes", "", "n1").expect("node");
        for ty in ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"] {
            let (beat, transition) = heartbeat(&node, ty);
            let beat: jiff::Timestamp = beat.parse().expect("heartbeat time");
            assert!(
                beat >= started
                    .checked_sub(jiff::SignedDuration::from_secs(1))
                    .expect("t"),
                "{ty}: fresh heartbeat, got {beat}"
            );
            assert_eq!(
                transition, old,
                "{ty}: unchanged status keeps its transition time"
            );
        }
        assert_eq!(
            node["status"]["nodeInfo"]["containerRuntimeVersion"], "containerd://1.6.20",
            "the runtime's version as upstream's ParseGeneric prints it"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn registration_through_a_hung_apiserver_is_retried_not_stuck() {
        use apiserver_double::Fault;
        let c = Cluster::start(Default::default()).await;
        let client = kubelet_client(&c).await;
        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        let (m, mut registered, _) = manager(client, &fake, cfg(), vec![]);
        let creates = |c: &Cluster| {
            c.api
                .requests()
                .iter()
                .filter(|r| r.method == "POST" && r.path == "/api/v1/nodes")
                .count()
        };
        c.api.set_fault(Fault::Hang);
        tokio::spawn(m.run(stop.clone()));
        tokio::time::sleep(Duration::from_secs(150)).await;
        assert!(registered.borrow().is_none());
        assert!(
            creates(&c) >= 2,
            "each attempt ends at the client's deadline and is retried, saw {}",
            creates(&c)
        );
        c.api.set_fault(Fault::None);
        tokio::time::timeout(
            Duration::from_secs(70),
            registered.wait_for(Option::is_some),
        )
        .await
        .expect("registered once the apiserver answers")
        .expect("registered");
        assert!(c.api.get("nodes", "", "n1").is_some());
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_status_patch_is_abandoned_at_the_heartbeat_timeout_and_retried() {
        use apiserver_double::Fault;
        let c = Cluster::start(Default::default()).await;
        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        let (m, mut registered, health) = manager(kubelet_client(&c).await, &fake, cfg(), vec![]);
        assert_eq!(m.heartbeat_timeout(), Duration::from_secs(10));
        tokio::spawn(m.run(stop.clone()));
        registered
            .wait_for(Option::is_some)
            .await
            .expect("registered");
        c.api.set_fault(Fault::Hang);
        *health.runtime_error.write() = Some("container runtime is down: injected".into());
        let before = status_patches(&c);
        tokio::time::sleep(Duration::from_secs(65)).await;
        let tries = status_patches(&c) - before;
        assert!(
            tries >= 5,
            "one try per period, each cut at the heartbeat timeout (10s); saw {tries}"
        );
        c.api.set_fault(Fault::None);
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(ready(&c).0, "False", "reported once the apiserver answers");
        stop.cancel();
    }

    fn cfg() -> ClusterConfig {
        kubelet_config::cluster::resolve(&Default::default(), &Default::default()).expect("cfg")
    }

    fn manager(
        client: kube::Client,
        fake: &FakeRuntime,
        cfg: ClusterConfig,
        provided: Vec<IpAddr>,
    ) -> (
        NodeStatusManager,
        watch::Receiver<Option<String>>,
        Arc<Health>,
    ) {
        let (tx, rx) = watch::channel(None);
        let health = Arc::new(Health::default());
        let m = NodeStatusManager {
            client,
            node_name: "n1".into(),
            cfg,
            max_pods: 110,
            node_labels: Default::default(),
            taints: vec![],
            provider_id: None,
            node_ips: vec!["10.0.0.5".parse().expect("ip")],
            provided_node_ips: provided,
            machine: MachineInfo {
                architecture: "amd64".into(),
                ..Default::default()
            },
            runtime: Arc::new(fake.clone()),
            images: Arc::new(fake.clone()),
            runtime_state: health.clone(),
            clock: Arc::new(TokioClock::default()),
            recorder: Arc::new(RecordingRecorder::default()),
            registered: tx,
        };
        (m, rx, health)
    }

    #[tokio::test(start_paused = true)]
    async fn with_an_external_cloud_provider_the_ccm_owns_addresses() {
        let c = Cluster::start(Default::default()).await;
        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        let mut cfg = cfg();
        cfg.external_cloud_provider = true;
        let (m, mut registered, health) = manager(
            c.node_client("n1").await,
            &fake,
            cfg,
            vec!["10.0.0.5".parse().expect("ip")],
        );
        tokio::spawn(m.run(stop.clone()));
        registered
            .wait_for(Option::is_some)
            .await
            .expect("registered");
        let node = c.api.get("nodes", "", "n1").expect("node");
        assert_eq!(
            node["spec"]["taints"][0]["key"],
            register::EXTERNAL_CLOUD_TAINT
        );
        assert_eq!(
            node["metadata"]["annotations"][register::PROVIDED_IP_ANNOTATION],
            "10.0.0.5"
        );
        // The cloud-controller-manager sets the provider's addresses.
        let ccm = serde_json::json!({"status": {"addresses": [{"$patch": "replace"},
            {"type": "InternalIP", "address": "172.16.0.9"}, {"type": "ExternalIP", "address": "203.0.113.9"}]}});
        Api::<Node>::all(c.admin().await)
            .patch_status("n1", &PatchParams::default(), &Patch::Strategic(ccm))
            .await
            .expect("ccm patch");
        *health.network_error.write() = Some(
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized".into(),
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        let node = c.api.get("nodes", "", "n1").expect("node");
        let ready = node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
            .expect("Ready");
        assert_eq!(ready["status"], "False", "status still reported");
        assert!(
            ready["message"]
                .as_str()
                .is_some_and(|m| m.contains("network not ready")),
            "{ready}"
        );
        assert_eq!(
            node["status"]["addresses"][1]["address"], "203.0.113.9",
            "the CCM addresses are kept: {}",
            node["status"]["addresses"]
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn the_address_list_is_replaced_not_merged_by_type() {
        let c = Cluster::start(Default::default()).await;
        let admin: Api<Node> = Api::all(c.admin().await);
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        admin.create(&Default::default(), &n).await.expect("node");
        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        let (m, _, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
        let ips =
            |v: &[&str]| -> Vec<IpAddr> { v.iter().map(|s| s.parse().expect("ip")).collect() };
        let dual = NodeStatus {
            addresses: Some(setters::addresses(&ips(&["10.0.0.5", "fd00::5"]), "n1")),
            ..Default::default()
        };
        m.patch_status(&dual, true).await.expect("patch");
        let single = NodeStatus {
            addresses: Some(setters::addresses(&ips(&["10.0.0.6"]), "n1")),
            ..Default::default()
        };
        m.patch_status(&single, true).await.expect("patch");
        let stored = c.api.get("nodes", "", "n1").expect("node");
        assert_eq!(
            stored["status"]["addresses"],
            serde_json::json!([{"type": "InternalIP", "address": "10.0.0.6"}, {"type": "Hostname", "address": "n1"}])
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn an_existing_node_is_reconciled_not_replaced() {
        let c = Cluster::start(Default::default()).await;
        let admin: Api<Node> = Api::all(c.admin().await);
        let mut existing = Node::default();
        existing.metadata.name = Some("n1".into());
        existing.metadata.labels = Some(
            [
                ("kubernetes.io/os".to_string(), "windows".to_string()),
                ("team".to_string(), "a".to_string()),
            ]
            .into(),
        );
        existing.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        let created = admin
            .create(&Default::default(), &existing)
            .await
            .expect("pre-existing node");
        let stop = CancellationToken::new();
        let fake = FakeRuntime::new();
        let (m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
        tokio::spawn(m.run(stop.clone()));
        let uid = registered
            .wait_for(Option::is_some)
            .await
            .expect("registered")
            .clone();
        assert_eq!(uid, created.metadata.uid, "same Node object");
        let node = c.api.get("nodes", "", "n1").expect("node");
        assert_eq!(
            node["metadata"]["labels"]["kubernetes.io/os"], "linux",
            "default labels reconciled"
        );
        assert_eq!(node["metadata"]["labels"]["team"], "a", "other labels kept");
        assert_eq!(node["spec"]["unschedulable"], true, "spec left alone");
        stop.cancel();
    }
}
