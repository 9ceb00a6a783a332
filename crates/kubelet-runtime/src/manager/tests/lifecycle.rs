//! Lifecycle hooks and graceful termination on the fake runtime, on paused
//! time: grace period arithmetic, preStop before StopContainer with its time
//! subtracted, postStart failures, liveness restarts, sidecar stop order.

use super::*;
use crate::actions::KillReason;
use crate::manager::kill::termination_grace_period;
use crate::prober_results::{ProbeResult, ProbeResults};
use cri::pb;
use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::Recorder;

/// A runtime that records exec and stop calls (in order, by container name)
/// and lets execs take time and fail; everything else is the fake's.
#[derive(Clone)]
pub(super) struct Recording {
    pub fake: FakeRuntime,
    pub log: Arc<Mutex<Vec<String>>>,
    pub exec_delay: Arc<Mutex<Duration>>,
    pub exec_exit: Arc<Mutex<i32>>,
    /// Every `ContainerConfig` created, in order.
    pub configs: Arc<Mutex<Vec<pb::ContainerConfig>>>,
}

impl Recording {
    pub fn new(fake: &FakeRuntime) -> Self {
        Self {
            fake: fake.clone(),
            log: Arc::default(),
            exec_delay: Arc::default(),
            exec_exit: Arc::default(),
            configs: Arc::default(),
        }
    }

    async fn name(&self, id: &str) -> String {
        self.fake
            .container_status(id)
            .await
            .ok()
            .and_then(|s| s.metadata)
            .map(|m| m.name)
            .unwrap_or_default()
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().clone()
    }
}

#[async_trait::async_trait]
impl RuntimeService for Recording {
    async fn version(&self) -> cri::Result<pb::VersionResponse> {
        self.fake.version().await
    }
    async fn status(&self) -> cri::Result<pb::StatusResponse> {
        self.fake.status().await
    }
    async fn run_pod_sandbox(&self, c: pb::PodSandboxConfig, h: &str) -> cri::Result<String> {
        self.fake.run_pod_sandbox(c, h).await
    }
    async fn stop_pod_sandbox(&self, id: &str) -> cri::Result<()> {
        self.fake.stop_pod_sandbox(id).await
    }
    async fn remove_pod_sandbox(&self, id: &str) -> cri::Result<()> {
        self.fake.remove_pod_sandbox(id).await
    }
    async fn pod_sandbox_status(&self, id: &str) -> cri::Result<pb::PodSandboxStatus> {
        self.fake.pod_sandbox_status(id).await
    }
    async fn list_pod_sandbox(
        &self,
        f: Option<pb::PodSandboxFilter>,
    ) -> cri::Result<Vec<pb::PodSandbox>> {
        self.fake.list_pod_sandbox(f).await
    }
    async fn create_container(
        &self,
        sb: &str,
        c: pb::ContainerConfig,
        s: pb::PodSandboxConfig,
    ) -> cri::Result<String> {
        self.configs.lock().push(c.clone());
        self.fake.create_container(sb, c, s).await
    }
    async fn start_container(&self, id: &str) -> cri::Result<()> {
        let name = self.name(id).await;
        self.log.lock().push(format!("start {name}"));
        self.fake.start_container(id).await
    }
    async fn stop_container(&self, id: &str, timeout: Duration) -> cri::Result<()> {
        let name = self.name(id).await;
        self.log
            .lock()
            .push(format!("stop {name} {}s", timeout.as_secs()));
        self.fake.stop_container(id, timeout).await
    }
    async fn remove_container(&self, id: &str) -> cri::Result<()> {
        self.fake.remove_container(id).await
    }
    async fn list_containers(
        &self,
        f: Option<pb::ContainerFilter>,
    ) -> cri::Result<Vec<pb::Container>> {
        self.fake.list_containers(f).await
    }
    async fn container_status(&self, id: &str) -> cri::Result<pb::ContainerStatus> {
        self.fake.container_status(id).await
    }
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> cri::Result<pb::ExecSyncResponse> {
        let name = self.name(id).await;
        self.log.lock().push(format!(
            "exec {name} {} within {}s",
            cmd.join(" "),
            timeout.as_secs()
        ));
        let delay = *self.exec_delay.lock();
        tokio::time::sleep(delay).await;
        let mut r = self.fake.exec_sync(id, cmd, timeout).await?;
        r.exit_code = *self.exec_exit.lock();
        if r.exit_code != 0 {
            r.stdout = b"out".to_vec();
            r.stderr = b"boom".to_vec();
        }
        Ok(r)
    }
}

/// Events as (type, reason, message).
#[derive(Default)]
pub(super) struct Events(Mutex<Vec<(String, String, String)>>);

impl Recorder for Events {
    fn event(&self, _: &ObjectReference, kind: EventType, reason: &str, message: String) {
        self.0
            .lock()
            .push((kind.as_str().into(), reason.into(), message));
    }
}

impl Events {
    pub fn all(&self) -> Vec<(String, String, String)> {
        self.0.lock().clone()
    }
    pub fn has(&self, reason: &str, message: &str) -> bool {
        self.all().iter().any(|e| e.1 == reason && e.2 == message)
    }
}

pub(super) fn recording_manager(
    rec: &Recording,
    dir: &std::path::Path,
) -> (KubeRuntimeManager, Arc<Events>) {
    let cfg = RuntimeConfig {
        pod_logs_dir: dir.to_path_buf(),
        root_dir: dir.join("root"),
        resolv_conf: String::new(),
        ..Default::default()
    };
    let events = Arc::new(Events::default());
    let m = KubeRuntimeManager::new(Arc::new(rec.clone()), Arc::new(rec.fake.clone()), cfg)
        .with_recorder(events.clone());
    (m, events)
}

fn hooked_pod(grace: i64, lifecycle: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
        "spec": {"restartPolicy": "Always", "terminationGracePeriodSeconds": grace,
                 "containers": [{"name": "c", "image": "reg/busybox:1", "lifecycle": lifecycle,
                                 "livenessProbe": {"exec": {"command": ["true"]},
                                                   "terminationGracePeriodSeconds": 7}}]}
    }))
    .expect("pod")
}

fn pre_stop_sleep() -> serde_json::Value {
    serde_json::json!({"preStop": {"exec": {"command": ["sh", "-c", "sleep 10"]}}})
}

#[test]
fn grace_period_arithmetic() {
    let mut p = hooked_pod(20, serde_json::json!({}));
    let c = pod::containers(&p)[0].clone();
    let g = |p: &Pod, why| termination_grace_period(p, Some(&c), why).as_secs();
    // The pod's terminationGracePeriodSeconds; a failed liveness probe uses its own.
    assert_eq!(g(&p, KillReason::Unknown), 20);
    assert_eq!(g(&p, KillReason::LivenessProbe), 7);
    // The startup probe has no grace of its own: the pod's.
    assert_eq!(g(&p, KillReason::StartupProbe), 20);
    // The deletion grace period wins over both.
    p.metadata.deletion_grace_period_seconds = Some(3);
    assert_eq!(g(&p, KillReason::Unknown), 3);
    assert_eq!(g(&p, KillReason::LivenessProbe), 3);
    // Unset: the apiserver's default.
    let bare = pod("Always");
    assert_eq!(
        termination_grace_period(&bare, None, KillReason::Unknown).as_secs(),
        30
    );
}

#[tokio::test(start_paused = true)]
async fn pre_stop_runs_first_and_its_time_is_subtracted() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    let p = hooked_pod(30, pre_stop_sleep());
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    *rec.exec_delay.lock() = Duration::from_secs(10);
    rec.log.lock().clear();
    m.kill_pod(&s, pod::grace_period(&p), true)
        .await
        .expect("kill");
    assert_eq!(
        rec.log(),
        vec!["exec c sh -c sleep 10 within 30s", "stop c 20s"],
        "the hook runs within the grace period, the stop gets what is left"
    );
    assert_eq!(events.all().last().map(|e| e.1.as_str()), Some("Killing"));
    assert!(events.has("Killing", "Stopping container c"));
}

#[tokio::test(start_paused = true)]
async fn a_pre_stop_hook_past_the_grace_period_fails_and_the_stop_gets_the_minimum() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    let p = hooked_pod(5, pre_stop_sleep());
    let (s, _) = sync(&m, &p, SystemTime::now()).await;
    *rec.exec_delay.lock() = Duration::from_secs(100);
    rec.log.lock().clear();
    m.kill_pod_with_spec(Some(&p), &s, None, true)
        .await
        .expect("kill");
    assert_eq!(rec.log().last().map(String::as_str), Some("stop c 2s"));
    assert!(events.has("FailedPreStopHook", "PreStopHook failed"));
}

#[tokio::test(start_paused = true)]
async fn a_grace_override_wins() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, _) = recording_manager(&rec, dir.path());
    let p = hooked_pod(30, pre_stop_sleep());
    let (s, _) = sync(&m, &p, SystemTime::now()).await;
    rec.log.lock().clear();
    m.kill_pod_with_spec(Some(&p), &s, Some(Duration::from_secs(1)), true)
        .await
        .expect("kill");
    assert_eq!(
        rec.log(),
        vec!["exec c sh -c sleep 10 within 30s", "stop c 1s"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_post_start_hook_kills_the_container_with_its_reason() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    *rec.exec_exit.lock() = 1;
    let p = hooked_pod(
        30,
        serde_json::json!({"postStart": {"exec": {"command": ["sh", "-c", "exit 1"]}}}),
    );
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].reason(), "PostStartHookError");
    let (reason, message) = m.waiting_reason("uid-1", "c").expect("reason");
    assert_eq!(reason, "PostStartHookError");
    assert_eq!(
        message,
        "Exec lifecycle hook ([sh -c exit 1]) for Container \"c\" in Pod \"p_default(uid-1)\" \
         failed - error: command 'sh -c exit 1' exited with 1: boom, message: \"outboom\""
    );
    assert!(events.has("FailedPostStartHook", "PostStartHook failed"));
    assert!(events.has("Killing", "FailedPostStartHook"));
    assert_eq!(s.containers[0].state, ContainerState::Exited);
    assert_eq!(
        rec.log(),
        vec!["start c", "exec c sh -c exit 1 within 300s", "stop c 30s"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_liveness_probe_restarts_with_the_probe_grace_period() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, events) = recording_manager(&rec, dir.path());
    let results = ProbeResults::default();
    let m = m.with_probe_results(results.clone());
    let p = hooked_pod(30, serde_json::json!({}));
    let (s, _) = sync(&m, &p, SystemTime::now()).await;
    let id = s.containers[0].id.clone();
    results.liveness.set(&id, ProbeResult::Failure, "uid-1");
    rec.log.lock().clear();
    let (s, r) = sync(&m, &p, SystemTime::now()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(events.has(
        "Killing",
        "Container c failed liveness probe, will be restarted"
    ));
    assert_eq!(rec.log(), vec!["stop c 7s", "start c"]);
    assert_eq!(s.containers[0].state, ContainerState::Running);
    assert_eq!(s.containers[0].restart_count, 1);
    assert_ne!(s.containers[0].id, id);
}

#[test]
fn a_failed_startup_probe_on_a_never_pod_kills_without_restart() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}
    }))
    .expect("pod");
    let status = PodStatus {
        sandboxes: vec![pb::PodSandboxStatus {
            id: "sb".into(),
            state: pb::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        }],
        containers: vec![crate::ContainerStatus {
            id: "c1".into(),
            name: "c".into(),
            state: ContainerState::Running,
            hash: pod::container_hash(&pod::containers(&p)[0]),
            ..Default::default()
        }],
        ..Default::default()
    };
    let results = ProbeResults::default();
    results.startup.set("c1", ProbeResult::Failure, "u");
    let a = crate::actions::compute_pod_actions_with(&p, &status, &results);
    assert!(a.containers_to_start.is_empty());
    assert_eq!(a.containers_to_kill.len(), 1);
    assert_eq!(
        a.containers_to_kill[0].message,
        "Container c failed startup probe"
    );
    assert_eq!(a.containers_to_kill[0].reason, KillReason::StartupProbe);
    // Nothing is kept: the pod is done.
    assert!(a.kill_pod);
}

#[tokio::test(start_paused = true)]
async fn a_kill_with_only_the_runtime_state_uses_the_last_spec_and_the_given_grace() {
    let fake = FakeRuntime::new();
    let rec = Recording::new(&fake);
    let dir = tempfile_dir();
    let (m, _) = recording_manager(&rec, dir.path());
    let p = hooked_pod(30, pre_stop_sleep());
    let (s, _) = sync(&m, &p, SystemTime::now()).await;
    rec.log.lock().clear();
    // The kubelet's grace (a deletion with a shorter grace period) wins over
    // the synced spec's 30 s; the spec still gives the preStop hook.
    m.kill_pod(&s, Duration::from_secs(4), true)
        .await
        .expect("kill");
    assert_eq!(
        rec.log(),
        vec!["exec c sh -c sleep 10 within 4s", "stop c 4s"]
    );
}
