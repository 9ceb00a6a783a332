//! Unit tests of the sync loop on paused time, with fakes at its seams.

mod runtime_wait;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kubelet_runtime::pleg::EventKind;
use kubelet_server::HostInterface;
use kubelet_test_util::pods;
use kubelet_types::Source;
use parking_lot::Mutex;

use super::*;
use crate::pod_manager::PodManager;
use crate::status::StatusManager;
use kubelet_podconfig::SourcesReady;

#[derive(Default)]
struct FakePleg {
    pods: Mutex<HashMap<String, RuntimePod>>,
    /// `runtime_pods` never answers (a runtime that hangs housekeeping).
    hang: AtomicBool,
}

#[async_trait::async_trait]
impl Pleg for FakePleg {
    async fn runtime_pods(&self) -> Arc<HashMap<String, RuntimePod>> {
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Arc::new(self.pods.lock().clone())
    }
}

#[derive(Default)]
struct FakeWorkers {
    work: Mutex<Vec<(String, WorkKind)>>,
    known: Mutex<HashSet<String>>,
    removed: Mutex<HashSet<String>>,
    forgotten: Mutex<Vec<String>>,
    gc: AtomicUsize,
}

impl FakeWorkers {
    fn take(&self) -> Vec<(String, WorkKind)> {
        std::mem::take(&mut *self.work.lock())
    }
}

impl PodWorkers for FakeWorkers {
    fn update_pod(&self, w: PodWork) {
        let uid = pod::uid(&w.pod).to_string();
        self.known.lock().insert(uid.clone());
        self.work.lock().push((uid, w.kind));
    }
    fn has_worker(&self, uid: &str) -> bool {
        self.known.lock().contains(uid)
    }
    fn uids(&self) -> Vec<String> {
        self.known.lock().iter().cloned().collect()
    }
    fn is_removed(&self, uid: &str) -> bool {
        self.removed.lock().contains(uid)
    }
    fn forget(&self, uid: &str) {
        self.known.lock().remove(uid);
        self.forgotten.lock().push(uid.to_string());
    }
    fn gc_backoff(&self) {
        self.gc.fetch_add(1, Ordering::SeqCst);
    }
}

/// Records what the loop asks of the prober.
#[derive(Default)]
struct FakeProbes {
    calls: Mutex<Vec<(&'static str, String)>>,
}

impl FakeProbes {
    fn take(&self) -> Vec<(&'static str, String)> {
        std::mem::take(&mut *self.calls.lock())
    }
}

impl ProbeManager for FakeProbes {
    fn add_pod(&self, p: &Pod) {
        self.calls.lock().push(("add", pod::uid(p).to_string()));
    }
    fn stop_liveness_and_startup(&self, p: &Pod) {
        self.calls.lock().push(("stop", pod::uid(p).to_string()));
    }
    fn remove_pod(&self, p: &Pod) {
        self.calls.lock().push(("remove", pod::uid(p).to_string()));
    }
    fn cleanup_pods(&self, desired: &HashSet<String>) {
        let mut d: Vec<_> = desired.iter().cloned().collect();
        d.sort();
        self.calls.lock().push(("cleanup", d.join(",")));
    }
    fn update_pod_status(&self, _: &Pod, _: &mut k8s_openapi::api::core::v1::PodStatus) {}
}

struct Harness {
    probes: Arc<FakeProbes>,
    results: ProbeResults,
    config: mpsc::Sender<PodUpdate>,
    pleg_events: mpsc::Sender<PodLifecycleEvent>,
    pleg: Arc<FakePleg>,
    workers: Arc<FakeWorkers>,
    queue: Arc<WorkQueue>,
    ready: Arc<SourcesReady>,
    pods: PodManager,
    heartbeat: Arc<Heartbeat>,
    status: Arc<StatusManager>,
    stop: CancellationToken,
}

fn start() -> Harness {
    start_with(110)
}

/// An admitter for a node with room for `max_pods` pods and plenty of cpu and memory.
fn admitter(max_pods: u32) -> crate::lifecycle::PodAdmitter {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-1", "labels": {"kubernetes.io/os": "linux"}},
        "status": {"allocatable": {"pods": max_pods.to_string(), "cpu": "4", "memory": "8Gi"}}
    }))
    .expect("node");
    crate::lifecycle::PodAdmitter::new(
        Arc::new(crate::lifecycle::NodeCache::new(node, None)),
        crate::lifecycle::sysctl::Allowlist::new((6, 1), &[]).expect("allowlist"),
        false,
        Arc::new(kubelet_types::events::NoopRecorder),
    )
}

fn start_with(max_pods: u32) -> Harness {
    start_admitting(admitter(max_pods))
}

fn start_admitting(admitter: crate::lifecycle::PodAdmitter) -> Harness {
    let (config, config_rx) = mpsc::channel(16);
    let (pleg_events, pleg_rx) = mpsc::channel(16);
    let h = Harness {
        probes: Arc::default(),
        results: ProbeResults::default(),
        config,
        pleg_events,
        pleg: Arc::default(),
        workers: Arc::default(),
        queue: Arc::default(),
        ready: Arc::new(SourcesReady::new([Source::File])),
        pods: PodManager::default(),
        heartbeat: Arc::default(),
        status: Arc::default(),
        stop: CancellationToken::new(),
    };
    let status = h.status.clone();
    let sync_loop = SyncLoop {
        config: config_rx,
        pleg_events: pleg_rx,
        pleg: h.pleg.clone(),
        workers: h.workers.clone(),
        queue: h.queue.clone(),
        sources_ready: h.ready.clone(),
        desired: Arc::new(h.pods.clone()),
        heartbeat: h.heartbeat.clone(),
        status: status.clone(),
        admitter: Arc::new(admitter),
        rejected: HashSet::new(),
        probes: h.probes.clone(),
        probe_updates: ProbeUpdates::subscribe(&h.results),
        orphan_cgroups: None,
    };
    tokio::spawn(sync_loop.run(h.stop.clone()));
    h
}

fn update(op: PodOperation, p: &Pod) -> PodUpdate {
    PodUpdate {
        op,
        source: Source::File,
        pods: vec![Arc::new(p.clone())],
    }
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(start_paused = true)]
async fn config_updates_record_desired_pods_and_dispatch_work() {
    let h = start();
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    assert!(h.pods.contains(&uid), "ADD records the desired pod");
    assert_eq!(h.workers.take(), vec![(uid.clone(), WorkKind::Sync)]);

    h.config.send(update(PodOperation::Update, &p)).await.ok();
    settle().await;
    assert_eq!(h.workers.take(), vec![(uid.clone(), WorkKind::Sync)]);

    let mut deleted = p.clone();
    deleted.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
    );
    h.config
        .send(update(PodOperation::Delete, &deleted))
        .await
        .ok();
    settle().await;
    assert_eq!(
        h.workers.take(),
        vec![(uid.clone(), WorkKind::Kill { remove: false })]
    );

    h.config.send(update(PodOperation::Remove, &p)).await.ok();
    settle().await;
    assert!(!h.pods.contains(&uid), "REMOVE forgets the desired pod");
    assert_eq!(
        h.workers.take(),
        vec![(uid, WorkKind::Kill { remove: true })]
    );
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn pleg_events_wake_desired_pods_only() {
    let h = start();
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    h.workers.take();
    for id in [uid.as_str(), "not-desired"] {
        h.pleg_events
            .send(PodLifecycleEvent {
                uid: id.to_string(),
                kind: EventKind::ContainerDied,
                id: "c1".into(),
            })
            .await
            .ok();
    }
    settle().await;
    assert_eq!(h.workers.take(), vec![(uid, WorkKind::Sync)]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn queued_pods_are_resynced_when_due() {
    let h = start();
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    h.workers.take();
    h.queue.enqueue(&uid, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(h.workers.take().is_empty(), "not due yet");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.workers.take(), vec![(uid, WorkKind::Sync)]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn housekeeping_cleans_up_orphans_only_once_sources_are_ready() {
    let h = start();
    h.pleg.pods.lock().insert(
        "orphan".into(),
        RuntimePod {
            name: "old".into(),
            namespace: "default".into(),
            states: HashMap::new(),
        },
    );
    tokio::time::sleep(HOUSEKEEPING_PERIOD * 2).await;
    assert!(
        h.workers.take().is_empty(),
        "nothing is cleaned up before every source reported"
    );
    assert!(h.workers.gc.load(Ordering::SeqCst) >= 2, "backoff GC runs");
    h.ready.mark(Source::File);
    tokio::time::sleep(HOUSEKEEPING_PERIOD).await;
    assert!(
        h.workers.take().is_empty(),
        "nothing is cleaned up before the loop handled every source's pods"
    );
    h.ready.mark_handled(Source::File);
    tokio::time::sleep(HOUSEKEEPING_PERIOD).await;
    let work = h.workers.take();
    assert_eq!(
        work,
        vec![("orphan".to_string(), WorkKind::Kill { remove: true })]
    );
    // Once removed and gone from the runtime, the worker is forgotten.
    h.workers.removed.lock().insert("orphan".into());
    h.pleg.pods.lock().clear();
    tokio::time::sleep(HOUSEKEEPING_PERIOD).await;
    assert_eq!(*h.workers.forgotten.lock(), vec!["orphan".to_string()]);
    assert!(h.workers.take().is_empty(), "no second kill");
    h.stop.cancel();
}

/// Upstream `sourcesReady.AddSource` after the handler: a source is handled
/// once its update's pods are admitted and in the pod manager.
#[tokio::test(start_paused = true)]
async fn a_source_is_handled_once_its_update_is() {
    let h = start();
    h.ready.mark(Source::File);
    settle().await;
    assert!(!h.ready.all_handled(), "no update handled yet");
    let p = pods::simple("handled", "busybox", "Always");
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    assert!(h.pods.contains(pod::uid(&p)));
    assert!(h.ready.all_handled());
    h.stop.cancel();
}

/// The part of the agent's host the syncloop check reads.
struct LoopHost {
    heartbeat: Arc<Heartbeat>,
}

#[async_trait::async_trait]
impl HostInterface for LoopHost {
    fn resync_interval(&self) -> Duration {
        Duration::from_secs(60)
    }

    fn latest_loop_entry_time(&self) -> Option<tokio::time::Instant> {
        self.heartbeat.latest()
    }
}

/// The real PLEG answers `runtime_pods` from memory; the fake hangs it to
/// stand for any handler that blocks the loop (upstream: a housekeeping pass
/// stuck on the runtime).
#[tokio::test(start_paused = true)]
async fn a_stalled_loop_fails_the_syncloop_check() {
    let h = start();
    let host = Arc::new(LoopHost {
        heartbeat: h.heartbeat.clone(),
    });
    let checks = kubelet_server::healthz::Checks::new(
        host.clone(),
        Arc::new(kubelet_server::healthz::LogCheck::default()),
    );
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert_eq!(checks.run("syncloop"), Some(Ok(())), "an idle loop ticks");
    assert!(host.latest_loop_entry_time().is_some());
    // Housekeeping now blocks on a runtime that never answers.
    h.pleg.hang.store(true, Ordering::SeqCst);
    h.ready.mark(Source::File);
    h.ready.mark_handled(Source::File);
    tokio::time::sleep(Duration::from_secs(299)).await;
    assert_eq!(checks.run("syncloop"), Some(Ok(())), "within 5 minutes");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        matches!(checks.run("syncloop"), Some(Err(e)) if e.starts_with("sync Loop took longer than expected")),
        "a loop stuck for over 5 minutes fails /healthz"
    );
    h.stop.cancel();
}

fn pleg_event(uid: &str) -> PodLifecycleEvent {
    PodLifecycleEvent {
        uid: uid.to_string(),
        kind: EventKind::ContainerDied,
        id: "c1".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn pods_beyond_max_pods_are_rejected_and_never_run() {
    let h = start_with(1);
    let a = pods::simple("a", "busybox", "Always");
    let b = pods::simple("b", "busybox", "Always");
    let (ua, ub) = (pod::uid(&a).to_string(), pod::uid(&b).to_string());
    h.config.send(update(PodOperation::Add, &a)).await.ok();
    h.config.send(update(PodOperation::Add, &b)).await.ok();
    settle().await;
    assert_eq!(h.workers.take(), vec![(ua, WorkKind::Sync)]);
    let s = h.status.get_pod_status(&ub).expect("rejected status");
    assert_eq!(
        (s.phase.as_deref(), s.reason.as_deref()),
        (Some("Failed"), Some("OutOfpods"))
    );
    // A rejected pod stays out: no PLEG event, tick or update runs it.
    h.pleg_events.send(pleg_event(&ub)).await.ok();
    h.queue.enqueue(&ub, Duration::ZERO);
    h.config.send(update(PodOperation::Update, &b)).await.ok();
    tokio::time::sleep(SYNC_TICK * 2).await;
    assert!(h.workers.take().is_empty(), "rejected pods never run");
    // Removing it forgets its status.
    h.config.send(update(PodOperation::Remove, &b)).await.ok();
    settle().await;
    assert!(h.status.get_pod_status(&ub).is_none());
    assert!(h.workers.take().is_empty(), "nothing to kill");
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn deleted_pods_are_not_synced_by_the_tick_or_the_pleg() {
    let h = start();
    let mut p = pods::simple("web", "busybox", "Always");
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now(),
    ));
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    assert_eq!(
        h.workers.take(),
        vec![(uid.clone(), WorkKind::Kill { remove: false })],
        "a pod added while deleted is killed, not synced"
    );
    h.pleg_events.send(pleg_event(&uid)).await.ok();
    h.queue.enqueue(&uid, Duration::ZERO);
    tokio::time::sleep(SYNC_TICK * 2).await;
    assert!(h.workers.take().is_empty(), "no sync of a deleted pod");
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn housekeeping_resyncs_a_removed_pod_that_came_back() {
    let h = start();
    h.ready.mark(Source::File);
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    h.workers.take();
    // The manifest was removed and put back with the same UID while the
    // removal was pending: the worker ended removed, the pod is desired.
    h.workers.removed.lock().insert(uid.clone());
    tokio::time::sleep(HOUSEKEEPING_PERIOD).await;
    assert_eq!(h.workers.take(), vec![(uid, WorkKind::Sync)]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn probe_workers_follow_the_pod_and_results_sync_it_at_once() {
    let h = start();
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    assert_eq!(h.probes.take(), vec![("add", uid.clone())]);
    h.workers.take();

    // A status with the container, as the pod's first sync would leave it.
    let status: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(serde_json::json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}],
        "containerStatuses": [{"name": pod::containers(&p)[0].name, "image": "busybox", "imageID": "",
            "ready": false, "restartCount": 0, "started": true,
            "containerID": "containerd://cid-1", "state": {"running": {}}}]
    }))
    .expect("status");
    h.status.set_pod_status(&uid, status);

    // Readiness: the status flips at once and the pod is synced, no tick needed.
    h.results.readiness.set("cid-1", ProbeResult::Success, &uid);
    settle().await;
    assert_eq!(h.workers.take(), vec![(uid.clone(), WorkKind::Sync)]);
    let s = h.status.get_pod_status(&uid).expect("status");
    let cs = &s.container_statuses.as_ref().expect("containers")[0];
    assert!(cs.ready, "readiness reached the container status");
    let ready = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, "True", "and the Ready condition");

    // Liveness: only a failure syncs the pod.
    h.results.liveness.set("cid-1", ProbeResult::Success, &uid);
    settle().await;
    assert!(
        h.workers.take().is_empty(),
        "a liveness success is not news"
    );
    h.results.liveness.set("cid-1", ProbeResult::Failure, &uid);
    settle().await;
    assert_eq!(h.workers.take(), vec![(uid.clone(), WorkKind::Sync)]);

    // Results for pods the kubelet does not know are dropped.
    h.results
        .startup
        .set("cid-x", ProbeResult::Success, "nobody");
    settle().await;
    assert!(h.workers.take().is_empty());

    let mut deleted = p.clone();
    deleted.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
    );
    h.config
        .send(update(PodOperation::Delete, &deleted))
        .await
        .ok();
    settle().await;
    assert_eq!(h.probes.take(), vec![("stop", uid.clone())]);
    h.config.send(update(PodOperation::Remove, &p)).await.ok();
    settle().await;
    assert_eq!(h.probes.take(), vec![("remove", uid.clone())]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn housekeeping_stops_probe_workers_of_pods_nobody_wants() {
    let h = start();
    let p = pods::simple("web", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    h.ready.mark(Source::File);
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    tokio::time::sleep(HOUSEKEEPING_PERIOD * 2).await;
    let cleanups: Vec<_> = h
        .probes
        .take()
        .into_iter()
        .filter(|(k, _)| *k == "cleanup")
        .collect();
    assert!(
        cleanups.iter().all(|(_, d)| *d == uid) && !cleanups.is_empty(),
        "cleanup keeps exactly the desired pods: {cleanups:?}"
    );
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_readiness_gate_turning_true_resyncs_the_pod() {
    let h = start();
    let mut p = pods::simple("gated", "busybox", "Always");
    let uid = pod::uid(&p).to_string();
    let c = pod::containers(&p)[0].name.clone();
    p.spec.as_mut().expect("spec").readiness_gates =
        Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
    let status = |gate: &str, ready: &str| -> k8s_openapi::api::core::v1::PodStatus {
        serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": ready}, {"type": "example.com/lb", "status": gate}],
            "containerStatuses": [{"name": c, "image": "busybox", "imageID": "", "ready": true,
                "restartCount": 0, "started": true, "state": {"running": {}}}]
        }))
        .expect("status")
    };
    h.config.send(update(PodOperation::Add, &p)).await.ok();
    settle().await;
    h.workers.take();
    // Others' condition is still False, and Ready says so: nothing to do.
    p.status = Some(status("False", "False"));
    h.config
        .send(update(PodOperation::Reconcile, &p))
        .await
        .ok();
    settle().await;
    assert!(h.workers.take().is_empty());
    // The gate turned True: Ready must be recomputed by a sync.
    p.status = Some(status("True", "False"));
    h.config
        .send(update(PodOperation::Reconcile, &p))
        .await
        .ok();
    settle().await;
    assert_eq!(h.workers.take(), vec![(uid, WorkKind::Sync)]);
    h.stop.cancel();
}
