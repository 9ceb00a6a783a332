//! Status generation for pods with sidecars (restartable init containers)
//! and with a prober that holds readiness back.

use std::collections::HashSet;
use std::time::{Duration, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_runtime::pod_status::{self as rt, ContainerState as RtState};

use super::generate_api_pod_status;
use crate::prober::{NoProbes, ProbeManager};

fn pod(policy: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"restartPolicy": policy,
                 "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always"}],
                 "containers": [{"name": "app", "image": "i"}]}
    }))
    .expect("pod")
}

fn inst(name: &str, state: RtState, exit: i32, created: u64) -> rt::ContainerStatus {
    rt::ContainerStatus {
        id: format!("{name}-{created}"),
        sandbox_id: "sb".into(),
        name: name.into(),
        state,
        created_at: UNIX_EPOCH + Duration::from_secs(created),
        started_at: Some(UNIX_EPOCH + Duration::from_secs(created)),
        finished_at: (state == RtState::Exited)
            .then(|| UNIX_EPOCH + Duration::from_secs(created + 1)),
        exit_code: exit,
        image: "i".into(),
        image_ref: "sha256:x".into(),
        hash: String::new(),
        hash_version: None,
        restart_count: 0,
        reason: String::new(),
        message: String::new(),
    }
}

fn status(cs: Vec<rt::ContainerStatus>) -> rt::PodStatus {
    rt::PodStatus {
        uid: "u".into(),
        containers: cs,
        ..Default::default()
    }
}

fn gen_with(p: &Pod, st: &rt::PodStatus, probes: &dyn ProbeManager) -> PodStatus {
    let none = |_: &str| None;
    generate_api_pod_status(p, st, &none, "containerd", &[], false, probes)
}

fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a k8s_openapi::api::core::v1::PodCondition {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .expect("condition")
}

/// A prober whose startup probe of "side" has not succeeded yet.
struct SidecarNotStarted;

impl ProbeManager for SidecarNotStarted {
    fn add_pod(&self, _: &Pod) {}
    fn stop_liveness_and_startup(&self, _: &Pod) {}
    fn remove_pod(&self, _: &Pod) {}
    fn cleanup_pods(&self, _: &HashSet<String>) {}
    fn update_pod_status(&self, p: &Pod, s: &mut PodStatus) {
        NoProbes.update_pod_status(p, s);
        for c in s.init_container_statuses.iter_mut().flatten() {
            c.started = Some(false);
            c.ready = false;
        }
    }
}

#[test]
fn a_sidecar_not_started_holds_the_pod_pending_and_uninitialized() {
    let p = pod("Always");
    let st = status(vec![inst("side", RtState::Running, 0, 1)]);
    let s = gen_with(&p, &st, &SidecarNotStarted);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let init = cond(&s, "Initialized");
    assert_eq!(init.status, "False");
    assert_eq!(
        init.message.as_deref(),
        Some("containers with incomplete status: [side]")
    );
    // The app container waits for initialization.
    let app = &s.container_statuses.as_ref().expect("app")[0];
    let waiting = app.state.as_ref().and_then(|s| s.waiting.as_ref());
    assert_eq!(
        waiting.and_then(|w| w.reason.as_deref()),
        Some("PodInitializing")
    );

    let s = gen_with(&p, &st, &NoProbes);
    assert_eq!(
        cond(&s, "Initialized").status,
        "True",
        "a started sidecar initializes"
    );
}

#[test]
fn sidecars_count_while_running_and_not_once_stopped() {
    let p = pod("Never");
    let running = status(vec![
        inst("side", RtState::Running, 0, 1),
        inst("app", RtState::Running, 0, 2),
    ]);
    let s = gen_with(&p, &running, &NoProbes);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "ContainersReady").status, "True");

    // The app finished; the sidecar still runs until the kubelet stops it.
    let app_done = status(vec![
        inst("side", RtState::Running, 0, 1),
        inst("app", RtState::Exited, 0, 2),
    ]);
    assert_eq!(
        gen_with(&p, &app_done, &NoProbes).phase.as_deref(),
        Some("Running")
    );
    // Once the sidecar is stopped (even with a failure exit), the pod completed.
    let all_done = status(vec![
        inst("side", RtState::Exited, 137, 1),
        inst("app", RtState::Exited, 0, 2),
    ]);
    let s = gen_with(&p, &all_done, &NoProbes);
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    assert_eq!(
        cond(&s, "Initialized").reason.as_deref(),
        Some("PodCompleted")
    );
    assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
}

#[test]
fn a_restarting_sidecar_keeps_an_initialized_pod_running() {
    let p = pod("Always");
    let st = status(vec![
        inst("side", RtState::Exited, 1, 1),
        inst("app", RtState::Running, 0, 2),
    ]);
    let s = gen_with(&p, &st, &NoProbes);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Initialized").status, "True");
    let cr = cond(&s, "ContainersReady");
    assert_eq!(
        cr.message.as_deref(),
        Some("containers with unready status: [side]")
    );
}
