//! Runtime manager tests on the fake CRI runtime.

use super::*;
use crate::pod_status::ContainerState;
use cri::fake::FakeRuntime;
use k8s_openapi::api::core::v1::Container;
use std::time::UNIX_EPOCH;

mod actions;
mod blocking;
mod ephemeral;
mod helper;
mod lifecycle;
mod metrics;
mod sidecars;

fn manager(fake: &FakeRuntime, dir: &std::path::Path) -> KubeRuntimeManager {
    let cfg = RuntimeConfig {
        pod_logs_dir: dir.to_path_buf(),
        root_dir: dir.join("root"),
        resolv_conf: String::new(),
        ..Default::default()
    };
    KubeRuntimeManager::new(Arc::new(fake.clone()), Arc::new(fake.clone()), cfg)
}

fn pod(policy: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
        "spec": {"restartPolicy": policy, "containers": [{"name": "c", "image": "reg/busybox:1"}]}
    }))
    .expect("pod")
}

async fn sync(m: &KubeRuntimeManager, p: &Pod, now: SystemTime) -> (PodStatus, SyncResult) {
    let s = m
        .get_pod_status("uid-1", "p", "default")
        .await
        .expect("status");
    let r = m.sync_pod(p, &s, now).await;
    let s = m
        .get_pod_status("uid-1", "p", "default")
        .await
        .expect("status");
    (s, r)
}

#[tokio::test]
async fn sync_starts_then_is_idempotent() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    let t = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let (s, r) = sync(&m, &p, t).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        r.started, 1,
        "the start is reported so status can follow at once"
    );
    assert_eq!(s.sandboxes.len(), 1);
    assert_eq!(s.containers.len(), 1);
    assert_eq!(s.containers[0].state, ContainerState::Running);
    assert_eq!(s.ips.len(), 1);
    fake.clear_calls();
    let (_, r) = sync(&m, &p, t).await;
    assert!(r.errors.is_empty());
    assert_eq!(r.started, 0);
    let mutating = [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "StopPodSandbox",
    ];
    assert!(
        fake.calls().iter().all(|c| !mutating.contains(c)),
        "{:?}",
        fake.calls()
    );
    assert!(dir.path().join("default_p_uid-1/c").is_dir());
}

#[tokio::test]
async fn crash_loop_backoff_then_restart_with_count() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    let t0 = SystemTime::now();
    let (s, _) = sync(&m, &p, t0).await;
    fake.exit_container(&s.containers[0].id, 1);
    // First exit restarts at once, with restart count 1.
    let (s, r) = sync(&m, &p, t0).await;
    assert!(r.errors.is_empty());
    assert_eq!(
        s.find_container("c").map(|c| (c.state, c.restart_count)),
        Some((ContainerState::Running, 1))
    );
    // Second exit: CrashLoopBackOff for 10s, requeued for the end of the window.
    fake.exit_container(&s.containers[0].id, 1);
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    assert_eq!(
        r.errors.first().map(Error::reason),
        Some("CrashLoopBackOff")
    );
    assert!(
        r.requeue_after
            .is_some_and(|d| d <= Duration::from_secs(10) && d > Duration::from_secs(8))
    );
    assert_eq!(
        m.waiting_reason("uid-1", "c").map(|r| r.0),
        Some("CrashLoopBackOff")
    );
    assert_eq!(
        s.find_container("c").map(|c| c.state),
        Some(ContainerState::Exited)
    );
    // After the window the container restarts and the reason clears; old dead instances are pruned.
    let later = SystemTime::now() + Duration::from_secs(11);
    let (s, r) = sync(&m, &p, later).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(s.find_container("c").map(|c| c.restart_count), Some(2));
    assert_eq!(m.waiting_reason("uid-1", "c"), None);
    assert_eq!(s.instances("c").count(), 2, "running + newest dead kept");
}

#[tokio::test]
async fn never_pod_finishes_and_stops_its_sandbox() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Never");
    let t = SystemTime::now();
    let (s, _) = sync(&m, &p, t).await;
    fake.exit_container(&s.containers[0].id, 0);
    let (s, r) = sync(&m, &p, t).await;
    assert!(r.errors.is_empty());
    assert_eq!(s.containers.len(), 1);
    assert!(
        !s.has_ready_sandbox(),
        "sandbox stopped once nothing is left to run"
    );
    fake.clear_calls();
    sync(&m, &p, t).await;
    assert_eq!(
        fake.call_count("StopPodSandbox"),
        0,
        "a finished pod costs no more stops"
    );
}

#[tokio::test]
async fn failed_pull_reports_reason_and_leaves_others_alone() {
    let fake = FakeRuntime::new();
    fake.set_image_missing("reg/none:1");
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let mut p = pod("Always");
    if let Some(s) = p.spec.as_mut() {
        s.containers.push(Container {
            name: "bad".into(),
            image: Some("reg/none:1".into()),
            ..Default::default()
        });
    }
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    assert_eq!(r.errors.len(), 1);
    assert_eq!(
        m.waiting_reason("uid-1", "bad").map(|r| r.0),
        Some("ErrImagePull")
    );
    assert_eq!(
        s.find_container("c").map(|c| c.state),
        Some(ContainerState::Running)
    );
    let (_, _) = sync(&m, &p, SystemTime::now()).await;
    assert_eq!(
        m.waiting_reason("uid-1", "bad").map(|r| r.0),
        Some("ImagePullBackOff")
    );
}

#[tokio::test]
async fn dead_sandboxes_without_containers_are_removed() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    let t = SystemTime::now();
    let (s, _) = sync(&m, &p, t).await;
    let first = s.sandboxes[0].id.clone();
    fake.kill_sandbox(&first);
    fake.exit_container(&s.containers[0].id, 137);
    // New sandbox; the first still holds the dead container (lastState), so it stays.
    let (s, r) = sync(&m, &p, t).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(s.sandboxes.len(), 2);
    // The container restarts again in the new sandbox: the oldest instance is pruned,
    // and the first sandbox, now empty, goes on the following sync.
    fake.exit_container(&s.containers[0].id, 1);
    let later = SystemTime::now() + Duration::from_secs(60);
    sync(&m, &p, later).await;
    let (s, _) = sync(&m, &p, later).await;
    assert!(
        s.sandboxes.iter().all(|sb| sb.id != first),
        "dead empty sandbox removed"
    );
    assert_eq!(s.sandboxes.len(), 1);
}

#[tokio::test]
async fn kill_and_remove() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    let (s, _) = sync(&m, &p, SystemTime::now()).await;
    m.kill_pod(&s, Duration::from_secs(2), false)
        .await
        .expect("kill");
    let s = m
        .get_pod_status("uid-1", "p", "default")
        .await
        .expect("status");
    assert!(s.live_containers().next().is_none() && !s.has_ready_sandbox());
    // What may sit under the pod's directory (a subPath bind mount of a
    // hostPath) is not the runtime's to delete.
    let kept = dir
        .path()
        .join("root/pods/uid-1/volume-subpaths/data/c/0/file");
    std::fs::create_dir_all(kept.parent().expect("parent")).expect("mkdir");
    std::fs::write(&kept, b"host data").expect("write");
    m.remove_pod(&s).await.expect("remove");
    assert!(fake.sandboxes().is_empty() && fake.containers().is_empty());
    assert!(!dir.path().join("default_p_uid-1").exists());
    assert_eq!(std::fs::read(&kept).expect("kept"), b"host data");
}

const MUTATING: [&str; 5] = [
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "StopPodSandbox",
];

fn mutations(fake: &FakeRuntime) -> Vec<&'static str> {
    fake.calls()
        .into_iter()
        .filter(|c| MUTATING.contains(c))
        .collect()
}

/// Runs `p`'s container as another kubelet left it: a sandbox and a running
/// container carrying exactly `annotations` (and upstream's labels).
async fn start_foreign(fake: &FakeRuntime, p: &Pod, annotations: &[(&str, &str)]) {
    let cfg = RuntimeConfig::default();
    let sb_cfg = sandbox_config(&cfg, p, 0, &crate::sandbox::HostDns::default());
    let sb = fake
        .run_pod_sandbox(sb_cfg.clone(), "")
        .await
        .expect("sandbox");
    let c = &pod::containers(p)[0];
    let cc = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: c.name.clone(),
            attempt: 0,
        }),
        image: Some(pb::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        labels: HashMap::from([
            ("io.kubernetes.pod.name".into(), pod::name(p).into()),
            (
                "io.kubernetes.pod.namespace".into(),
                pod::namespace(p).into(),
            ),
            ("io.kubernetes.pod.uid".into(), pod::uid(p).into()),
            ("io.kubernetes.container.name".into(), c.name.clone()),
        ]),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let id = fake
        .create_container(&sb, cc, sb_cfg)
        .await
        .expect("create");
    fake.start_container(&id).await.expect("start");
}

#[tokio::test]
async fn a_new_defaulted_field_restarts_nothing() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    let t = SystemTime::now();
    let (s, _) = sync(&m, &p, t).await;
    let before = s.containers[0].id.clone();
    // The apiserver was upgraded and now defaults more fields of the spec.
    let mut upgraded = p.clone();
    kubelet_types::defaults::apply_api_defaults(&mut upgraded);
    if let Some(c) = upgraded.spec.as_mut().map(|s| &mut s.containers[0]) {
        c.liveness_probe = Some(k8s_openapi::api::core::v1::Probe {
            period_seconds: Some(10),
            ..Default::default()
        });
        c.stdin = Some(false);
    }
    fake.clear_calls();
    let (s, r) = sync(&m, &upgraded, t).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(mutations(&fake), Vec::<&str>::new());
    assert_eq!(s.containers[0].id, before);
    // A new image still replaces the container.
    if let Some(c) = upgraded.spec.as_mut().map(|s| &mut s.containers[0]) {
        c.image = Some("reg/busybox:2".into());
    }
    let (_, r) = sync(&m, &upgraded, t).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(fake.call_count("StopContainer"), 1);
}

#[tokio::test]
async fn containers_hashed_by_another_kubelet_rs_version_are_adopted() {
    for annotations in [
        // A later kubelet-rs with another algorithm.
        [
            ("io.kubernetes.container.hash", "deadbeef"),
            ("io.kubelet-rs.container.hashVersion", "2"),
        ],
        // kubelet-rs before hash versions: whole-spec SHA-256 prefix, no version.
        [
            ("io.kubernetes.container.hash", "0123456789abcdef"),
            ("io.kubernetes.container.restartCount", "0"),
        ],
    ] {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        start_foreign(&fake, &p, &annotations).await;
        fake.clear_calls();
        let (s, r) = sync(&m, &p, SystemTime::now()).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(mutations(&fake), Vec::<&str>::new(), "{annotations:?}");
        assert_eq!(s.live_containers().count(), 1);
    }
}

#[tokio::test]
async fn containers_an_upstream_1_31_kubelet_started_are_adopted() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    // Exactly what upstream 1.31+ writes for container "c", image "reg/busybox:1"
    // (the hash computed independently: FNV-32a of the spew dump of
    // {"image":"reg/busybox:1","name":"c"}).
    let upstream = [
        ("io.kubernetes.container.hash", "35b9bd23"),
        ("io.kubernetes.container.restartCount", "0"),
        (
            "io.kubernetes.container.terminationMessagePath",
            "/dev/termination-log",
        ),
        ("io.kubernetes.container.terminationMessagePolicy", "File"),
        ("io.kubernetes.pod.terminationGracePeriod", "30"),
        ("io.kubernetes.container.type", "container"),
    ];
    start_foreign(&fake, &p, &upstream).await;
    fake.clear_calls();
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(mutations(&fake), Vec::<&str>::new());
    assert_eq!(s.live_containers().count(), 1);
    // The same algorithm, so a real change is still seen.
    let mut newer = p.clone();
    if let Some(c) = newer.spec.as_mut().map(|s| &mut s.containers[0]) {
        c.image = Some("reg/busybox:2".into());
    }
    let (_, r) = sync(&m, &newer, SystemTime::now()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(fake.call_count("StopContainer"), 1);
}

#[tokio::test]
async fn failures_keep_their_cri_error_and_retry_class() {
    use crate::RetryClass;
    use cri::CriError;
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = manager(&fake, dir.path());
    let p = pod("Always");
    // The runtime is restarting: sandbox creation fails, retryable.
    fake.fail_next(
        "RunPodSandbox",
        CriError::Unavailable {
            op: "RunPodSandbox",
            message: "connection refused".into(),
        },
    );
    let (_, r) = sync(&m, &p, SystemTime::now()).await;
    let e = r.errors.first().expect("an error");
    assert!(
        matches!(e, Error::CreateSandbox(CriError::Unavailable { .. })),
        "{e:?}"
    );
    assert_eq!(e.reason(), "FailedCreatePodSandBox");
    assert_eq!(e.retry_class(), RetryClass::Transient);
    assert!(e.is_retryable());
    assert!(e.to_string().contains("connection refused"), "{e}");
    assert!(
        std::error::Error::source(e).is_some(),
        "the CRI error is the source"
    );
    // The runtime refuses: same reason, retried on backoff.
    fake.fail_next(
        "RunPodSandbox",
        CriError::Rpc {
            op: "RunPodSandbox",
            code: cri::Code::Unknown,
            message: "failed to setup network for sandbox".into(),
        },
    );
    let (_, r) = sync(&m, &p, SystemTime::now()).await;
    let e = r.errors.first().expect("an error");
    assert!(
        matches!(e, Error::CreateSandbox(CriError::Rpc { .. })),
        "{e:?}"
    );
    assert_eq!(e.retry_class(), RetryClass::Backoff);
    // A container that cannot be created keeps the runtime's error too.
    fake.fail_next(
        "CreateContainer",
        CriError::Timeout {
            op: "CreateContainer",
            timeout: Duration::from_secs(2),
        },
    );
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    let e = r.errors.first().expect("an error");
    assert_eq!(e.reason(), "CreateContainerError");
    assert!(e.is_retryable(), "{e:?}");
    // kill_pod gives the crate's typed error.
    fake.fail_next(
        "StopPodSandbox",
        CriError::Unavailable {
            op: "StopPodSandbox",
            message: "down".into(),
        },
    );
    let e = m
        .kill_pod(&s, Duration::from_secs(2), true)
        .await
        .expect_err("kill fails");
    assert!(
        matches!(e, Error::Cri(CriError::Unavailable { .. })),
        "{e:?}"
    );
    assert!(e.is_retryable());
}

fn tempfile_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}
