//! Status generation for pods with ephemeral containers: their own
//! `ephemeralContainerStatuses`, never part of the phase or the conditions.

use std::time::{Duration, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use kubelet_runtime::pod_status::{self as rt, ContainerState as RtState};

use super::generate_api_pod_status;
use crate::prober::NoProbes;

fn pod(policy: &str, init: bool) -> Pod {
    let mut v = serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"restartPolicy": policy,
                 "containers": [{"name": "app", "image": "i"}],
                 "ephemeralContainers": [
                    {"name": "debugger", "image": "busybox", "targetContainerName": "app"},
                    {"name": "debugger2", "image": "agnhost"}]}
    });
    if init {
        v["spec"]["initContainers"] = serde_json::json!([{"name": "init", "image": "i"}]);
    }
    serde_json::from_value(v).expect("pod")
}

fn inst(name: &str, state: RtState, exit: i32) -> rt::ContainerStatus {
    rt::ContainerStatus {
        id: format!("{name}-id"),
        sandbox_id: "sb".into(),
        name: name.into(),
        state,
        created_at: UNIX_EPOCH + Duration::from_secs(10),
        started_at: Some(UNIX_EPOCH + Duration::from_secs(10)),
        finished_at: (state == RtState::Exited).then(|| UNIX_EPOCH + Duration::from_secs(11)),
        exit_code: exit,
        image: "i".into(),
        image_ref: format!("sha256:{name}"),
        hash: String::new(),
        hash_version: None,
        restart_count: 0,
        reason: if exit == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
    }
}

fn generate(p: &Pod, cs: Vec<rt::ContainerStatus>) -> PodStatus {
    let st = rt::PodStatus {
        uid: "u".into(),
        containers: cs,
        ..Default::default()
    };
    let none = |_: &str| None;
    generate_api_pod_status(p, &st, &none, "containerd", &[], false, &NoProbes)
}

fn ephemeral(s: &PodStatus, name: &str) -> ContainerStatus {
    s.ephemeral_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no status for {name}: {s:?}"))
}

fn cond(s: &PodStatus, t: &str) -> String {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

#[test]
fn running_and_not_yet_created_ephemeral_containers_have_statuses() {
    let p = pod("Always", false);
    let s = generate(
        &p,
        vec![
            inst("app", RtState::Running, 0),
            inst("debugger", RtState::Running, 0),
        ],
    );
    let d = ephemeral(&s, "debugger");
    assert!(d.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    assert_eq!(d.container_id.as_deref(), Some("containerd://debugger-id"));
    assert_eq!(d.image, "busybox");
    assert_eq!(d.image_id, "sha256:debugger");
    assert_eq!(d.restart_count, 0);
    assert!(!d.ready, "ephemeral containers are never ready");
    assert_eq!(d.started, Some(true));
    let d2 = ephemeral(&s, "debugger2");
    let waiting = d2.state.and_then(|s| s.waiting).and_then(|w| w.reason);
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    // Not among the app containers; the pod is Running and Ready.
    assert_eq!(s.container_statuses.as_ref().map(Vec::len), Some(1));
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Ready"), "True");
    assert_eq!(cond(&s, "ContainersReady"), "True");
}

#[test]
fn an_exited_ephemeral_container_changes_neither_phase_nor_readiness() {
    for policy in ["Always", "Never"] {
        let p = pod(policy, false);
        let s = generate(
            &p,
            vec![
                inst("app", RtState::Running, 0),
                inst("debugger", RtState::Exited, 1),
                inst("debugger2", RtState::Exited, 0),
            ],
        );
        let d = ephemeral(&s, "debugger");
        let t = d.state.and_then(|s| s.terminated).expect("terminated");
        assert_eq!(t.exit_code, 1);
        assert_eq!(t.reason.as_deref(), Some("Error"));
        assert_eq!(s.phase.as_deref(), Some("Running"), "{policy}");
        assert_eq!(cond(&s, "Ready"), "True", "{policy}");
    }
}

#[test]
fn pods_without_ephemeral_containers_have_no_list_and_init_pods_wait_with_pod_initializing() {
    let mut p = pod("Always", false);
    if let Some(s) = p.spec.as_mut() {
        s.ephemeral_containers = None;
    }
    let s = generate(&p, vec![inst("app", RtState::Running, 0)]);
    assert!(s.ephemeral_container_statuses.is_none());
    let p = pod("Always", true);
    let s = generate(&p, vec![inst("init", RtState::Running, 0)]);
    let w = ephemeral(&s, "debugger")
        .state
        .and_then(|s| s.waiting)
        .and_then(|w| w.reason);
    assert_eq!(w.as_deref(), Some("PodInitializing"));
}
