//! Issue 20 fault case: containerd restarts under running pods (upstream:
//! the kubelet keeps its pods across a runtime restart; `updateRuntimeUp`
//! counts the runtime down after 30 s without a ready answer, the Ready
//! condition then says `container runtime is down`, and the node is Ready
//! again once the runtime answers).
//!
//! Three pods run (one with a readiness probe, one whose container exits
//! when the test says so); containerd is stopped the way
//! `deploy/setup-runtime.sh` runs it, kept down until the node reports the
//! runtime down, and started again. Then: no container restarted, no new
//! sandbox, the node Ready within 10 s of containerd answering `Version`,
//! and a container exit after the restart reaches the pod's status.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use apiserver_double::Options;
use cri::{RemoteRuntime, RuntimeService};
use kubelet_rs_integration::cluster::{Joined, condition, phase, sleeper};
use kubelet_rs_integration::{Node, endpoint};
use serde_json::{Value, json};
use tokio::time::Instant;

/// How long the node may take to be Ready again once containerd answers
/// (the bound).
const READY_AGAIN_WITHIN: Duration = Duration::from_secs(10);

fn setup_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/setup-runtime.sh")
}

fn run_setup(mode: &str) -> bool {
    Command::new("bash")
        .arg(setup_script())
        .arg(mode)
        .status()
        .is_ok_and(|s| s.success())
}

/// containerd stopped by this test: started again when dropped, whatever
/// happened (every later test needs it).
struct ContainerdStopped {
    started: bool,
}

impl ContainerdStopped {
    fn stop() -> Self {
        // The script stops and starts the main containerd: lane 1's.
        assert_eq!(
            kubelet_rs_integration::lane::lane().number,
            1,
            "fault_containerd_restart runs in lane 1 only (hack/test.sh)"
        );
        let guard = ContainerdStopped { started: false };
        assert!(run_setup("--stop-containerd"), "containerd stops");
        guard
    }

    fn start(&mut self) {
        self.started = true;
        assert!(run_setup("--start-containerd"), "containerd starts again");
    }
}

impl Drop for ContainerdStopped {
    fn drop(&mut self) {
        if !self.started {
            self.started = true;
            if !run_setup("--start-containerd") {
                eprintln!("containerd did not start again: run deploy/setup-runtime.sh");
            }
        }
    }
}

/// Sandbox IDs and container IDs of each pod (by full name), any state.
async fn runtime_ids(node: &Node) -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for s in node.sandboxes().await {
        let name = s.labels["io.kubernetes.pod.name"].clone();
        out.entry(name).or_default().0.insert(s.id);
    }
    for c in node.containers().await {
        let name = c.labels["io.kubernetes.pod.name"].clone();
        out.entry(name).or_default().1.insert(c.id);
    }
    out
}

/// `(containerID, restartCount)` of every container in a stored pod.
fn container_states(p: &Value) -> Vec<(String, i64)> {
    p["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["containerID"].as_str().unwrap_or("").to_string(),
                c["restartCount"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

async fn node_ready_is(j: &Joined, want: &str, timeout: Duration) -> (String, String, String) {
    let deadline = Instant::now() + timeout;
    loop {
        let c = j.node_condition("Ready");
        if let Some(c) = &c
            && c.0 == want
        {
            return c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "node Ready condition not {want} within {timeout:?}; last: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_restart_keeps_pods_and_the_node_is_ready_again() {
    let j = Joined::start(Options::default()).await;
    let go = j.node.dir.path().join("go");
    std::fs::create_dir_all(&go).expect("hostPath dir");

    let mut probed = sleeper("sleep 3600");
    probed["containers"][0]["readinessProbe"] =
        json!({"exec": {"command": ["true"]}, "periodSeconds": 1});
    j.create_pod("probed", probed).await;
    j.create_pod("plain", sleeper("sleep 3600")).await;
    // Exits with 3 once the test creates go/exit (after the restart).
    let mut exits = sleeper("until [ -e /go/exit ]; do sleep 0.2; done; exit 3");
    exits["restartPolicy"] = json!("Never");
    exits["containers"][0]["volumeMounts"] = json!([{"name": "go", "mountPath": "/go"}]);
    exits["volumes"] = json!([{"name": "go", "hostPath": {"path": go.display().to_string(), "type": "Directory"}}]);
    j.create_pod("exits", exits).await;

    let t = Duration::from_secs(90);
    j.wait_api("probed", t, "Ready", |p| condition(p, "Ready"))
        .await;
    for name in ["plain", "exits"] {
        j.wait_api(name, t, "Running with its container started", |p| {
            phase(p) == Some("Running") && condition(p, "ContainersReady")
        })
        .await;
    }
    node_ready_is(&j, "True", t).await;
    let names = ["probed", "plain", "exits"];
    let before_ids = runtime_ids(&j.node).await;
    let before: BTreeMap<&str, Vec<(String, i64)>> = names
        .iter()
        .map(|n| (*n, container_states(&j.api_pod(n).expect("pod"))))
        .collect();
    for n in names {
        let ids = &before_ids[&j.pod_name(n)];
        assert_eq!((ids.0.len(), ids.1.len()), (1, 1), "{n}: {ids:?}");
    }

    // containerd down until the node says so (upstream: 30 s without a
    // ready answer, then the next node status).
    let mut containerd = ContainerdStopped::stop();
    let stopped = Instant::now();
    let down = node_ready_is(&j, "False", Duration::from_secs(90)).await;
    eprintln!(
        "node NotReady {:?} after containerd stopped: {down:?}",
        stopped.elapsed()
    );
    assert!(
        down.2.contains("container runtime is down"),
        "upstream's message: {down:?}"
    );

    containerd.start();
    // The moment containerd answers Version again, on a fresh connection.
    let probe = RemoteRuntime::new(endpoint(), None, Duration::from_secs(2)).expect("CRI client");
    let answer_deadline = Instant::now() + Duration::from_secs(30);
    while probe.version().await.is_err() {
        assert!(Instant::now() < answer_deadline, "containerd answers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let back = Instant::now();
    node_ready_is(&j, "True", Duration::from_secs(60)).await;
    let ready_after = back.elapsed();
    eprintln!("node Ready {ready_after:?} after containerd answered Version");
    assert!(
        ready_after <= READY_AGAIN_WITHIN,
        "node Ready {ready_after:?} after containerd's return (at most {READY_AGAIN_WITHIN:?})"
    );

    // Same sandboxes and containers, nothing restarted.
    assert_eq!(
        runtime_ids(&j.node).await,
        before_ids,
        "no new sandbox or container"
    );
    for n in names {
        let p = j
            .wait_api(n, Duration::from_secs(30), "Running", |p| {
                phase(p) == Some("Running")
            })
            .await
            .expect("pod");
        assert_eq!(
            container_states(&p),
            before[n],
            "{n}: same container, no restart"
        );
    }
    j.wait_api("probed", t, "Ready", |p| condition(p, "Ready"))
        .await;

    // PLEG and status caught up: an exit now reaches the pod's status.
    std::fs::write(go.join("exit"), "").expect("signal the container");
    let p = j
        .wait_api(
            "exits",
            Duration::from_secs(30),
            "Failed with exit code 3",
            |p| phase(p) == Some("Failed"),
        )
        .await
        .expect("pod");
    let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["exitCode"], 3, "{p:#}");
    assert_eq!(
        p["status"]["containerStatuses"][0]["containerID"].as_str(),
        Some(before["exits"][0].0.as_str()),
        "the same container exited"
    );
    let after = runtime_ids(&j.node).await;
    for n in names {
        assert_eq!(
            after[&j.pod_name(n)].0,
            before_ids[&j.pod_name(n)].0,
            "{n}: one sandbox"
        );
    }
    drop(containerd);
    j.cleanup().await;
}
