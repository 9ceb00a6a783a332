//! Cluster mode on real containerd against the apiserver double: TLS
//! bootstrap to a registered Node, pods bound to the node running and
//! reported, graceful deletion confirmed, mirror pods, an apiserver outage,
//! and golden snapshots of the Node and a running pod's status.

use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kubelet_rs_integration::cluster::{Joined, condition, phase, sleeper};
use kubelet_rs_integration::{BUSYBOX, pod_yaml};
use serde_json::Value;

const RUN: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn running_and_ready(p: Option<&Value>) -> bool {
    phase(p) == Some("Running") && condition(p, "Ready")
}

fn container_id(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Replaces what differs between machines and runs, keeping every key.
fn normalize(v: &mut Value, node: &str) {
    const VOLATILE: &[&str] = &[
        "uid",
        // The control plane's version on older ones (asserted on its own).
        "kubeletVersion",
        "resourceVersion",
        "creationTimestamp",
        "lastHeartbeatTime",
        "lastTransitionTime",
        "startTime",
        "startedAt",
        "finishedAt",
        "machineID",
        "systemUUID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "containerID",
        "imageID",
        "podIP",
        "hostIP",
        "ip",
        "address",
        "cpu",
        "memory",
        "ephemeral-storage",
        "images",
        "Port",
    ];
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if VOLATILE.contains(&k.as_str()) || k.starts_with("hugepages-") {
                    *x = Value::String(format!("<{k}>"));
                } else {
                    normalize(x, node);
                }
            }
        }
        Value::Array(l) => l.iter_mut().for_each(|x| normalize(x, node)),
        Value::String(s) if s.contains(node) => *s = s.replace(node, "<node>"),
        _ => {}
    }
}

/// Compares with `tests/golden/<file>`; `UPDATE_GOLDEN=1` rewrites it.
/// The goldens are the newest release's; `dropped` are the fields the
/// double's release drops from what the kubelet sends.
fn golden(file: &str, mut v: Value, node: &str, dropped: &[&str]) {
    normalize(&mut v, node);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(file);
    let text = serde_json::to_string_pretty(&v).expect("json") + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).expect("write golden");
        return;
    }
    let want =
        std::fs::read_to_string(&path).expect("golden file (run with UPDATE_GOLDEN=1 to create)");
    let mut want: Value = serde_json::from_str(&want).expect("golden json");
    for f in dropped {
        if let Some(o) = want.as_object_mut() {
            o.remove(*f);
        }
    }
    assert_eq!(
        v, want,
        "{file} differs from the golden shape; got:\n{text}"
    );
}

#[tokio::test]
async fn bootstrap_register_run_report_and_confirm_deletion() -> anyhow::Result<()> {
    let j = Joined::start(Options::default()).await;
    let node = j.node.name.clone();
    // TLS bootstrap -> registered, Ready Node, lease, approved kubelet CSR.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !j.api.get("nodes", "", &node).is_some_and(|n| {
        n["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    }) {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "node {node} not registered and Ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Issue 28: never a kubelet newer than its apiserver (the skew policy):
    // a 1.19 control plane sees a 1.19 kubelet, a 1.35 one kubelet-rs's own
    // version.
    let n = j.api.get("nodes", "", &node).expect("node");
    let want = j.api.profile().git_version();
    assert_eq!(n["status"]["nodeInfo"]["kubeletVersion"], want, "{n}");
    let csr = j
        .api
        .list("certificatesigningrequests")
        .pop()
        .expect("bootstrap CSR");
    assert!(csr["status"]["certificate"].is_string(), "issued");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while j.api.get("leases", "kube-node-lease", &node).is_none() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no lease");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lease = j
        .api
        .get("leases", "kube-node-lease", &node)
        .expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], node.as_str());
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);

    // A pod bound to the node runs on containerd and is reported.
    j.create_pod("web", sleeper(RUN)).await;
    let p = j
        .wait_api(
            "web",
            Duration::from_secs(90),
            "running and ready",
            running_and_ready,
        )
        .await
        .expect("pod");
    let st = &p["status"];
    assert!(
        st["podIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.88.")),
        "pod IP from the bridge: {st}"
    );
    assert_eq!(st["podIPs"][0]["ip"], st["podIP"]);
    assert!(st["hostIP"].is_string());
    assert_eq!(st["qosClass"], "BestEffort");
    let cid = container_id(&p);
    let id = cid
        .strip_prefix("containerd://")
        .expect("containerd:// container ID");
    let live = j.node.containers().await;
    assert!(
        live.iter()
            .any(|c| c.id == id && c.state == cri::pb::ContainerState::ContainerRunning as i32),
        "the reported container runs in containerd"
    );
    let reasons: Vec<String> = j
        .api
        .list("events")
        .iter()
        .filter(|e| e["involvedObject"]["name"] == j.pod_name("web").as_str())
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect();
    for r in ["Pulled", "Created", "Started"] {
        assert!(
            reasons.iter().any(|x| x == r),
            "event {r} recorded: {reasons:?}"
        );
    }
    let node_obj = j.api.get("nodes", "", &node).expect("node");
    // The kubelet endpoint is the node API's port (random in tests).
    let port = j.node.handle().server_addr.map(|a| a.port());
    assert_eq!(
        node_obj
            .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
            .and_then(Value::as_u64),
        port.map(u64::from)
    );
    golden("node.json", node_obj, &node, &[]);
    // A 1.19 apiserver drops status.hostIPs (1.28+; docs/apiserver-versions.md §5).
    let dropped: &[&str] = if j.api.profile().at_least(28) {
        &[]
    } else {
        &["hostIPs"]
    };
    golden("pod-status.json", p["status"].clone(), &node, dropped);

    // Deleting the pod stops its containers, then the kubelet deletes the object (grace 0).
    Api::<Pod>::namespaced(j.admin.clone(), "default")
        .delete(&j.pod_name("web"), &Default::default())
        .await?;
    j.wait_api("web", Duration::from_secs(60), "deleted", |p| p.is_none())
        .await;
    let after = j.node.containers().await;
    assert!(
        !after
            .iter()
            .any(|c| c.id == id && c.state == cri::pb::ContainerState::ContainerRunning as i32),
        "container stopped"
    );
    let confirm = j.api.requests().into_iter().find(|r| {
        r.method == "DELETE"
            && r.path.ends_with(&j.pod_name("web"))
            && r.user.as_deref() == Some(&format!("system:node:{node}"))
    });
    assert!(confirm.is_some(), "the kubelet confirmed the deletion");
    j.cleanup().await;
    Ok(())
}

#[tokio::test]
async fn static_pods_get_mirror_pods_that_come_back_and_go_away() -> anyhow::Result<()> {
    let j = Joined::start(Options::default()).await;
    j.node
        .write_manifest("mirror.yaml", &pod_yaml("mirror", "Always", BUSYBOX, RUN));
    let m = j
        .wait_api(
            "mirror",
            Duration::from_secs(90),
            "mirrored and running",
            |p| {
                p.is_some_and(|p| {
                    p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string()
                }) && running_and_ready(p)
            },
        )
        .await
        .expect("mirror");
    let hash = m["metadata"]["annotations"]["kubernetes.io/config.hash"].clone();
    assert_eq!(
        m["metadata"]["annotations"]["kubernetes.io/config.mirror"],
        hash
    );
    assert_eq!(m["metadata"]["ownerReferences"][0]["kind"], "Node");
    let first_uid = m["metadata"]["uid"].clone();
    let cid = container_id(&m);

    Api::<Pod>::namespaced(j.admin.clone(), "default")
        .delete(&j.pod_name("mirror"), &Default::default())
        .await?;
    let again = j
        .wait_api("mirror", Duration::from_secs(30), "recreated", |p| {
            p.is_some_and(|p| {
                p["metadata"]["uid"] != first_uid && p["metadata"]["deletionTimestamp"].is_null()
            })
        })
        .await
        .expect("mirror again");
    let again = j
        .wait_api("mirror", Duration::from_secs(30), "reported", |p| {
            running_and_ready(p)
        })
        .await
        .unwrap_or(again);
    assert_eq!(
        container_id(&again),
        cid,
        "deleting the mirror pod does not touch the static pod"
    );

    j.node.remove_manifest("mirror.yaml");
    j.wait_api(
        "mirror",
        Duration::from_secs(30),
        "deleted with its manifest",
        |p| p.is_none(),
    )
    .await;
    j.cleanup().await;
    Ok(())
}

#[tokio::test]
async fn an_apiserver_outage_restarts_nothing_and_status_catches_up() -> anyhow::Result<()> {
    let j = Joined::start(Options::default()).await;
    j.create_pod("steady", sleeper(RUN)).await;
    let mut finisher = sleeper("sleep 15");
    finisher["restartPolicy"] = "Never".into();
    j.create_pod("finisher", finisher).await;
    let steady = j
        .wait_api(
            "steady",
            Duration::from_secs(90),
            "running",
            running_and_ready,
        )
        .await
        .expect("steady");
    j.wait_api(
        "finisher",
        Duration::from_secs(60),
        "running",
        running_and_ready,
    )
    .await;
    let cid = container_id(&steady);

    j.api.set_up(false);
    tokio::time::sleep(Duration::from_secs(60)).await;
    // The kubelet saw the finisher complete while nobody could hear it.
    let local = j
        .node
        .handle()
        .status
        .uids()
        .into_iter()
        .filter_map(|u| j.node.handle().status.get_pod_status(&u));
    assert!(
        local
            .into_iter()
            .any(|s| s.phase.as_deref() == Some("Succeeded")),
        "finished locally during the outage"
    );
    assert_eq!(
        phase(j.api_pod("finisher").as_ref()),
        Some("Running"),
        "the apiserver has not heard yet"
    );
    j.api.set_up(true);

    j.wait_api(
        "finisher",
        Duration::from_secs(60),
        "Succeeded in the API",
        |p| phase(p) == Some("Succeeded"),
    )
    .await;
    let steady = j.api_pod("steady").expect("steady");
    assert_eq!(container_id(&steady), cid, "no container restarted");
    assert_eq!(steady["status"]["containerStatuses"][0]["restartCount"], 0);
    assert!(running_and_ready(Some(&steady)));
    j.cleanup().await;
    Ok(())
}
