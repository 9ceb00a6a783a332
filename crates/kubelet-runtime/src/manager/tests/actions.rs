//! Pure `compute_pod_actions` cases (upstream `kuberuntime_manager_test.go`
//! `TestComputePodActions`): sandboxes, restart policies, init containers.

use crate::actions::*;
use crate::pod_status::{ContainerState, ContainerStatus, PodStatus};
use cri::pb;
use k8s_openapi::api::core::v1::Pod;
use kubelet_types::pod;
use std::time::UNIX_EPOCH;

fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
    let c = |n: &&str| serde_json::json!({"name": n, "image": "busybox:1"});
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"restartPolicy": policy,
                 "initContainers": inits.iter().map(c).collect::<Vec<_>>(),
                 "containers": apps.iter().map(c).collect::<Vec<_>>()}
    }))
    .expect("pod")
}

fn sandbox(id: &str, ready: bool, attempt: u32) -> pb::PodSandboxStatus {
    pb::PodSandboxStatus {
        id: id.into(),
        state: if ready {
            pb::PodSandboxState::SandboxReady as i32
        } else {
            pb::PodSandboxState::SandboxNotready as i32
        },
        metadata: Some(pb::PodSandboxMetadata {
            attempt,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ctr(p: &Pod, name: &str, state: ContainerState, exit: i32) -> ContainerStatus {
    let spec = pod::containers(p)
        .iter()
        .chain(pod::init_containers(p))
        .find(|c| c.name == name)
        .cloned()
        .unwrap_or_default();
    ContainerStatus {
        id: format!("id-{name}"),
        sandbox_id: "sb".into(),
        name: name.into(),
        state,
        created_at: UNIX_EPOCH,
        started_at: None,
        finished_at: None,
        exit_code: exit,
        image: String::new(),
        image_ref: String::new(),
        hash: pod::container_hash(&spec),
        hash_version: None,
        restart_count: 0,
        reason: String::new(),
        message: String::new(),
    }
}

fn status(sandboxes: Vec<pb::PodSandboxStatus>, containers: Vec<ContainerStatus>) -> PodStatus {
    PodStatus {
        uid: "u".into(),
        sandboxes,
        containers,
        ..Default::default()
    }
}

#[test]
fn new_pod_creates_sandbox_and_starts_all() {
    let p = pod("Always", &[], &["a", "b"]);
    let a = compute_pod_actions(&p, &PodStatus::default());
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!(a.attempt, 0);
    assert_eq!(a.containers_to_start, vec![0, 1]);
}

#[test]
fn running_pod_needs_nothing() {
    let p = pod("Always", &[], &["a"]);
    let s = status(
        vec![sandbox("sb", true, 0)],
        vec![ctr(&p, "a", ContainerState::Running, 0)],
    );
    let a = compute_pod_actions(&p, &s);
    assert_eq!(
        a,
        PodActions {
            sandbox_id: Some("sb".into()),
            ..Default::default()
        }
    );
}

#[test]
fn restart_policy_matrix() {
    // (policy, exit code) -> restart?
    for (policy, exit, restart) in [
        ("Always", 0, true),
        ("Always", 1, true),
        ("OnFailure", 0, false),
        ("OnFailure", 1, true),
        ("Never", 0, false),
        ("Never", 1, false),
    ] {
        let p = pod(policy, &[], &["a"]);
        let s = status(
            vec![sandbox("sb", true, 0)],
            vec![ctr(&p, "a", ContainerState::Exited, exit)],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(
            !a.containers_to_start.is_empty(),
            restart,
            "{policy} exit {exit}"
        );
        // Nothing left to run: the pod is done and its sandbox is stopped.
        assert_eq!(a.kill_pod, !restart, "{policy} exit {exit}");
    }
}

#[test]
fn changed_spec_replaces_the_container() {
    let p = pod("Always", &[], &["a"]);
    let mut c = ctr(&p, "a", ContainerState::Running, 0);
    c.hash = "old".into();
    let a = compute_pod_actions(&p, &status(vec![sandbox("sb", true, 0)], vec![c]));
    assert_eq!(a.containers_to_start, vec![0]);
    assert_eq!(a.containers_to_kill.len(), 1);
    assert!(!a.kill_pod);
}

#[test]
fn dead_sandbox_is_recreated_with_next_attempt() {
    let p = pod("Always", &[], &["a"]);
    let s = status(
        vec![sandbox("sb", false, 2)],
        vec![ctr(&p, "a", ContainerState::Exited, 137)],
    );
    let a = compute_pod_actions(&p, &s);
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!(a.attempt, 3);
    assert_eq!(a.containers_to_start, vec![0]);
    // Never: a dead sandbox of a pod that ran is not recreated.
    let p = pod("Never", &[], &["a"]);
    let a = compute_pod_actions(&p, &s);
    assert!(!a.create_sandbox && a.kill_pod);
    // OnFailure: succeeded containers are not started again in the new sandbox.
    let p = pod("OnFailure", &[], &["a", "b"]);
    let s = status(
        vec![sandbox("sb", false, 0)],
        vec![
            ctr(&p, "a", ContainerState::Exited, 0),
            ctr(&p, "b", ContainerState::Exited, 1),
        ],
    );
    assert_eq!(compute_pod_actions(&p, &s).containers_to_start, vec![1]);
}

#[test]
fn init_containers_run_one_at_a_time_in_order() {
    let p = pod("Always", &["i1", "i2"], &["a"]);
    let a = compute_pod_actions(&p, &PodStatus::default());
    assert_eq!(a.init_containers_to_start, vec![0]);
    assert!(a.containers_to_start.is_empty());
    let sb = || vec![sandbox("sb", true, 0)];
    // i1 running: wait.
    let a = compute_pod_actions(
        &p,
        &status(sb(), vec![ctr(&p, "i1", ContainerState::Running, 0)]),
    );
    assert_eq!(
        (
            a.init_containers_to_start.len(),
            a.containers_to_start.len()
        ),
        (0, 0)
    );
    // i1 done: i2 next.
    let a = compute_pod_actions(
        &p,
        &status(sb(), vec![ctr(&p, "i1", ContainerState::Exited, 0)]),
    );
    assert_eq!(a.init_containers_to_start, vec![1]);
    // both done: app containers.
    let a = compute_pod_actions(
        &p,
        &status(
            sb(),
            vec![
                ctr(&p, "i2", ContainerState::Exited, 0),
                ctr(&p, "i1", ContainerState::Exited, 0),
            ],
        ),
    );
    assert_eq!(
        (
            a.init_containers_to_start.clone(),
            a.containers_to_start.clone()
        ),
        (vec![], vec![0])
    );
    // i1 failed: restart it (Always), or fail the pod (Never).
    let failed = status(sb(), vec![ctr(&p, "i1", ContainerState::Exited, 1)]);
    assert_eq!(
        compute_pod_actions(&p, &failed).init_containers_to_start,
        vec![0]
    );
    let never = pod("Never", &["i1", "i2"], &["a"]);
    let failed = status(sb(), vec![ctr(&never, "i1", ContainerState::Exited, 1)]);
    let a = compute_pod_actions(&never, &failed);
    assert!(a.kill_pod && a.init_containers_to_start.is_empty());
}
