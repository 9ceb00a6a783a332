//! Pod admission on real containerd through the apiserver double: each
//! refusal fails the pod with upstream's reason and `Pod was rejected: ...`,
//! records a Warning event, and runs nothing; safe sysctls (also written with
//! slashes) reach the pod. Reproduces upstream's Sysctls specs
//! (`test/e2e/common/node/sysctl.go`: "should support sysctls", "should
//! support sysctls with slashes as separator", "should not launch unsafe, but
//! not explicitly enabled sysctls on the node").

use std::time::Duration;

use apiserver_double::Options;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, phase};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

fn busybox(cmd: &str) -> Value {
    json!({"name": "test-container", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", cmd]})
}

fn spec(containers: Value, extra: Value) -> Value {
    let mut s = json!({"terminationGracePeriodSeconds": 1, "restartPolicy": "Never", "containers": containers});
    if let (Some(s), Some(e)) = (s.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    s
}

async fn expect_rejected(j: &Joined, name: &str, reason: &str, message: &str) {
    let p = j
        .wait_api(name, T, "rejected", |p| phase(p) == Some("Failed"))
        .await
        .expect("pod");
    assert_eq!(p["status"]["reason"], reason, "{name}: {}", p["status"]);
    assert_eq!(
        p["status"]["message"],
        format!("Pod was rejected: {message}"),
        "{name}"
    );
    let want = |t: &str, r: &str, m: &str| t == "Warning" && r == reason && m == message;
    let ev = j.wait_pod_event(name, T, want).await;
    assert!(
        ev.iter().any(|(t, r, m)| want(t, r, m)),
        "{name}: no Warning {reason} event: {ev:?}"
    );
    let full = j.pod_name(name);
    assert!(
        !j.node
            .sandboxes()
            .await
            .iter()
            .any(|s| s.labels.get("io.kubernetes.pod.name") == Some(&full)),
        "{name}: a rejected pod gets no sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_pods_fail_with_upstreams_reasons_and_safe_sysctls_apply() {
    let j = Joined::start(Options::default()).await;
    let sleeper = || json!([busybox("sleep 3600")]);
    // Upstream "should support sysctls" and "... with slashes as separator".
    j.create_pod(
        "sysctl-safe",
        spec(
            json!([busybox(
                "sysctl kernel.shm_rmid_forced; sysctl net.ipv4.ip_local_port_range"
            )]),
            json!({"securityContext": {"sysctls": [
                {"name": "kernel.shm_rmid_forced", "value": "1"},
                {"name": "net/ipv4/ip_local_port_range", "value": "32768 60999"}]}}),
        ),
    )
    .await;
    // Upstream "should not launch unsafe, but not explicitly enabled sysctls on the node".
    j.create_pod(
        "sysctl-unsafe",
        spec(
            sleeper(),
            json!({"securityContext": {"sysctls": [
                {"name": "kernel.shm_rmid_forced", "value": "1"},
                {"name": "kernel.msgmax", "value": "10000000000"}]}}),
        ),
    )
    .await;
    j.create_pod(
        "too-much-cpu",
        spec(
            json!([{"name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "1000"}}}]),
            json!({}),
        ),
    )
    .await;
    j.create_pod(
        "wrong-node",
        spec(
            sleeper(),
            json!({"nodeSelector": {"kubelet-rs.test/absent": "yes"}}),
        ),
    )
    .await;
    let ported = |name: &str| {
        spec(
            json!([{"name": name, "image": BUSYBOX, "command": ["sleep", "3600"],
                    "ports": [{"containerPort": 39123, "hostPort": 39123}]}]),
            json!({"hostNetwork": true}),
        )
    };
    j.create_pod("port-a", ported("a")).await;
    j.wait_api("port-a", T, "running", |p| phase(p) == Some("Running"))
        .await;
    j.create_pod("port-b", ported("b")).await;

    expect_rejected(
        &j,
        "sysctl-unsafe",
        "SysctlForbidden",
        "forbidden sysctl: \"kernel.msgmax\" not allowlisted",
    )
    .await;
    let p = j
        .wait_api("too-much-cpu", T, "rejected", |p| {
            phase(p) == Some("Failed")
        })
        .await
        .expect("pod");
    assert_eq!(p["status"]["reason"], "OutOfcpu");
    assert!(
        p["status"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: ")),
        "{}",
        p["status"]
    );
    expect_rejected(
        &j,
        "wrong-node",
        "NodeAffinity",
        "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
    )
    .await;
    expect_rejected(
        &j,
        "port-b",
        "NodePorts",
        "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
    )
    .await;

    let p = j
        .wait_api("sysctl-safe", T, "succeeded", |p| {
            phase(p) == Some("Succeeded")
        })
        .await
        .expect("pod");
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let log_dir = kubelet_rs_integration::pod_logs_dir()
        .join(format!("default_{}_{uid}", j.pod_name("sysctl-safe")))
        .join("test-container/0.log");
    let log = std::fs::read_to_string(&log_dir).expect("log");
    assert!(log.contains("kernel.shm_rmid_forced = 1"), "{log}");
    assert!(
        log.contains("net.ipv4.ip_local_port_range = 32768\t60999")
            || log.contains("net.ipv4.ip_local_port_range = 32768 60999"),
        "{log}"
    );
    j.cleanup().await;
}
