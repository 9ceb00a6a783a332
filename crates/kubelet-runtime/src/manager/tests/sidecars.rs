//! Sidecar containers (init containers with `restartPolicy: Always`,
//! upstream 1.29+ `computeInitContainerActions` and `terminationOrdering`):
//! start order, restarts, stop order, and completion of Never pods.

use super::lifecycle::{Recording, recording_manager};
use super::*;
use crate::actions::compute_pod_actions_with;
use crate::prober_results::{ProbeResult, ProbeResults};
use cri::pb;

/// Init containers `sc` (sidecar with a startup probe), `init` (regular),
/// `sc2` (sidecar), app container `app`.
fn sidecar_pod(policy: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
        "spec": {"restartPolicy": policy, "terminationGracePeriodSeconds": 30,
            "initContainers": [
                {"name": "sc", "image": "reg/busybox:1", "restartPolicy": "Always",
                 "startupProbe": {"exec": {"command": ["true"]}}},
                {"name": "init", "image": "reg/busybox:1"},
                {"name": "sc2", "image": "reg/busybox:1", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "reg/busybox:1"}]}
    }))
    .expect("pod")
}

fn ctr(p: &Pod, name: &str, state: ContainerState, exit: i32) -> crate::ContainerStatus {
    let spec = pod::containers(p)
        .iter()
        .chain(pod::init_containers(p))
        .find(|c| c.name == name)
        .cloned()
        .unwrap_or_default();
    crate::ContainerStatus {
        id: format!("id-{name}"),
        name: name.into(),
        state,
        exit_code: exit,
        hash: pod::container_hash(&spec),
        ..Default::default()
    }
}

fn status(containers: Vec<crate::ContainerStatus>) -> PodStatus {
    PodStatus {
        uid: "uid-1".into(),
        sandboxes: vec![pb::PodSandboxStatus {
            id: "sb".into(),
            state: pb::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        }],
        containers,
        ..Default::default()
    }
}

#[test]
fn sidecars_start_in_order_and_wait_for_their_startup_probe() {
    use ContainerState::*;
    let p = sidecar_pod("Always");
    let r = ProbeResults::default();
    let a = compute_pod_actions_with(&p, &PodStatus::default(), &r);
    assert_eq!(a.init_containers_to_start, vec![0]);
    // Running, startup probe not yet successful: the next one waits.
    let s = status(vec![ctr(&p, "sc", Running, 0)]);
    let a = compute_pod_actions_with(&p, &s, &r);
    assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
    r.startup.set("id-sc", ProbeResult::Unknown, "uid-1");
    assert!(
        compute_pod_actions_with(&p, &s, &r)
            .init_containers_to_start
            .is_empty()
    );
    r.startup.set("id-sc", ProbeResult::Success, "uid-1");
    assert_eq!(
        compute_pod_actions_with(&p, &s, &r).init_containers_to_start,
        vec![1]
    );
    // The regular init container runs to completion, then sc2 (no probe: running is started).
    let s = status(vec![ctr(&p, "init", Running, 0), ctr(&p, "sc", Running, 0)]);
    let a = compute_pod_actions_with(&p, &s, &r);
    assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
    let s = status(vec![ctr(&p, "init", Exited, 0), ctr(&p, "sc", Running, 0)]);
    assert_eq!(
        compute_pod_actions_with(&p, &s, &r).init_containers_to_start,
        vec![2]
    );
    // All initialized: the app container starts, sidecars keep running.
    let s = status(vec![
        ctr(&p, "sc2", Running, 0),
        ctr(&p, "init", Exited, 0),
        ctr(&p, "sc", Running, 0),
    ]);
    let a = compute_pod_actions_with(&p, &s, &r);
    assert!(a.init_containers_to_start.is_empty());
    assert_eq!(a.containers_to_start, vec![0]);
    assert!(!a.kill_pod);
}

#[test]
fn exited_sidecars_restart_whatever_the_restart_policy() {
    use ContainerState::*;
    for policy in ["Never", "OnFailure", "Always"] {
        let p = sidecar_pod(policy);
        let r = ProbeResults::default();
        r.startup.set("id-sc", ProbeResult::Success, "uid-1");
        let s = status(vec![
            ctr(&p, "app", Running, 0),
            ctr(&p, "sc2", Exited, 0),
            ctr(&p, "init", Exited, 0),
            ctr(&p, "sc", Exited, 137),
        ]);
        let a = compute_pod_actions_with(&p, &s, &r);
        assert_eq!(a.init_containers_to_start, vec![0, 2], "{policy}");
        assert!(a.containers_to_start.is_empty() && !a.kill_pod, "{policy}");
        // A failed startup probe on a running sidecar restarts it.
        let s = status(vec![ctr(&p, "app", Running, 0), ctr(&p, "sc", Running, 0)]);
        r.startup.set("id-sc", ProbeResult::Failure, "uid-1");
        let a = compute_pod_actions_with(&p, &s, &r);
        assert_eq!(a.init_containers_to_start, vec![0, 2], "{policy}");
        assert_eq!(
            a.containers_to_kill[0].message,
            "Init container sc failed startup probe"
        );
    }
}

#[test]
fn sidecars_do_not_keep_a_finished_never_pod_alive() {
    use ContainerState::*;
    for policy in ["Never", "OnFailure"] {
        let p = sidecar_pod(policy);
        let s = status(vec![
            ctr(&p, "app", Exited, 0),
            ctr(&p, "sc2", Running, 0),
            ctr(&p, "init", Exited, 0),
            ctr(&p, "sc", Running, 0),
        ]);
        let a = compute_pod_actions_with(&p, &s, &ProbeResults::default());
        assert!(a.kill_pod, "{policy}");
        assert!(a.init_containers_to_start.is_empty(), "{policy}");
        assert!(a.containers_to_start.is_empty(), "{policy}");
    }
}

#[tokio::test(start_paused = true)]
async fn app_containers_stop_first_then_sidecars_in_reverse_order() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    let results = ProbeResults::default();
    let m = m.with_probe_results(results.clone());
    let p = sidecar_pod("Always");
    let now = SystemTime::now();
    let mut s = PodStatus::default();
    // Sync until the app container runs; the startup probe of `sc` succeeds at once.
    for _ in 0..6 {
        let (next, r) = sync(&m, &p, now).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        s = next;
        if let Some(sc) = s.find_container("sc") {
            results.startup.set(&sc.id, ProbeResult::Success, "uid-1");
        }
        if let Some(i) = s
            .find_container("init")
            .filter(|c| c.state == ContainerState::Running)
        {
            fake.exit_container(&i.id, 0);
        }
    }
    let starts: Vec<_> = rec
        .log()
        .into_iter()
        .filter(|l| l.starts_with("start"))
        .collect();
    assert_eq!(
        starts,
        vec!["start sc", "start init", "start sc2", "start app"]
    );
    // The app's preStop hook takes 5 s: the sidecars wait for the app to stop
    // and lose that time from their grace period.
    let mut p = p;
    if let Some(app) = p.spec.as_mut().map(|s| &mut s.containers[0]) {
        app.lifecycle = serde_json::from_value(
            serde_json::json!({"preStop": {"exec": {"command": ["sleep", "5"]}}}),
        )
        .ok();
    }
    *rec.exec_delay.lock() = Duration::from_secs(5);
    rec.log.lock().clear();
    m.kill_pod_with_spec(Some(&p), &s, None, true)
        .await
        .expect("kill");
    assert_eq!(
        rec.log(),
        vec![
            "exec app sleep 5 within 30s",
            "stop app 25s",
            "stop sc2 25s",
            "stop sc 25s"
        ]
    );
    for c in ["app", "sc", "sc2"] {
        assert!(events.has("Killing", &format!("Stopping container {c}")));
    }
}
