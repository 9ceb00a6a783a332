//! Unit tests of the node status updates.

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
    shutdown_error: RwLock<Option<String>>,
    changed: Arc<tokio::sync::Notify>,
}

impl RuntimeState for Health {
    fn runtime_errors(&self) -> Vec<String> {
        self.runtime_error.read().iter().cloned().collect()
    }
    fn network_errors(&self) -> Vec<String> {
        self.network_error.read().iter().cloned().collect()
    }
    fn shutdown_errors(&self) -> Vec<String> {
        self.shutdown_error.read().iter().cloned().collect()
    }
    fn status_changed(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }
}

fn status_patches(c: &Cluster) -> usize {
    c.api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == "/api/v1/nodes/n1/status")
        .count()
}

/// The status loop's reads of the Node (one per try).
fn node_reads(c: &Cluster) -> usize {
    c.api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/nodes/n1")
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
    let (mut m, mut registered, health) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
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
    let before = node_reads(&c);
    tokio::time::sleep(Duration::from_secs(65)).await;
    let tries = node_reads(&c) - before;
    assert!(
        tries >= 6,
        "each try (GET, then PATCH) is cut at the heartbeat timeout (10s) and retried; saw {tries}"
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
        pressure: Arc::new(crate::NoPressure),
        extended: Arc::new(crate::NoExtendedResources),
        volumes: Arc::new(crate::NoVolumesInUse),
        clock: Arc::new(TokioClock::default()),
        recorder: Arc::new(RecordingRecorder::default()),
        registered: tx,
        latest: watch::channel(None).0,
        connections: None,
        discovery: None,
        reported: Default::default(),
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
    let ips = |v: &[&str]| -> Vec<IpAddr> { v.iter().map(|s| s.parse().expect("ip")).collect() };
    let dual = NodeStatus {
        addresses: Some(setters::addresses(&ips(&["10.0.0.5", "fd00::5"]), "n1")),
        ..Default::default()
    };
    m.patch_status(&dual, true, &[]).await.expect("patch");
    let single = NodeStatus {
        addresses: Some(setters::addresses(&ips(&["10.0.0.6"]), "n1")),
        ..Default::default()
    };
    m.patch_status(&single, true, &[]).await.expect("patch");
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

mod outage;

mod clock_jumps;
mod extended_resources;
mod heartbeat_failure;
mod volumes_in_use;

#[tokio::test(start_paused = true)]
async fn a_requested_sync_reports_the_shutdown_before_the_next_tick() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (m, mut registered, health) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ready(&c).0, "True");
    let patches = status_patches(&c);
    // A network error and the shutdown, told to the loop 1s after a tick.
    *health.runtime_error.write() = Some("container runtime is down".into());
    *health.network_error.write() = Some("container runtime network not ready: <nil>".into());
    *health.shutdown_error.write() = Some("node is shutting down".into());
    health.changed.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status_patches(&c), patches + 1, "reported at once");
    let (status, reason, message) = ready(&c);
    assert_eq!(
        (status.as_str(), reason.as_str(), message.as_str()),
        (
            "False",
            "KubeletNotReady",
            "[container runtime is down, container runtime network not ready: <nil>, node is shutting down]"
        )
    );
    stop.cancel();
}

/// Issue 28: the Node never reports a kubelet newer than its apiserver,
/// unless the operator pinned a version.
#[tokio::test]
async fn the_kubelet_version_follows_an_older_control_plane_unless_pinned() {
    let c = Cluster::start(Default::default()).await;
    let client = c.node_client("n1").await;
    let fake = FakeRuntime::new();
    let server = |v: &str| kubelet_client::discovery::ServerInfo {
        git_version: v.into(),
        major: 1,
        minor: 19,
        group_versions: Default::default(),
    };
    let (mut m, _, _) = manager(client.clone(), &fake, cfg(), vec![]);
    assert_eq!(
        m.kubelet_version(),
        kubelet_types::KUBERNETES_VERSION,
        "no apiserver read yet"
    );
    m.discovery = Some(kubelet_client::discovery::Discovery::with_info(
        client.clone(),
        server("v1.19.16"),
    ));
    assert_eq!(m.kubelet_version(), "v1.19.16");
    let facts = m.runtime_facts(&mut LastKnown::default()).await;
    let status = m.compute(&[], &facts, &Default::default(), "");
    assert_eq!(
        status.node_info.map(|i| i.kubelet_version),
        Some("v1.19.16".to_string())
    );
    // Another apiserver of an upgrade in progress answers: no rise until
    // the kubelet restarts.
    m.discovery = Some(kubelet_client::discovery::Discovery::with_info(
        client.clone(),
        kubelet_client::discovery::ServerInfo {
            minor: 20,
            ..server("v1.20.1")
        },
    ));
    assert_eq!(m.kubelet_version(), "v1.19.16");
    m.cfg.reported_version =
        kubelet_types::version::ReportedVersion::pinned("v1.30.4").expect("pin");
    assert_eq!(m.kubelet_version(), "v1.30.4");
}
