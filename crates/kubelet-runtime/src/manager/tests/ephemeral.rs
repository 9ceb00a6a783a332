//! Ephemeral containers on the fake runtime: started once into the running
//! pod (in the target's PID namespace), never restarted, never a reason to
//! restart the app containers, stopped with the pod.

use super::lifecycle::{Recording, recording_manager};
use super::*;
use crate::actions::compute_pod_actions;
use cri::pb;

fn with_ephemeral(mut p: Pod, ecs: serde_json::Value) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        s.ephemeral_containers = Some(serde_json::from_value(ecs).expect("ephemeral containers"));
    }
    p
}

fn debugger(target: Option<&str>) -> serde_json::Value {
    let mut ec = serde_json::json!({"name": "debugger", "image": "reg/busybox:1",
        "command": ["sh", "-c", "sleep 1000"], "stdin": true, "tty": true});
    if let Some(t) = target {
        ec["targetContainerName"] = t.into();
    }
    serde_json::json!([ec])
}

#[tokio::test]
async fn added_to_a_running_pod_it_starts_once_and_never_restarts() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    let p = pod("Always");
    let t = SystemTime::now();
    let (s, _) = sync(&m, &p, t).await;
    let app = s.find_container("c").expect("app").clone();
    // The ephemeralcontainers subresource adds one: the next sync starts it
    // in the same sandbox, with Created and Started events.
    let p = with_ephemeral(p, debugger(Some("c")));
    let (s, r) = sync(&m, &p, t).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.started, 1);
    let dbg = s.find_container("debugger").expect("ephemeral container");
    assert_eq!(dbg.state, ContainerState::Running);
    assert_eq!(dbg.sandbox_id, app.sandbox_id, "same sandbox");
    assert!(events.has("Created", "Created container: debugger"));
    assert!(events.has("Started", "Started container debugger"));
    // It joined the app container's PID namespace.
    let cfg = rec
        .configs
        .lock()
        .iter()
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == "debugger"))
        .cloned()
        .expect("debugger config");
    let ns = cfg
        .linux
        .and_then(|l| l.security_context)
        .and_then(|s| s.namespace_options)
        .expect("namespaces");
    assert_eq!(ns.pid, pb::NamespaceMode::Target as i32);
    assert_eq!(ns.target_id, app.id);
    assert_eq!((cfg.stdin, cfg.tty), (true, true));
    // The app container was left alone: same instance, still running.
    let now_app = s.find_container("c").expect("app");
    assert_eq!(
        (now_app.id.as_str(), now_app.state),
        (app.id.as_str(), ContainerState::Running)
    );
    // It exits: never restarted, whatever the restart policy (Always here),
    // and its exit stops nothing else.
    fake.exit_container(&dbg.id, 1);
    rec.fake.clear_calls();
    let (s, r) = sync(&m, &p, t + Duration::from_secs(60)).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.started, 0);
    assert_eq!(fake.call_count("CreateContainer"), 0);
    assert_eq!(fake.call_count("StopContainer"), 0);
    assert_eq!(s.instances("debugger").count(), 1);
    assert_eq!(
        s.find_container("c").map(|c| c.state),
        Some(ContainerState::Running)
    );
}

#[tokio::test]
async fn a_target_that_is_not_running_is_a_config_error() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    let p = pod("Always");
    let t = SystemTime::now();
    sync(&m, &p, t).await;
    let p = with_ephemeral(p, debugger(Some("missing")));
    let (s, r) = sync(&m, &p, t).await;
    assert_eq!(
        r.errors.first().map(Error::reason),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        m.waiting_reason("uid-1", "debugger"),
        Some((
            "CreateContainerConfigError",
            "unable to find target container missing".to_string()
        ))
    );
    assert!(events.has("Failed", "Error: unable to find target container missing"));
    assert!(s.find_container("debugger").is_none());
}

#[tokio::test]
async fn stopped_with_the_pod_and_not_brought_back_in_a_new_sandbox() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = with_ephemeral(pod("Always"), debugger(None));
    let t = SystemTime::now();
    sync(&m, &p, t).await;
    let (s, _) = sync(&m, &p, t).await;
    let dbg = s.find_container("debugger").expect("started").clone();
    assert_eq!(dbg.state, ContainerState::Running);
    // The sandbox dies: the pod is killed (the ephemeral container too) and
    // recreated without it.
    fake.kill_sandbox(&s.sandboxes[0].id);
    let (s, r) = sync(&m, &p, t).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        s.find_container("debugger").map(|c| c.state),
        Some(ContainerState::Exited)
    );
    assert_eq!(s.instances("debugger").count(), 1);
    let a = compute_pod_actions(&p, &s);
    assert!(a.ephemeral_containers_to_start.is_empty(), "{a:?}");
    // Killing the pod stops it like any container.
    let p2 = with_ephemeral(pod("Always"), debugger(None));
    let fake = FakeRuntime::new();
    let m = manager(&fake, dir.path());
    sync(&m, &p2, t).await;
    let (s, _) = sync(&m, &p2, t).await;
    m.kill_pod(&s, Duration::from_secs(2), true)
        .await
        .expect("kill");
    let s = m
        .get_pod_status("uid-1", "p", "default")
        .await
        .expect("status");
    assert!(
        s.containers
            .iter()
            .all(|c| c.state == ContainerState::Exited),
        "{:?}",
        s.containers
    );
}

#[test]
fn not_started_in_a_pod_being_stopped() {
    // Never pod whose app container finished: the pod is done, and an
    // ephemeral container added now is not started into it.
    let p = with_ephemeral(pod("Never"), debugger(None));
    let s = PodStatus {
        uid: "uid-1".into(),
        sandboxes: vec![pb::PodSandboxStatus {
            id: "sb".into(),
            state: pb::PodSandboxState::SandboxReady as i32,
            metadata: Some(pb::PodSandboxMetadata::default()),
            ..Default::default()
        }],
        containers: vec![crate::pod_status::ContainerStatus {
            id: "c1".into(),
            name: "c".into(),
            state: ContainerState::Exited,
            hash: pod::container_hash(&pod::containers(&p)[0]),
            ..Default::default()
        }],
        ..Default::default()
    };
    let a = compute_pod_actions(&p, &s);
    assert!(a.kill_pod);
    assert!(a.ephemeral_containers_to_start.is_empty());
    // While the app container runs, it is started.
    let mut s = s;
    s.containers[0].state = ContainerState::Running;
    let a = compute_pod_actions(&p, &s);
    assert!(!a.kill_pod);
    assert_eq!(a.ephemeral_containers_to_start, vec![0]);
}
