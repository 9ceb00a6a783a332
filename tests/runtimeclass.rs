//! RuntimeClass on real containerd through the apiserver double (upstream
//! `test/e2e/common/node/runtimeclass.go` where one node can show it): a
//! pod naming a RuntimeClass runs with the class's handler as the CRI
//! runtime handler; an unknown class or an unconfigured handler never gets a
//! sandbox and the pod waits with `FailedCreatePodSandBox`; an apiserver that
//! serves `node.k8s.io/v1beta1` only (1.19) is read through that version.
//!
//! The double has no RuntimeClass admission plugin: upstream's "should
//! reject a Pod requesting a non-existent RuntimeClass" is refused by the
//! apiserver before the kubelet sees it, so here the kubelet's own refusal
//! (a pod bound directly, as a static or pre-bound pod would be) is tested.

use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::PostParams;
use kubelet_rs_integration::cluster::{Joined, sleeper};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

/// Creates a RuntimeClass through the version the double's release serves
/// (`node.k8s.io/v1` from 1.20, `v1beta1` before).
async fn runtime_class(j: &Joined, name: &str, handler: &str) {
    if !j.api.profile().at_least(20) {
        return runtime_class_v1beta1(j, name, handler).await;
    }
    let rc: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": name}, "handler": handler
    }))
    .expect("runtimeclass");
    Api::<RuntimeClass>::all(j.admin.clone())
        .create(&PostParams::default(), &rc)
        .await
        .expect("create runtimeclass");
}

/// Creates a `node.k8s.io/v1beta1` RuntimeClass (no typed API for it).
async fn runtime_class_v1beta1(j: &Joined, name: &str, handler: &str) {
    let req = http::Request::post("/apis/node.k8s.io/v1beta1/runtimeclasses")
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(
                &json!({"apiVersion": "node.k8s.io/v1beta1", "kind": "RuntimeClass",
                "metadata": {"name": name}, "handler": handler}),
            )
            .expect("body"),
        )
        .expect("request");
    let _: Value = j
        .admin
        .request(req)
        .await
        .expect("create v1beta1 runtimeclass");
}

fn with_class(class: &str) -> Value {
    let mut spec = sleeper("sleep 3600");
    spec["runtimeClassName"] = json!(class);
    spec
}

fn running(p: Option<&Value>) -> bool {
    p.is_some_and(|p| !p["status"]["containerStatuses"][0]["state"]["running"].is_null())
}

fn sandbox_events(j: &Joined, name: &str) -> Vec<String> {
    let full = j.pod_name(name);
    j.api
        .list("events")
        .iter()
        .filter(|e| {
            e["involvedObject"]["name"] == full.as_str() && e["reason"] == "FailedCreatePodSandBox"
        })
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

async fn wait_event(j: &Joined, name: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let ev = sandbox_events(j, name);
        if ev.iter().any(|m| m.contains(want)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: no FailedCreatePodSandBox event containing {want:?}: {ev:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_classes_pick_the_cri_handler_and_unknown_ones_never_start() {
    let j = Joined::start(Options::default()).await;
    runtime_class(&j, "rc-runc", "runc").await;
    runtime_class(&j, "rc-unconfigured", "no-such-handler").await;
    j.create_pod("rc-ok", with_class("rc-runc")).await;
    j.create_pod("rc-missing", with_class("rc-nonexistent"))
        .await;
    j.create_pod("rc-bad-handler", with_class("rc-unconfigured"))
        .await;

    j.wait_api("rc-ok", T, "running with the class's handler", running)
        .await;
    let full = j.pod_name("rc-ok");
    let sandbox = j
        .node
        .sandboxes()
        .await
        .into_iter()
        .find(|s| s.labels.get("io.kubernetes.pod.name") == Some(&full))
        .expect("sandbox of rc-ok");
    assert_eq!(sandbox.runtime_handler, "runc");

    wait_event(
        &j,
        "rc-missing",
        "Failed to create pod sandbox: failed to lookup RuntimeClass rc-nonexistent: runtimeclass.node.k8s.io \"rc-nonexistent\" not found",
    )
    .await;
    wait_event(&j, "rc-bad-handler", "no-such-handler").await;
    for name in ["rc-missing", "rc-bad-handler"] {
        let p = j.api_pod(name).expect("pod");
        assert_eq!(p["status"]["phase"], "Pending", "{name}: {p}");
        let full = j.pod_name(name);
        assert!(
            !j.node
                .sandboxes()
                .await
                .iter()
                .any(|s| s.labels.get("io.kubernetes.pod.name") == Some(&full)
                    && s.state == cri::pb::PodSandboxState::SandboxReady as i32),
            "{name} got no running sandbox"
        );
    }
    j.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_19_apiserver_serves_runtime_classes_as_v1beta1() {
    let j = Joined::start(Options {
        runtime_class_v1beta1_only: true,
        ..Options::default()
    })
    .await;
    // v1 is not served: the class can only be written through v1beta1.
    let v1 = Api::<RuntimeClass>::all(j.admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "x"}, "handler": "runc"}))
                .expect("rc"),
        )
        .await;
    assert!(v1.is_err(), "a 1.19 apiserver has no node.k8s.io/v1");
    runtime_class_v1beta1(&j, "rc-beta", "runc").await;
    j.create_pod("rc-beta", with_class("rc-beta")).await;
    j.wait_api("rc-beta", T, "running through the v1beta1 class", running)
        .await;
    j.cleanup().await;
}
