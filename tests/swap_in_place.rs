//! Swapping kubelets in place (issue 21): containers written by an upstream
//! kubelet are adopted or restarted as an upstream upgrade would.
//!
//! The test plays the upstream kubelet itself: with kubelet-rs stopped, it
//! builds a pod's sandbox and containers through CRI from upstream's rules
//! (`pkg/kubelet/kuberuntime/labels.go`, `kuberuntime_sandbox.go`,
//! `kuberuntime_container.go`, `pkg/kubelet/container/helpers.go`), with the
//! hashes computed here, independently of `kubelet_types::hash`. Then
//! kubelet-rs starts and must adopt the container carrying the 1.31+ hash as
//! it runs, and restart once the one carrying a pre-1.31 (whole container)
//! hash, saying so in its log with a count. Going back, a container
//! kubelet-rs creates must carry what upstream 1.31+ writes, so an upstream
//! kubelet adopts it in turn.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use apiserver_double::Options;
use cri::{RemoteRuntime, RuntimeService, pb};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, condition};
use parking_lot::Mutex;
use serde_json::{Value, json};

#[path = "swap_in_place/upstream.rs"]
mod upstream;

use upstream::{
    hash_1_31, log_dir, meta, start_as_upstream, upstream_container_annotations,
    upstream_container_labels, upstream_sandbox_annotations, upstream_sandbox_labels,
};

// === log capture ===

/// Everything the kubelet logs, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

// === the test ===

const SLEEP: &str = "sleep 3600";

fn container_spec(name: &str, ports: Option<Value>) -> Value {
    let mut c = json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", SLEEP]});
    if let Some(p) = ports {
        c["ports"] = p;
    }
    c
}

/// Creates pod `name` bound to the node with labels and annotations (the
/// double defaults it as the apiserver does) and returns the stored object.
async fn create_pod(j: &Joined, name: &str, containers: Vec<Value>) -> anyhow::Result<Value> {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": j.pod_name(name), "namespace": "default",
            "labels": {"app": "swap-in-place"},
            "annotations": {"example.com/owner": "swap-test"}},
        "spec": {"nodeName": j.node.name, "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": false, "containers": containers},
    }))?;
    Api::<Pod>::namespaced(j.admin.clone(), "default")
        .create(&PostParams::default(), &p)
        .await?;
    j.api_pod(name).context("stored pod")
}

/// `(containerID without the runtime prefix, restartCount, running)` of
/// container `c` in the stored pod's status.
fn api_container(p: &Value, c: &str) -> Option<(String, i64, bool)> {
    let s = p["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == c)?;
    let id = s["containerID"].as_str()?.rsplit("://").next()?.to_string();
    Some((
        id,
        s["restartCount"].as_i64().unwrap_or(-1),
        s["state"]["running"].is_object(),
    ))
}

async fn wait_api(
    j: &Joined,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(p) = j.api_pod(name).filter(|p| pred(p)) {
            return Ok(p);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "pod {name}: not {what}; last: {:#}",
                j.api_pod(name).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sandboxes and containers of the pod `uid` in the runtime.
async fn runtime_of(
    rt: &RemoteRuntime,
    uid: &str,
) -> anyhow::Result<(Vec<pb::PodSandbox>, Vec<pb::Container>)> {
    let of = |l: &HashMap<String, String>| {
        l.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid)
    };
    let sandboxes = rt.list_pod_sandbox(None).await?;
    let containers = rt.list_containers(None).await?;
    Ok((
        sandboxes.into_iter().filter(|s| of(&s.labels)).collect(),
        containers.into_iter().filter(|c| of(&c.labels)).collect(),
    ))
}

fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Going back: the container and sandbox kubelet-rs created for `p` carry
/// what upstream 1.31+ writes. Keys compared (upstream
/// `pkg/kubelet/kuberuntime/labels.go`, and `pkg/kubelet/config/config.go`
/// for the two config annotations):
/// - sandbox labels: the pod's labels, `io.kubernetes.pod.name`,
///   `io.kubernetes.pod.namespace`, `io.kubernetes.pod.uid`;
/// - sandbox annotations: the pod's annotations, `kubernetes.io/config.source`,
///   `kubernetes.io/config.seen` (a time: key only);
/// - container labels: `io.kubernetes.pod.name`, `io.kubernetes.pod.namespace`,
///   `io.kubernetes.pod.uid`, `io.kubernetes.container.name`;
/// - container annotations: `io.kubernetes.container.hash` (the 1.31+ hash
///   computed here), `io.kubernetes.container.restartCount`,
///   `io.kubernetes.container.terminationMessagePath`,
///   `io.kubernetes.container.terminationMessagePolicy`,
///   `io.kubernetes.pod.terminationGracePeriod`, `io.kubernetes.container.ports`
///   (as JSON); kubelet-rs' own `io.kubelet-rs.container.hashVersion` is
///   the only key allowed beyond them.
/// - log path `<container>/<restartCount>.log`, sandbox log directory
///   `<podLogsDir>/<ns>_<name>_<uid>`.
async fn check_going_back(rt: &RemoteRuntime, p: &Value) -> anyhow::Result<()> {
    let uid = meta(p, "uid");
    let (sandboxes, containers) = runtime_of(rt, &uid).await?;
    ensure!(sandboxes.len() == 1, "one sandbox: {sandboxes:?}");
    let sb = &sandboxes[0];
    ensure!(
        sorted(&sb.labels) == upstream_sandbox_labels(p),
        "sandbox labels {:?}, upstream {:?}",
        sorted(&sb.labels),
        upstream_sandbox_labels(p)
    );
    let mut ann = sorted(&sb.annotations);
    let seen = ann
        .get("kubernetes.io/config.seen")
        .cloned()
        .unwrap_or_default();
    ensure!(
        !seen.is_empty(),
        "sandbox annotations lack config.seen: {ann:?}"
    );
    ensure!(
        ann == upstream_sandbox_annotations(p, &seen),
        "sandbox annotations {ann:?}"
    );
    let sb_status = rt.pod_sandbox_status(&sb.id).await?;
    ensure!(
        sb_status.state == pb::PodSandboxState::SandboxReady as i32,
        "sandbox not ready"
    );
    for c in p["spec"]["containers"].as_array().context("containers")? {
        let name = c["name"].as_str().context("name")?;
        let got = containers
            .iter()
            .find(|x| {
                x.labels
                    .get("io.kubernetes.container.name")
                    .map(String::as_str)
                    == Some(name)
            })
            .with_context(|| format!("container {name} in the runtime"))?;
        ensure!(
            sorted(&got.labels) == upstream_container_labels(p, c),
            "container {name} labels {:?}",
            got.labels
        );
        let image = c["image"].as_str().unwrap_or_default();
        let want = upstream_container_annotations(p, c, &hash_1_31(name, image));
        ann = sorted(&got.annotations);
        let version = ann.remove("io.kubelet-rs.container.hashVersion");
        ensure!(version.is_some(), "kubelet-rs writes its hash version");
        let ports_key = "io.kubernetes.container.ports";
        let as_json = |m: &BTreeMap<String, String>| -> Value {
            m.get(ports_key)
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or(Value::Null)
        };
        ensure!(
            as_json(&ann) == as_json(&want),
            "container {name} ports annotation {:?}, upstream {:?}",
            ann.get(ports_key),
            want.get(ports_key)
        );
        let same_keys = ann.contains_key(ports_key) == want.contains_key(ports_key);
        let without_ports = |m: &BTreeMap<String, String>| {
            let mut m = m.clone();
            m.remove(ports_key);
            m
        };
        ensure!(
            same_keys && without_ports(&ann) == without_ports(&want),
            "container {name} annotations {ann:?}, upstream 1.31+ {want:?}"
        );
        let st = rt.container_status(&got.id).await?;
        ensure!(
            st.log_path == log_dir(p).join(format!("{name}/0.log")).to_string_lossy(),
            "log path {}",
            st.log_path
        );
    }
    Ok(())
}

fn events(j: &Joined, pod: &str, reason: &str) -> Vec<String> {
    j.pod_events(pod)
        .into_iter()
        .filter(|(_, r, _)| r == reason)
        .map(|(_, _, m)| m)
        .collect()
}

async fn swap(j: &mut Joined, logs: &Captured, uids: &mut Vec<Value>) -> anyhow::Result<()> {
    let rt = kubelet_rs_integration::require_runtime().await;

    // Swap in: kubelet-rs is stopped while "the upstream kubelet" runs a pod.
    // This comes first: kubelet-rs counts as foreign only containers created
    // before it first decided about a pod in this process, and the test runs
    // every kubelet in one process.
    j.node.stop().await;
    let pod = create_pod(
        j,
        "swap",
        vec![container_spec("adopt", None), container_spec("old", None)],
    )
    .await?;
    uids.push(pod.clone());
    let (sandbox_id, ids) = start_as_upstream(&rt, &pod, &["old"]).await?;
    let restarted_before = kubelet_runtime::foreign_restarts::restarted_so_far();
    j.node.start_again().await;

    let adopted = ids["adopt"].clone();
    let old = ids["old"].clone();
    wait_api(j, "swap", "Ready with old restarted", |p| {
        condition(Some(p), "Ready")
            && api_container(p, "adopt").is_some_and(|(_, _, run)| run)
            && api_container(p, "old").is_some_and(|(_, n, run)| n == 1 && run)
    })
    .await?;
    let uid = meta(&pod, "uid");
    let mut replaced: Option<String> = None;
    // Stable for 15 s after Ready.
    for _ in 0..15 {
        let p = j.api_pod("swap").context("pod")?;
        let (a_id, a_n, a_run) = api_container(&p, "adopt").context("adopt status")?;
        ensure!(
            a_id == adopted && a_n == 0 && a_run,
            "adopt was replaced: {a_id} {a_n} (ours {adopted})"
        );
        let (o_id, o_n, o_run) = api_container(&p, "old").context("old status")?;
        ensure!(
            o_id != old && o_n == 1 && o_run,
            "old: {o_id} restartCount {o_n} running {o_run}"
        );
        ensure!(
            replaced.get_or_insert(o_id.clone()) == &o_id,
            "old restarted again: {o_id}"
        );
        ensure!(condition(Some(&p), "Ready"), "pod not Ready");
        let (sandboxes, containers) = runtime_of(&rt, &uid).await?;
        let ids: Vec<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        ensure!(
            ids == [sandbox_id.as_str()],
            "sandboxes {ids:?}, ours {sandbox_id}"
        );
        ensure!(
            sandboxes[0].state == pb::PodSandboxState::SandboxReady as i32,
            "our sandbox is not ready"
        );
        let running = containers
            .iter()
            .filter(|c| c.state == pb::ContainerState::ContainerRunning as i32)
            .count();
        ensure!(running == 2, "running containers: {containers:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let killing = events(j, "swap", "Killing");
    ensure!(
        killing == ["Container old definition changed, will be restarted"],
        "Killing events {killing:?}"
    );
    ensure!(
        events(j, "swap", "SandboxChanged").is_empty(),
        "sandbox changed"
    );
    let text = logs.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(kubelet_runtime::foreign_restarts::MESSAGE))
        .collect();
    ensure!(lines.len() == 1, "log lines: {lines:#?}");
    ensure!(
        lines[0].contains(&format!("restarted_so_far={}", restarted_before + 1))
            && lines[0].contains("container=old")
            && lines[0].contains(&uid),
        "log line {}",
        lines[0]
    );
    println!("kubelet-rs logged: {}", lines[0]);
    ensure!(
        kubelet_runtime::foreign_restarts::restarted_so_far() == restarted_before + 1,
        "count"
    );
    // The restarted container is kubelet-rs' own now, as an upstream kubelet
    // would write it.
    let (_, containers) = runtime_of(&rt, &uid).await?;
    let new_old = containers
        .iter()
        .find(|c| Some(&c.id) == replaced.as_ref())
        .context("new old")?;
    ensure!(
        new_old
            .annotations
            .get("io.kubernetes.container.hash")
            .map(String::as_str)
            == Some(hash_1_31("old", BUSYBOX).as_str())
            && new_old
                .annotations
                .get("io.kubernetes.container.restartCount")
                .map(String::as_str)
                == Some("1"),
        "restarted container annotations {:?}",
        new_old.annotations
    );

    // Going back: what kubelet-rs creates, an upstream kubelet adopts.
    let ports = json!([{"name": "http", "containerPort": 8080}]);
    let native = create_pod(j, "native", vec![container_spec("main", Some(ports))]).await?;
    uids.push(native.clone());
    let native = wait_api(j, "native", "Ready", |p| condition(Some(p), "Ready")).await?;
    check_going_back(&rt, &native).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_containers_are_adopted_and_pre_1_31_ones_restarted_once() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init()
        .expect("the test's log capture is the first subscriber");
    let mut j = Joined::start(Options::default()).await;
    let mut pods = vec![];
    let result = swap(&mut j, &logs, &mut pods).await;
    if result.is_err() {
        let text = logs.text();
        let tail: Vec<&str> = text.lines().rev().take(80).collect();
        eprintln!(
            "kubelet log tail:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    j.cleanup().await;
    for p in &pods {
        let _ = std::fs::remove_dir_all(log_dir(p));
    }
    result.expect("swap in place");
}
