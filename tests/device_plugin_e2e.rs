//! Upstream's device plugin node e2e specs (`test/e2e_node/device_plugin_test.go`
//! "DevicePlugin" and `device_manager_test.go` "With sample device plugin")
//! on real containerd: the stub plays upstream's sample device plugin (two
//! devices of `example.com/resource`, re-registering when the kubelet
//! restarts, as a compliant plugin does), pods print the device they got, and
//! the pod-resources API cross-checks the kubelet's view of the assignment.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use kubelet_podresources::pb::{ListPodResourcesRequest, PodResources};
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, condition, phase};
use serde_json::{Value, json};

use super::{RESOURCE, start_stub, wait_node_resource};
use apiserver_double::Options;
use cri::RuntimeService as _;

const T: Duration = Duration::from_secs(90);

/// Upstream's `makeBusyboxPod` command, with our stub's env and device node:
/// prints the devices it got, then sleeps `sleep`.
fn print_devices(sleep: &str) -> String {
    format!(
        "echo \"stub devices: $STUB_DEVICES\"; for d in /dev/example-*; do test -c $d && echo \"device node: $d\"; done; sleep {sleep}"
    )
}

/// A one-container pod asking for `count` devices (upstream `makeBusyboxPod`).
fn busybox_pod(cmd: &str, restart_policy: &str, count: u32) -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": restart_policy,
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", cmd],
            "resources": {"requests": {RESOURCE: count.to_string()},
                          "limits": {RESOURCE: count.to_string()}}}]
    })
}

async fn start(j_profile: Options) -> Joined {
    Joined::start_with(j_profile, |f, _| {
        f.node_status_update_frequency = Some("1s".into());
    })
    .await
}

/// The newest log file of one container of the pod (upstream `parseLog`
/// reads the current instance's log).
fn newest_log(j: &Joined, name: &str, container: &str) -> String {
    let Some(uid) = uid(j, name) else {
        return String::new();
    };
    let dir = kubelet_rs_integration::pod_logs_dir()
        .join(format!("default_{}_{uid}", j.pod_name(name)))
        .join(container);
    let newest = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".log")
                .and_then(|i| i.parse::<u32>().ok())
                .map(|i| (i, e.path()))
        })
        .max();
    newest
        .and_then(|(_, p)| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
}

/// The device id the container printed (upstream `stub devices: (Dev-[0-9]+)`).
fn device_in(log: &str) -> Option<String> {
    log.lines()
        .find_map(|line| line.split("stub devices: ").nth(1))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Waits for the newest instance of the container to print its device.
async fn wait_printed(j: &Joined, name: &str, container: &str) -> String {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let l = newest_log(j, name, container);
        if let Some(id) = device_in(&l) {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}/{container}: no device printed: {l}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn uid(j: &Joined, name: &str) -> Option<String> {
    j.api_pod(name)
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
}

fn restart_count(j: &Joined, name: &str) -> i64 {
    j.api_pod(name)
        .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64())
        .unwrap_or(-1)
}

/// Upstream `ensurePodContainerRestart`: the container restarted at least once more.
async fn wait_container_restart(j: &Joined, name: &str) {
    let initial = restart_count(j, name);
    j.wait_api(name, T, "restarted", |_| restart_count(j, name) > initial)
        .await;
}

/// Upstream `BeTheSamePodStillRunning`: same UID, Running, Ready.
async fn wait_same_pod_running(j: &Joined, name: &str, want_uid: &str) {
    j.wait_api(name, T, "the same pod running and ready", |p| {
        p.and_then(|p| p["metadata"]["uid"].as_str()) == Some(want_uid)
            && phase(p) == Some("Running")
            && condition(p, "Ready")
    })
    .await;
}

/// Waits for the kubelet's registration socket (a restarted kubelet serves it anew).
async fn wait_registration_socket(root: &Path) {
    let sock = root.join("device-plugins/kubelet.sock");
    let deadline = tokio::time::Instant::now() + T;
    while !sock.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no registration socket"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `List` on the pod-resources socket, retried until it answers (upstream
/// `getV1NodeDevices` in an `Eventually`).
async fn list(root: &Path) -> Vec<PodResources> {
    let socket = kubelet_podresources::socket_path(root);
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Ok(mut c) = kubelet_podresources::v1_client(&socket, Duration::from_secs(5)).await
            && let Ok(r) = c.list(ListPodResourcesRequest {}).await
        {
            return r.into_inner().pod_resources;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod-resources API does not answer"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Upstream `checkPodResourcesAssignment`: `Err` when the container is not
/// listed, else whether its devices of the resource are exactly `devs`.
fn assignment(
    list: &[PodResources],
    pod: &str,
    container: &str,
    devs: &[&str],
) -> Result<bool, String> {
    let c = list
        .iter()
        .filter(|p| p.namespace == "default" && p.name == pod)
        .flat_map(|p| p.containers.iter())
        .find(|c| c.name == container)
        .ok_or_else(|| format!("no resources found for default/{pod}/{container}"))?;
    let mut got: Vec<&str> = c
        .devices
        .iter()
        .filter(|d| d.resource_name == RESOURCE)
        .flat_map(|d| d.device_ids.iter().map(String::as_str))
        .collect();
    got.sort_unstable();
    let mut want = devs.to_vec();
    want.sort_unstable();
    Ok(got == want)
}

/// Waits until the pod-resources API lists `devs` for the container: after
/// a kubelet restart the list is empty until the pod sources have given the
/// pods back (upstream's `List` reads the pod manager too).
async fn assert_assigned(j: &Joined, name: &str, container: &str, devs: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let l = list(&j.node.root_dir()).await;
        let got = assignment(&l, &j.pod_name(name), container, devs);
        if got == Ok(true) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}/{container} should hold {devs:?}: {got:?} {l:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a compliant plugin does when the kubelet restarts (the kubelet
/// removed its socket): serves again and registers again.
async fn reregister(plugin: &mut kubelet_devicemanager::stub::Stub, root: &Path) {
    plugin.serve_again().await.expect("the plugin serves again");
    plugin
        .register_v1beta1(&root.join("device-plugins/kubelet.sock"), RESOURCE)
        .await
        .expect("the plugin registers again");
}

/// Force-deletes the pod (grace 0), as upstream `deletePodSyncByName`.
async fn force_delete(j: &Joined, name: &str) {
    Api::<Pod>::namespaced(j.admin.clone(), "default")
        .delete(&j.pod_name(name), &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
}

/// "Keeps device plugin assignments across pod restarts (no kubelet restart,
/// no device plugin restart)" then "... across pod and kubelet restarts (no
/// device plugin restart)": a container that exits every few seconds gets the
/// same device on each restart, before and after a kubelet restart, and the
/// pod-resources API agrees; a second pod gets a device too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_restarts_and_a_kubelet_restart_keep_the_device() {
    let mut j = start(Options::default()).await;
    let root = j.node.root_dir();
    let mut plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    j.create_pod("dp-restarts", busybox_pod(&print_devices("3"), "Always", 1))
        .await;
    j.wait_api("dp-restarts", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dev1 = wait_printed(&j, "dp-restarts", "main").await;

    wait_container_restart(&j, "dp-restarts").await;
    let after = wait_printed(&j, "dp-restarts", "main").await;
    assert_eq!(after, dev1, "the restarted container keeps its device");
    assert_assigned(&j, "dp-restarts", "main", &[&dev1]).await;

    j.create_pod("dp-other", busybox_pod(&print_devices("3600"), "Always", 1))
        .await;
    j.wait_api("dp-other", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dev2 = wait_printed(&j, "dp-other", "main").await;
    assert_ne!(dev2, dev1, "no device is handed out twice");
    assert_assigned(&j, "dp-restarts", "main", &[&dev1]).await;
    assert_assigned(&j, "dp-other", "main", &[&dev2]).await;

    // The kubelet restarts; the plugin re-registers as a compliant one does.
    j.node.restart().await;
    wait_registration_socket(&root).await;
    reregister(&mut plugin, &root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;
    let restarts = restart_count(&j, "dp-restarts");
    j.wait_api("dp-restarts", T, "Running and Ready again", |p| {
        phase(p) == Some("Running")
            && condition(p, "Ready")
            && restart_count(&j, "dp-restarts") > restarts
    })
    .await;
    let again = wait_printed(&j, "dp-restarts", "main").await;
    assert_eq!(again, dev1, "the device survives the kubelet restart");
    assert_assigned(&j, "dp-restarts", "main", &[&dev1]).await;
    assert_eq!(
        plugin.calls().allocate.len(),
        2,
        "restarts reuse the allocation: {:?}",
        plugin.calls()
    );
    plugin.stop().await;
    j.cleanup().await;
}

/// "Keeps device plugin assignments across kubelet restarts (no pod restart,
/// no device plugin restart)", "... after the device plugin has restarted
/// (no kubelet restart, pod restart)", "... after kubelet restart and device
/// plugin restart (no pod restart)" and (upstream 1.26) "... after the device
/// plugin has been re-registered": a pod running forever keeps its device
/// and its instance through a kubelet restart and a plugin restart, and the
/// next pod gets the other device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_and_plugin_restarts_keep_the_running_pods_device() {
    let mut j = start(Options::default()).await;
    let root = j.node.root_dir();
    let mut plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    j.create_pod("dp-stable", busybox_pod(&print_devices("24h"), "Always", 1))
        .await;
    j.wait_api("dp-stable", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dev1 = wait_printed(&j, "dp-stable", "main").await;
    let uid1 = uid(&j, "dp-stable").expect("uid");

    j.node.restart().await;
    wait_registration_socket(&root).await;
    reregister(&mut plugin, &root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;
    wait_same_pod_running(&j, "dp-stable", &uid1).await;
    assert_eq!(
        restart_count(&j, "dp-stable"),
        0,
        "the container kept running"
    );
    assert_assigned(&j, "dp-stable", "main", &[&dev1]).await;
    assert_eq!(plugin.calls().allocate.len(), 1, "{:?}", plugin.calls());

    // The plugin restarts (a new process on the same socket) and registers.
    plugin.stop().await;
    wait_node_resource(&j, (Some("2"), Some("0"))).await;
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;
    wait_same_pod_running(&j, "dp-stable", &uid1).await;
    assert_eq!(
        restart_count(&j, "dp-stable"),
        0,
        "the container kept running"
    );
    assert_assigned(&j, "dp-stable", "main", &[&dev1]).await;

    j.create_pod("dp-next", busybox_pod(&print_devices("24h"), "Always", 1))
        .await;
    j.wait_api("dp-next", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dev2 = wait_printed(&j, "dp-next", "main").await;
    assert_ne!(dev2, dev1, "the next pod gets a different device");
    assert_eq!(plugin.calls().allocate, vec![vec![dev2.clone()]]);
    assert_assigned(&j, "dp-next", "main", &[&dev2]).await;
    plugin.stop().await;
    j.cleanup().await;
}

/// "will not attempt to admit the succeeded pod after the kubelet restart
/// and device plugin removed": a finished pod stays Succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_succeeded_pod_is_not_admitted_again_after_a_restart_without_the_plugin() {
    let mut j = start(Options::default()).await;
    let root = j.node.root_dir();
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    j.create_pod("dp-done", busybox_pod(&print_devices("2"), "Never", 1))
        .await;
    let dev = wait_printed(&j, "dp-done", "main").await;
    assert!(!dev.is_empty());
    j.wait_api("dp-done", T, "Succeeded", |p| phase(p) == Some("Succeeded"))
        .await;

    // The plugin goes: allocatable 0, capacity kept for the grace period.
    plugin.stop().await;
    wait_node_resource(&j, (Some("2"), Some("0"))).await;

    j.node.restart().await;
    wait_registration_socket(&root).await;
    // Upstream watches a minute; the kubelet re-admits pods at once on start.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < until {
        let p = j.api_pod("dp-done");
        let status = p.as_ref().map(|p| p["status"].to_string());
        assert_eq!(phase(p.as_ref()), Some("Succeeded"), "{status:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ev = j.pod_events("dp-done");
    assert!(
        !ev.iter().any(|(_, r, _)| r == "UnexpectedAdmissionError"),
        "the finished pod was admitted again: {ev:?}"
    );
    j.cleanup().await;
}

/// "[OrphanedPods] Ensures pods consuming devices deleted while kubelet is
/// down are cleaned up correctly": the pod's containers go and the
/// pod-resources API no longer lists a device for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_the_kubelet_is_down_loses_its_devices() {
    let mut j = start(Options::default()).await;
    let root = j.node.root_dir();
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    j.create_pod("dp-orphan", busybox_pod(&print_devices("60"), "Always", 1))
        .await;
    j.wait_api("dp-orphan", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dev = wait_printed(&j, "dp-orphan", "main").await;
    assert_assigned(&j, "dp-orphan", "main", &[&dev]).await;

    j.node.stop().await;
    force_delete(&j, "dp-orphan").await;
    assert!(j.api_pod("dp-orphan").is_none(), "deleted at once");
    j.node.start_again().await;

    let full = j.pod_name("dp-orphan");
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let left: Vec<_> = j
            .node
            .containers()
            .await
            .into_iter()
            .filter(|c| c.labels.get("io.kubernetes.pod.name") == Some(&full))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the orphaned pod's containers stay: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let l = list(&root).await;
    let a = assignment(&l, &full, "main", &[]);
    assert!(
        a.is_err(),
        "stale device assignment after the pod was deleted while the kubelet was down: {l:#?}"
    );
    plugin.stop().await;
    j.cleanup().await;
}

/// `device_manager_test.go` "should deploy pod consuming devices first but
/// fail with admission error after kubelet restart in case device plugin
/// hasn't re-registered" (and the node-reboot spec of
/// `device_plugin_test.go`): the node "reboots" (kubelet stopped, every
/// sandbox removed through CRI), the plugin does not register again, so the
/// resource reads 0 and the pod holding both devices is rejected on
/// re-admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_node_reboot_without_the_plugin_the_pod_fails_admission() {
    let mut j = start(Options::default()).await;
    let root = j.node.root_dir();
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    j.create_pod(
        "dm-reboot",
        busybox_pod("while true; do sleep 1000; done;", "Never", 2),
    )
    .await;
    j.wait_api("dm-reboot", T, "Running and Ready", |p| {
        phase(p) == Some("Running") && condition(p, "Ready")
    })
    .await;

    j.node.stop().await;
    for s in j.node.sandboxes().await {
        let _ = j.node.runtime.stop_pod_sandbox(&s.id).await;
        j.node
            .runtime
            .remove_pod_sandbox(&s.id)
            .await
            .expect("remove the sandbox through CRI");
    }
    j.node.start_again().await;

    // Registered before the restart, not since: capacity and allocatable 0.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (c, a) = super::node_resource(&j);
        let zero = |v: &Option<String>| v.as_deref().is_none_or(|v| v == "0");
        if zero(&c) && zero(&a) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "capacity {c:?}, allocatable {a:?}: want 0"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = j
        .wait_api("dm-reboot", T, "Failed", |p| phase(p) == Some("Failed"))
        .await
        .expect("pod");
    assert_eq!(
        p["status"]["reason"], "UnexpectedAdmissionError",
        "{}",
        p["status"]
    );
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(
            "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices"
        ),
        "{message}"
    );
    assert_eq!(
        message,
        format!(
            "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {RESOURCE}, which is unexpected"
        )
    );
    assert_eq!(plugin.calls().allocate.len(), 1, "{:?}", plugin.calls());
    // The node-reboot spec also expects the pod-resources API to still show
    // the device; upstream's `List` serves active pods only, and a rejected
    // pod is not active, so neither lists it (the spec is marked flaky).
    let l = list(&root).await;
    assert!(
        assignment(&l, &j.pod_name("dm-reboot"), "main", &[]).is_err(),
        "{l:#?}"
    );
    plugin.stop().await;
    j.cleanup().await;
}

/// "Can schedule a pod with a restartable init container": the init
/// container's device passes to the restartable init container after it; the
/// regular container gets the other; the pod-resources API lists the two
/// long-running containers with one device each (not the finished init
/// container).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restartable_init_container_and_a_regular_container_hold_their_own_devices() {
    if !apiserver_double::profile::Profile::from_env_or_default().at_least(28) {
        // Upstream's spec needs SidecarContainers: an apiserver before 1.28
        // drops an init container's restartPolicy.
        eprintln!("device plugin sidecar spec: not for an apiserver before 1.28");
        return;
    }
    let j = start(Options::default()).await;
    let root = j.node.root_dir();
    let plugin = start_stub(&root).await;
    wait_node_resource(&j, (Some("2"), Some("2"))).await;

    let limits = json!({"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}});
    let c = |name: &str, sleep: &str| {
        json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", print_devices(sleep)], "resources": limits})
    };
    let mut sidecar = c("restartable-init-2", "24h");
    sidecar["restartPolicy"] = json!("Always");
    j.create_pod(
        "dp-sidecar",
        json!({
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Always",
            "initContainers": [c("init-1", "1"), sidecar],
            "containers": [c("regular-1", "24h")],
        }),
    )
    .await;
    j.wait_api("dp-sidecar", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let dev1 = wait_printed(&j, "dp-sidecar", "init-1").await;
    let dev2 = wait_printed(&j, "dp-sidecar", "restartable-init-2").await;
    assert_eq!(
        dev2, dev1,
        "the init container's device passes to the sidecar"
    );
    let dev3 = wait_printed(&j, "dp-sidecar", "regular-1").await;
    assert_ne!(
        dev3, dev2,
        "the sidecar and the regular container share no device"
    );

    let l = list(&root).await;
    let full = j.pod_name("dp-sidecar");
    let ours = l
        .iter()
        .find(|p| p.name == full && p.namespace == "default")
        .unwrap_or_else(|| panic!("{full} not listed: {l:#?}"));
    let mut names: Vec<&str> = ours.containers.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["regular-1", "restartable-init-2"], "{ours:#?}");
    for c in &ours.containers {
        assert_eq!(c.devices.len(), 1, "{c:#?}");
        assert_eq!(c.devices[0].resource_name, RESOURCE);
        assert_eq!(c.devices[0].device_ids.len(), 1, "{c:#?}");
    }
    assert_eq!(
        assignment(&l, &full, "restartable-init-2", &[&dev2]),
        Ok(true)
    );
    assert_eq!(assignment(&l, &full, "regular-1", &[&dev3]), Ok(true));
    plugin.stop().await;
    j.cleanup().await;
}
