//! Device plugins (upstream `test/e2e_node/device_plugin_test.go`) on real
//! containerd through the apiserver double: a stub plugin advertising two
//! devices of `example.com/resource` registers on
//! `<root-dir>/device-plugins/kubelet.sock`; the Node shows 2 in capacity
//! and allocatable; two pods asking for one each run with the plugin's env
//! and device node (a host `/dev/null` under a per-device path), the third
//! is rejected by the device manager (`UnexpectedAdmissionError`, as
//! upstream's resource allocator admits before the resource predicate); a
//! kubelet restart keeps both pods running with the same devices, even
//! before the plugin registers again, and hands no device out twice; the
//! plugin going away makes allocatable 0. A pod whose two containers ask
//! for one device each keeps both while it is admitted (upstream
//! `pendingAdmissionPod`), so the node has none left for another pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use apiserver_double::Options;
use kubelet_devicemanager::stub::{self, Stub, StubConfig};
use kubelet_devicemanager::v1beta1::{ContainerAllocateResponse, DeviceSpec};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, phase};
use serde_json::{Value, json};

#[path = "device_plugin_e2e.rs"]
mod device_plugin_e2e;

/// The resource the stub advertises.
pub const RESOURCE: &str = "example.com/resource";
const T: Duration = Duration::from_secs(90);

/// The stub's `Allocate`: `STUB_DEVICES=<ids>`, the host's `/dev/null` as
/// `/dev/example-<id>`, an annotation.
pub fn allocate(ids: &[String]) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: BTreeMap::from([("STUB_DEVICES".to_string(), ids.join(","))]),
        devices: ids
            .iter()
            .map(|d| DeviceSpec {
                container_path: format!("/dev/example-{d}"),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            })
            .collect(),
        annotations: BTreeMap::from([("example.com/stub".to_string(), "yes".to_string())]),
        ..Default::default()
    }
}

/// Starts the stub with devices `dev-1` and `dev-2` and registers it.
pub async fn start_stub(root: &Path) -> Stub {
    let dir = root.join("device-plugins");
    let config = StubConfig {
        allocate: Arc::new(allocate),
        ..StubConfig::default()
    };
    let s = Stub::start(
        &dir.join("stub.sock"),
        vec![stub::device("dev-1", true), stub::device("dev-2", true)],
        config,
    )
    .expect("stub device plugin");
    s.register_v1beta1(&dir.join("kubelet.sock"), RESOURCE)
        .await
        .expect("the kubelet accepts the registration");
    s
}

/// A pod asking for one device that prints its devices, then sleeps.
pub fn device_pod() -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c",
                "echo \"stub devices: $STUB_DEVICES\"; for d in /dev/example-*; do test -c $d && echo \"device node: $d\"; done; sleep 3600"],
            "resources": {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}}}]
    })
}

/// `(capacity, allocatable)` of the resource on the Node.
pub fn node_resource(j: &Joined) -> (Option<String>, Option<String>) {
    let n = j.api.get("nodes", "", &j.node.name);
    let get = |field: &str| {
        n.as_ref()
            .and_then(|n| n["status"][field][RESOURCE].as_str())
            .map(str::to_string)
    };
    (get("capacity"), get("allocatable"))
}

/// Waits until the Node shows `want` as (capacity, allocatable).
pub async fn wait_node_resource(j: &Joined, want: (Option<&str>, Option<&str>)) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (c, a) = node_resource(j);
        if (c.as_deref(), a.as_deref()) == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {RESOURCE}: capacity {c:?}, allocatable {a:?}; want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The log of the pod's `main` container (first instance), raw CRI lines.
pub fn log(j: &Joined, name: &str) -> String {
    container_log(j, name, "main")
}

/// The log of one container of the pod (first instance), raw CRI lines.
pub fn container_log(j: &Joined, name: &str, container: &str) -> String {
    let Some(uid) = j
        .api_pod(name)
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
    else {
        return String::new();
    };
    let path = kubelet_rs_integration::pod_logs_dir()
        .join(format!("default_{}_{uid}", j.pod_name(name)))
        .join(container)
        .join("0.log");
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits for the pod to run and print its device; returns the device id.
pub async fn wait_device(j: &Joined, name: &str) -> String {
    j.wait_api(name, T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let l = log(j, name);
        let id = l
            .lines()
            .find_map(|line| line.split("stub devices: ").nth(1))
            .map(|s| s.trim().to_string());
        if let Some(id) = id
            && l.contains(&format!("device node: /dev/example-{id}"))
        {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: no device in its output: {l}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits for the container to print its devices; returns them.
async fn wait_container_devices(j: &Joined, name: &str, container: &str) -> String {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let l = container_log(j, name, container);
        if let Some(ids) = l
            .lines()
            .find_map(|line| line.split("stub devices: ").nth(1))
        {
            return ids.trim().to_string();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}/{container}: no device in its output: {l}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Restarts of the pod's `main` container in the apiserver's status.
pub fn restarts(j: &Joined, name: &str) -> i64 {
    j.api_pod(name)
        .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64())
        .unwrap_or(-1)
}

async fn expect_rejected(j: &Joined, name: &str) {
    let p = j
        .wait_api(name, T, "rejected", |p| phase(p) == Some("Failed"))
        .await
        .expect("pod");
    let message = format!(
        "Allocate failed due to requested number of devices unavailable for {RESOURCE}. Requested: 1, Available: 0, which is unexpected"
    );
    assert_eq!(
        p["status"]["reason"], "UnexpectedAdmissionError",
        "{}",
        p["status"]
    );
    assert_eq!(
        p["status"]["message"],
        format!("Pod was rejected: {message}")
    );
    let want = |t: &str, r: &str, m: &str| {
        t == "Warning" && r == "UnexpectedAdmissionError" && m == message
    };
    let ev = j.wait_pod_event(name, T, want).await;
    assert!(
        ev.iter().any(|(t, r, m)| want(t, r, m)),
        "{name}: no UnexpectedAdmissionError event: {ev:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devices_two_pods_the_third_rejected_and_a_restart_keeps_them() {
    let mut j = Joined::start_with(Options::default(), |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await;
    let root = j.node.root_dir();
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    j.create_pod("dev-a", device_pod()).await;
    let a = wait_device(&j, "dev-a").await;
    j.create_pod("dev-b", device_pod()).await;
    let b = wait_device(&j, "dev-b").await;
    assert_ne!(a, b, "each pod has its own device");
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(both, ["dev-1", "dev-2"]);
    assert_eq!(plugin.calls().allocate.len(), 2, "{:?}", plugin.calls());

    j.create_pod("dev-c", device_pod()).await;
    expect_rejected(&j, "dev-c").await;

    // A kubelet restart with the plugin away: the running pods are admitted
    // again from the checkpoint and keep running, untouched.
    j.node.stop().await;
    plugin.stop().await;
    j.node.start_again().await;
    let root_sock = root.join("device-plugins/kubelet.sock");
    let deadline = tokio::time::Instant::now() + T;
    while !root_sock.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no registration socket after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in ["dev-a", "dev-b"] {
        j.node
            .wait_status(name, T, "Running again", |s| {
                s.phase.as_deref() == Some("Running")
            })
            .await
            .expect("running after the restart");
    }
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;
    // A fourth pod finds no device free: none is handed out twice.
    j.create_pod("dev-d", device_pod()).await;
    expect_rejected(&j, "dev-d").await;
    assert!(plugin.calls().allocate.is_empty(), "{:?}", plugin.calls());
    for (name, id) in [("dev-a", &a), ("dev-b", &b)] {
        assert_eq!(restarts(&j, name), 0, "{name} restarted");
        assert!(
            log(&j, name).contains(&format!("stub devices: {id}")),
            "{name}"
        );
        assert_eq!(
            j.api_pod(name)
                .and_then(|p| p["status"]["phase"].as_str().map(str::to_string)),
            Some("Running".into())
        );
    }

    // The plugin goes away: its devices are withdrawn from allocatable at
    // once; capacity stays for the endpoint's grace period (5 minutes).
    plugin.stop().await;
    wait_node_resource(&j, (Some("2"), Some("0"))).await;
    j.cleanup().await;
}

/// The plugin-watcher side of a device plugin (upstream
/// `pluginregistration.v1` `Registration`): names a `DevicePlugin`, its
/// resource and its socket, and records the kubelet's verdict.
struct Registrar {
    endpoint: PathBuf,
    verdicts: tokio::sync::mpsc::UnboundedSender<(bool, String)>,
}

#[tonic::async_trait]
impl kubelet_pluginmanager::pb::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: tonic::Request<kubelet_pluginmanager::pb::InfoRequest>,
    ) -> Result<tonic::Response<kubelet_pluginmanager::pb::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(
            kubelet_pluginmanager::pb::PluginInfo {
                r#type: kubelet_pluginmanager::DEVICE_PLUGIN.into(),
                name: RESOURCE.into(),
                endpoint: self.endpoint.to_string_lossy().into_owned(),
                supported_versions: vec!["v1beta1".into()],
            },
        ))
    }

    async fn notify_registration_status(
        &self,
        req: tonic::Request<kubelet_pluginmanager::pb::RegistrationStatus>,
    ) -> Result<tonic::Response<kubelet_pluginmanager::pb::RegistrationStatusResponse>, tonic::Status>
    {
        let r = req.into_inner();
        let _ = self.verdicts.send((r.plugin_registered, r.error));
        Ok(tonic::Response::new(
            kubelet_pluginmanager::pb::RegistrationStatusResponse {},
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_registers_through_the_plugin_watcher() {
    let j = Joined::start_with(Options::default(), |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await;
    let root = j.node.root_dir();
    let own = root.join("example-dp");
    std::fs::create_dir_all(&own).expect("plugin dir");
    let plugin = Stub::start(
        &own.join("stub.sock"),
        vec![stub::device("dev-1", true), stub::device("dev-2", true)],
        StubConfig {
            allocate: Arc::new(allocate),
            ..StubConfig::default()
        },
    )
    .expect("stub device plugin");
    let registry = root.join("plugins_registry");
    std::fs::create_dir_all(&registry).expect("registry dir");
    let (tx, mut verdicts) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(registry.join("example.com-resource-reg.sock"))
        .expect("registration socket");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                kubelet_pluginmanager::pb::registration_server::RegistrationServer::new(
                    Registrar {
                        endpoint: own.join("stub.sock"),
                        verdicts: tx,
                    },
                ),
            )
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let verdict = tokio::time::timeout(T, verdicts.recv())
        .await
        .expect("the kubelet answers the registration")
        .expect("a verdict");
    assert_eq!(verdict, (true, String::new()));
    wait_node_resource(&j, (Some("2"), Some("2"))).await;
    j.create_pod("dev-w", device_pod()).await;
    let id = wait_device(&j, "dev-w").await;
    assert!(["dev-1", "dev-2"].contains(&id.as_str()), "{id}");
    server.abort();
    plugin.stop().await;
    j.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_keeps_every_containers_device_while_it_is_admitted() {
    let j = Joined::start_with(Options::default(), |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await;
    let root = j.node.root_dir();
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;
    let c = |name: &str| {
        json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "echo \"stub devices: $STUB_DEVICES\"; sleep 3600"],
            "resources": {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}}})
    };
    j.create_pod(
        "dev-two",
        json!({"terminationGracePeriodSeconds": 1, "containers": [c("one"), c("two")]}),
    )
    .await;
    j.wait_api("dev-two", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let one = wait_container_devices(&j, "dev-two", "one").await;
    let two = wait_container_devices(&j, "dev-two", "two").await;
    let mut both = vec![one, two];
    both.sort();
    assert_eq!(
        both,
        ["dev-1", "dev-2"],
        "each container has its own device"
    );
    // Both devices stay the pod's: another pod is refused.
    j.create_pod("dev-other", device_pod()).await;
    expect_rejected(&j, "dev-other").await;
    assert_eq!(plugin.calls().allocate.len(), 2, "{:?}", plugin.calls());
    plugin.stop().await;
    j.cleanup().await;
}
