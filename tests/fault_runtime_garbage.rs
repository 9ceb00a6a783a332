//! Issue 20 fault case "the runtime answers with errors or garbage", on real
//! containerd behind the fault-injecting CRI proxy
//! (`kubelet_test_util::cri_proxy`), with static pods (no apiserver: the
//! case is about the runtime).
//!
//! For a while every CRI call fails with `Unavailable`, then
//! `DeadlineExceeded`, then `ResourceExhausted`; then the answers are
//! garbage: lists with every entry twice, entries with an unknown state
//! enum value, without metadata or without an ID, status answers without
//! their status. The kubelet must not panic or spin (it keeps asking at its
//! relist pace, as upstream's PLEG does, not in a hot loop), must not
//! restart the running pod's container or make it a new sandbox because a
//! call failed, and must run pods normally once the runtime answers again.

use std::time::Duration;

use cri::pb;
use kubelet_rs_integration::*;
use kubelet_test_util::cri_proxy::{Action, CriProxy, Rule, RuleHandle};
use tonic::Code;

/// How long each fault lasts.
const FAULT: Duration = Duration::from_secs(8);

/// Every list entry twice, plus an entry with an unknown state, one without
/// metadata and one without an ID.
fn garbage_containers(r: &mut pb::ListContainersResponse) {
    let mut more = r.containers.clone();
    if let Some(first) = r.containers.first() {
        let mut unknown = first.clone();
        unknown.id = format!("{}-garbage", first.id);
        unknown.state = 99;
        more.push(unknown);
        let mut bare = first.clone();
        bare.id = format!("{}-bare", first.id);
        bare.metadata = None;
        bare.image = None;
        more.push(bare);
        let mut no_id = first.clone();
        no_id.id.clear();
        more.push(no_id);
    }
    r.containers.extend(more);
}

fn garbage_sandboxes(r: &mut pb::ListPodSandboxResponse) {
    let mut more = r.items.clone();
    if let Some(first) = r.items.first() {
        let mut unknown = first.clone();
        unknown.id = format!("{}-garbage", first.id);
        unknown.state = 77;
        more.push(unknown);
        let mut bare = first.clone();
        bare.id = format!("{}-bare", first.id);
        bare.metadata = None;
        more.push(bare);
    }
    r.items.extend(more);
}

async fn hold(proxy: &CriProxy, rules: Vec<Rule>, what: &str) -> usize {
    let lists_before = proxy.calls("ListPodSandbox");
    let handles: Vec<RuleHandle> = rules.into_iter().map(|r| proxy.add_rule(r)).collect();
    tokio::time::sleep(FAULT).await;
    let hits: usize = handles.iter().map(RuleHandle::hits).sum();
    for h in handles {
        h.remove();
    }
    let lists = proxy.calls("ListPodSandbox") - lists_before;
    eprintln!("{what}: {hits} calls hit, {lists} ListPodSandbox calls in {FAULT:?}");
    assert!(hits > 0, "{what}: the kubelet kept calling the runtime");
    // PLEG relists every second; housekeeping and status add a few more.
    // A retry loop without back-off makes hundreds.
    assert!(
        lists <= 8 * FAULT.as_secs() as usize,
        "{what}: {lists} ListPodSandbox calls in {FAULT:?}: no back-off"
    );
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_garbage_from_the_runtime_neither_panic_nor_restart_and_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = CriProxy::start(dir.path().join("cri.sock"), endpoint())
        .await
        .expect("proxy");
    let endpoint = proxy.endpoint();
    let node = Node::start(|f| f.container_runtime_endpoint = Some(endpoint)).await;
    node.write_manifest(
        "steady.yaml",
        &pod_yaml("steady", "Always", BUSYBOX, "exec sleep 3600"),
    );
    let before = node
        .wait_status("steady", Duration::from_secs(90), "running", |s| {
            is_running(s, "c")
        })
        .await
        .expect("steady pod running");
    let id = container_id(&before, "c").expect("container id");
    let sandboxes = node.sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "one sandbox: {sandboxes:?}");

    for code in [
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
    ] {
        let rule = Rule::new(Action::Fail(code, format!("injected {code:?}")));
        hold(&proxy, vec![rule], &format!("{code:?}")).await;
    }
    hold(
        &proxy,
        vec![
            Rule::new(Action::edit(garbage_containers)).method("ListContainers"),
            Rule::new(Action::edit(garbage_sandboxes)).method("ListPodSandbox"),
            Rule::new(Action::edit(|r: &mut pb::ContainerStatusResponse| {
                r.status = None;
            }))
            .method("ContainerStatus"),
            Rule::new(Action::edit(|r: &mut pb::PodSandboxStatusResponse| {
                r.status = None;
            }))
            .method("PodSandboxStatus"),
        ],
        "garbage answers",
    )
    .await;

    // The runtime answers again: the pod was never touched, and pods run.
    node.write_manifest(
        "after.yaml",
        &pod_yaml("after", "Always", BUSYBOX, "exec sleep 3600"),
    );
    node.wait_status("after", Duration::from_secs(90), "running", |s| {
        is_running(s, "c")
    })
    .await
    .expect("a new pod runs after the faults");
    let now = node
        .wait_status("steady", Duration::from_secs(30), "running", |s| {
            is_running(s, "c")
        })
        .await
        .expect("steady pod running");
    assert_eq!(
        container_id(&now, "c").as_deref(),
        Some(id.as_str()),
        "the same container: {now:#?}"
    );
    assert_eq!(container(&now, "c").map(|c| c.restart_count), Some(0));
    let after: Vec<String> = node
        .sandboxes()
        .await
        .into_iter()
        .filter(|s| s.labels.get("io.kubernetes.pod.name") == Some(&node.pod_name("steady")))
        .map(|s| s.id)
        .collect();
    assert_eq!(after, vec![sandboxes[0].id.clone()], "no new sandbox");
    node.cleanup().await;
    proxy.shutdown().await;
}
