//! One worker task per pod UID (upstream `pkg/kubelet/pod_workers.go`).
//!
//! Invariant: at most one sync or kill of a pod runs at a time. Updates that
//! arrive while a worker is busy collapse into one pending slot, latest wins,
//! except that a pending kill is never replaced by a sync. After each piece of
//! work the worker puts the pod back on the [`WorkQueue`]: at the end of a
//! backoff window, after an error, or after the resync interval with jitter.
//!
//! Work in progress can be cut short, as upstream cancels a pod's sync
//! context: a kill cancels a running sync, and a kill with a shorter grace
//! period (a second delete, or a force delete with grace 0) cancels a running
//! kill, which restarts at once with the shorter grace period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kubelet_metrics::{KubeletMetrics, pod_worker_operation};
use kubelet_types::pod;
use parking_lot::Mutex;
use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, warn};

use crate::error::Error;

/// Upstream `backOffPeriod`: retry a failed sync after this long.
pub const ERROR_BACKOFF: Duration = Duration::from_secs(10);

/// What to do with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkKind {
    /// Bring the runtime to the pod's spec.
    Sync,
    /// Stop the pod's containers and sandbox; with `remove`, delete them too.
    Kill {
        /// Also remove containers, sandboxes and logs (the pod is gone for good).
        remove: bool,
    },
}

/// One unit of work for a pod worker.
#[derive(Clone, Debug)]
pub struct PodWork {
    /// Sync or kill.
    pub kind: WorkKind,
    /// The pod, as currently desired (or a stub built from runtime labels for orphans).
    pub pod: Arc<Pod>,
}

/// Result of a sync, as the worker needs it.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    /// The sync failed: retry after [`ERROR_BACKOFF`] (or `requeue_after` if sooner).
    pub error: Option<Error>,
    /// Sync again after this long.
    pub requeue_after: Option<Duration>,
}

/// The pod sync implementation the workers call (upstream `Kubelet.syncPod` / `killPod`).
#[async_trait::async_trait]
pub trait PodSyncer: Send + Sync + 'static {
    /// Syncs a desired pod.
    async fn sync_pod(&self, pod: &Arc<Pod>) -> SyncOutcome;
    /// Kills (and with `remove`, removes) a pod.
    async fn kill_pod(&self, pod: &Arc<Pod>, remove: bool) -> Result<(), Error>;
    /// Forgets expired crash-loop and pull backoff entries (upstream `backOff.GC`).
    fn gc_backoff(&self) {}
    /// Forgets what the syncer keeps of a pod whose worker is gone.
    fn forget(&self, _uid: &str) {}
}

/// The pod workers as the sync loop drives them (upstream `PodWorkers`).
pub trait PodWorkers: Send + Sync {
    /// Hands work to the pod's worker, starting one if needed (upstream `UpdatePod`).
    fn update_pod(&self, work: PodWork);
    /// True when the pod has a worker.
    fn has_worker(&self, uid: &str) -> bool;
    /// UIDs with a worker.
    fn uids(&self) -> Vec<String>;
    /// True when the pod's last work was a completed removal and nothing is pending.
    fn is_removed(&self, uid: &str) -> bool;
    /// Stops and forgets the worker of a pod that is gone (upstream `ForgetWorker`).
    fn forget(&self, uid: &str);
    /// Housekeeping of the syncer's backoff state.
    fn gc_backoff(&self);
}

/// Pods due for a sync at a given time (upstream `queue.WorkQueue`).
#[derive(Default)]
pub struct WorkQueue {
    due: Mutex<HashMap<String, Instant>>,
}

impl WorkQueue {
    /// Puts `uid` on the queue, due after `delay` (replacing an earlier entry).
    pub fn enqueue(&self, uid: &str, delay: Duration) {
        self.due
            .lock()
            .insert(uid.to_string(), Instant::now() + delay);
    }

    /// Takes every UID due by now.
    pub fn take_due(&self) -> Vec<String> {
        let now = Instant::now();
        let mut due = self.due.lock();
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for u in &ready {
            due.remove(u);
        }
        ready
    }

    /// Forgets a pod.
    pub fn remove(&self, uid: &str) {
        self.due.lock().remove(uid);
    }

    /// Number of queued pods.
    pub fn len(&self) -> usize {
        self.due.lock().len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The work a worker is doing now, so newer work can cut it short.
struct InFlight {
    kind: WorkKind,
    grace: Duration,
    cancel: CancellationToken,
}

struct Slot {
    pending: Mutex<Option<PodWork>>,
    in_flight: Mutex<Option<InFlight>>,
    wake: Notify,
    stop: CancellationToken,
    /// Set once a `Kill { remove: true }` finished: the worker may be forgotten.
    removed: Mutex<bool>,
}

/// True when `new` must cut the work in flight short: a kill cancels a sync,
/// and a kill with a shorter grace period cancels a longer kill.
fn preempts(new: &PodWork, running: &InFlight) -> bool {
    match (&new.kind, &running.kind) {
        (WorkKind::Kill { .. }, WorkKind::Sync) => true,
        (WorkKind::Kill { .. }, WorkKind::Kill { .. }) => {
            pod::grace_period(&new.pod) < running.grace
        }
        (WorkKind::Sync, _) => false,
    }
}

/// A kill arriving for a pod that is already being killed (in flight, or
/// pending) is merged into it, as upstream's `calculateEffectiveGracePeriod`:
/// once a pod is terminating its grace period can only decrease, and a
/// removal asked for once is never dropped.
fn merge_kill(new: PodWork, pending: Option<&PodWork>, running: Option<&InFlight>) -> PodWork {
    let WorkKind::Kill { remove } = new.kind else {
        return new;
    };
    let mut remove = remove;
    let mut pod = new.pod;
    if let Some(PodWork {
        kind: WorkKind::Kill { remove: r },
        pod: p,
    }) = pending
    {
        remove |= *r;
        if pod::grace_period(p) < pod::grace_period(&pod) {
            pod = p.clone();
        }
    }
    if let Some(InFlight {
        kind: WorkKind::Kill { remove: r },
        grace,
        ..
    }) = running
    {
        remove |= *r;
        if *grace < pod::grace_period(&pod) {
            let mut shorter = (*pod).clone();
            shorter.metadata.deletion_grace_period_seconds =
                Some(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX));
            pod = Arc::new(shorter);
        }
    }
    PodWork {
        kind: WorkKind::Kill { remove },
        pod,
    }
}

/// The set of pod workers: one task per pod on the shared task tracker.
pub struct AsyncPodWorkers {
    workers: Mutex<HashMap<String, Arc<Slot>>>,
    syncer: Arc<dyn PodSyncer>,
    queue: Arc<WorkQueue>,
    resync: Duration,
    stop: CancellationToken,
    tasks: TaskTracker,
    metrics: Option<Arc<KubeletMetrics>>,
}

fn jittered(d: Duration) -> Duration {
    // Upstream workerResyncIntervalJitterFactor = 0.5.
    d + d.mul_f64(rand::rng().random_range(0.0..0.5))
}

impl AsyncPodWorkers {
    /// Workers that call `syncer`, requeue on `queue` and resync every
    /// `resync` (with jitter); each runs on `tasks` until `stop`.
    pub fn new(
        syncer: Arc<dyn PodSyncer>,
        queue: Arc<WorkQueue>,
        resync: Duration,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            workers: Mutex::new(HashMap::new()),
            syncer,
            queue,
            resync,
            stop,
            tasks,
            metrics: None,
        }
    }

    /// Observes each completed sync and kill in `kubelet_pod_worker_duration_seconds`.
    pub fn with_metrics(mut self, metrics: Arc<KubeletMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

/// Observes one completed piece of work (upstream observes
/// `PodWorkerDuration` with the update type once the work completes).
fn observe(metrics: Option<&KubeletMetrics>, operation: &'static str, start: Instant) {
    if let Some(m) = metrics {
        m.observe_pod_worker(operation, start.elapsed());
    }
}

impl PodWorkers for AsyncPodWorkers {
    fn update_pod(&self, work: PodWork) {
        let uid = pod::uid(&work.pod).to_string();
        let mut workers = self.workers.lock();
        if let Some(slot) = workers.get(&uid) {
            {
                let mut pending = slot.pending.lock();
                let keep_kill = matches!(
                    pending.as_ref().map(|w| &w.kind),
                    Some(WorkKind::Kill { .. })
                ) && work.kind == WorkKind::Sync;
                let in_flight = slot.in_flight.lock();
                let work = merge_kill(work, pending.as_ref(), in_flight.as_ref());
                if let Some(running) = in_flight.as_ref()
                    && preempts(&work, running)
                {
                    info!(grace = ?pod::grace_period(&work.pod), "Cutting the pod's work in progress short");
                    running.cancel.cancel();
                }
                drop(in_flight);
                if !keep_kill {
                    *pending = Some(work);
                }
            }
            *slot.removed.lock() = false;
            slot.wake.notify_one();
            return;
        }
        let slot = Arc::new(Slot {
            pending: Mutex::new(Some(work.clone())),
            in_flight: Mutex::new(None),
            wake: Notify::new(),
            stop: self.stop.child_token(),
            removed: Mutex::new(false),
        });
        slot.wake.notify_one();
        let span = crate::pod_start::pod_worker_span(&work.pod);
        self.tasks.spawn(
            run_worker(
                slot.clone(),
                self.syncer.clone(),
                self.queue.clone(),
                self.resync,
                self.metrics.clone(),
            )
            .instrument(span),
        );
        workers.insert(uid, slot);
    }

    fn has_worker(&self, uid: &str) -> bool {
        self.workers.lock().contains_key(uid)
    }

    fn uids(&self) -> Vec<String> {
        self.workers.lock().keys().cloned().collect()
    }

    fn is_removed(&self, uid: &str) -> bool {
        self.workers
            .lock()
            .get(uid)
            .is_some_and(|s| *s.removed.lock() && s.pending.lock().is_none())
    }

    fn forget(&self, uid: &str) {
        if let Some(slot) = self.workers.lock().remove(uid) {
            slot.stop.cancel();
        }
        self.queue.remove(uid);
        self.syncer.forget(uid);
    }

    fn gc_backoff(&self) {
        self.syncer.gc_backoff();
    }
}

async fn run_worker(
    slot: Arc<Slot>,
    syncer: Arc<dyn PodSyncer>,
    queue: Arc<WorkQueue>,
    resync: Duration,
    metrics: Option<Arc<KubeletMetrics>>,
) {
    let mut synced_once = false;
    loop {
        tokio::select! {
            biased;
            () = slot.stop.cancelled() => return,
            () = slot.wake.notified() => {}
        }
        // Drain: the slot may have been refilled while we worked.
        loop {
            // Take the work and publish it as in flight under the pending
            // lock, so an update either lands in `pending` or cancels this.
            if slot.stop.is_cancelled() {
                return;
            }
            let cancel = slot.stop.child_token();
            let next = {
                let mut pending = slot.pending.lock();
                let next = pending.take();
                *slot.in_flight.lock() = next.as_ref().map(|w| InFlight {
                    kind: w.kind.clone(),
                    grace: pod::grace_period(&w.pod),
                    cancel: cancel.clone(),
                });
                next
            };
            let Some(work) = next else { break };
            let uid = pod::uid(&work.pod).to_string();
            let started = Instant::now();
            match work.kind {
                WorkKind::Sync => {
                    let out = tokio::select! {
                        out = syncer.sync_pod(&work.pod) => out,
                        () = cancel.cancelled() => {
                            if slot.stop.is_cancelled() {
                                return;
                            }
                            info!("Sync cut short by newer work");
                            continue;
                        }
                    };
                    let operation = if synced_once {
                        pod_worker_operation::SYNC
                    } else {
                        pod_worker_operation::CREATE
                    };
                    synced_once = true;
                    observe(metrics.as_deref(), operation, started);
                    let mut next = jittered(resync);
                    if let Some(e) = &out.error {
                        warn!(error = %e, reason = e.reason(), "Error syncing pod, skipping");
                        next = next.min(ERROR_BACKOFF);
                    }
                    if let Some(r) = out.requeue_after {
                        next = next.min(r);
                    }
                    debug!(?next, "Pod synced; requeued");
                    queue.enqueue(&uid, next);
                }
                WorkKind::Kill { remove } => match tokio::select! {
                    r = syncer.kill_pod(&work.pod, remove) => r,
                    () = cancel.cancelled() => {
                        if slot.stop.is_cancelled() {
                            return;
                        }
                        info!("Kill cut short by a shorter grace period");
                        continue;
                    }
                } {
                    Ok(()) => {
                        observe(metrics.as_deref(), pod_worker_operation::KILL, started);
                        queue.remove(&uid);
                        *slot.removed.lock() = remove;
                    }
                    Err(e) => {
                        observe(metrics.as_deref(), pod_worker_operation::KILL, started);
                        warn!(error = %e, reason = e.reason(), "Error killing pod; will retry");
                        // Retry the kill unless newer work arrived meanwhile.
                        {
                            let mut pending = slot.pending.lock();
                            if pending.is_none() {
                                *pending = Some(work.clone());
                            }
                        }
                        tokio::select! {
                            biased;
                            () = slot.stop.cancelled() => return,
                            () = cancel.cancelled() => {}
                            () = tokio::time::sleep(ERROR_BACKOFF) => {}
                        }
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Records calls; each sync takes 100ms of (paused) time.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<(String, String)>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        fail: Mutex<bool>,
        /// Syncs take this long instead of 100ms.
        slow_sync: Mutex<Option<Duration>>,
        /// Kills take the pod's grace period, as a stop that waits it out.
        kill_waits_grace: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl PodSyncer for Recorder {
        async fn sync_pod(&self, p: &Arc<Pod>) -> SyncOutcome {
            let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(n, Ordering::SeqCst);
            let took = self.slow_sync.lock().unwrap_or(Duration::from_millis(100));
            tokio::time::sleep(took).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let image = pod::containers(p)[0].image.clone().unwrap_or_default();
            self.calls.lock().push(("sync".into(), image));
            SyncOutcome {
                error: self.fail.lock().then(|| Error::Sync(vec![])),
                requeue_after: None,
            }
        }
        async fn kill_pod(&self, p: &Arc<Pod>, remove: bool) -> Result<(), Error> {
            let took = if self.kill_waits_grace.load(Ordering::SeqCst) {
                pod::grace_period(p)
            } else {
                Duration::from_millis(100)
            };
            tokio::time::sleep(took).await;
            self.calls.lock().push(("kill".into(), remove.to_string()));
            Ok(())
        }
    }

    fn pod(image: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "uid": "u1"},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }))
            .expect("pod"),
        )
    }

    fn sync(image: &str) -> PodWork {
        PodWork {
            kind: WorkKind::Sync,
            pod: pod(image),
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn completed_work_is_observed_by_operation_type() {
        let rec = Arc::new(Recorder::default());
        let metrics = Arc::new(KubeletMetrics::new());
        let w = AsyncPodWorkers::new(
            rec.clone(),
            Arc::new(WorkQueue::default()),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        )
        .with_metrics(metrics.clone());
        for work in [sync("v0"), sync("v1"), kill(&pod("v1"), None)] {
            w.update_pod(work);
            settle().await;
        }
        let f = kubelet_metrics::parse::parse(&metrics.render()).expect("parses");
        let count = |op: &str| {
            f["kubelet_pod_worker_duration_seconds"]
                .samples
                .iter()
                .find(|s| s.name.ends_with("_count") && s.label("operation_type") == Some(op))
                .map(|s| s.value)
        };
        assert_eq!(count("create"), Some(1.0));
        assert_eq!(count("sync"), Some(1.0));
        assert_eq!(count("kill"), Some(1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn updates_coalesce_latest_wins_one_at_a_time() {
        let rec = Arc::new(Recorder::default());
        let q = Arc::new(WorkQueue::default());
        let w = AsyncPodWorkers::new(
            rec.clone(),
            q.clone(),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        w.update_pod(sync("v0"));
        tokio::time::sleep(Duration::from_millis(10)).await; // v0 is now being synced
        for i in 1..=50 {
            w.update_pod(sync(&format!("v{i}")));
        }
        settle().await;
        let calls = rec.calls.lock().clone();
        assert_eq!(
            calls,
            vec![("sync".into(), "v0".into()), ("sync".into(), "v50".into())]
        );
        assert_eq!(rec.max_in_flight.load(Ordering::SeqCst), 1);
        assert_eq!(q.len(), 1, "requeued for resync");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_kill_is_never_overwritten_by_a_sync() {
        let rec = Arc::new(Recorder::default());
        let q = Arc::new(WorkQueue::default());
        let w = AsyncPodWorkers::new(
            rec.clone(),
            q.clone(),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        w.update_pod(sync("v0"));
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.update_pod(PodWork {
            kind: WorkKind::Kill { remove: true },
            pod: pod("v0"),
        });
        w.update_pod(sync("v1"));
        settle().await;
        let calls = rec.calls.lock().clone();
        // Issue 7 fix 4.10: the kill cuts the in-flight sync of v0 short (as
        // upstream cancels the sync context), and the later sync of v1 never
        // replaces the pending kill.
        assert_eq!(calls, vec![("kill".into(), "true".into())]);
        assert!(w.is_removed("u1"));
        assert_eq!(q.len(), 0);
        w.forget("u1");
        assert!(!w.has_worker("u1"));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_syncs_retry_after_backoff_and_resync_has_jitter() {
        let rec = Arc::new(Recorder::default());
        *rec.fail.lock() = true;
        let q = Arc::new(WorkQueue::default());
        let w = AsyncPodWorkers::new(
            rec.clone(),
            q.clone(),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        w.update_pod(sync("v0"));
        settle().await;
        assert!(q.take_due().is_empty());
        tokio::time::advance(ERROR_BACKOFF).await;
        assert_eq!(q.take_due(), vec!["u1".to_string()]);
        *rec.fail.lock() = false;
        w.update_pod(sync("v0"));
        settle().await;
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(q.take_due().is_empty(), "not before the resync interval");
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(
            q.take_due(),
            vec!["u1".to_string()],
            "due within interval + 50% jitter"
        );
    }

    fn kill(p: &Arc<Pod>, grace_seconds: Option<i64>) -> PodWork {
        let mut p = (**p).clone();
        p.metadata.deletion_grace_period_seconds = grace_seconds;
        PodWork {
            kind: WorkKind::Kill { remove: false },
            pod: Arc::new(p),
        }
    }

    fn kills_done(rec: &Recorder) -> usize {
        rec.calls.lock().iter().filter(|(k, _)| k == "kill").count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_grace_period_cuts_a_kill_in_progress_short() {
        let rec = Arc::new(Recorder::default());
        rec.kill_waits_grace.store(true, Ordering::SeqCst);
        let w = AsyncPodWorkers::new(
            rec.clone(),
            Arc::new(WorkQueue::default()),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        let p = pod("busybox");
        w.update_pod(kill(&p, Some(30)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A second delete with a longer grace period changes nothing.
        w.update_pod(kill(&p, Some(60)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(kills_done(&rec), 0);
        // A second delete with 5s restarts the kill with 5s.
        w.update_pod(kill(&p, Some(5)));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(kills_done(&rec), 1, "done after 5s, not 30s");
        // A force delete (grace 0) kills at once (the runtime's minimum).
        w.update_pod(kill(&p, Some(30)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        w.update_pod(kill(&p, Some(0)));
        tokio::time::sleep(kubelet_types::pod::MIN_GRACE_PERIOD + Duration::from_millis(100)).await;
        assert_eq!(kills_done(&rec), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_cuts_a_running_sync_short() {
        let rec = Arc::new(Recorder::default());
        *rec.slow_sync.lock() = Some(Duration::from_secs(600));
        let w = AsyncPodWorkers::new(
            rec.clone(),
            Arc::new(WorkQueue::default()),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        let p = pod("busybox");
        w.update_pod(sync("busybox"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        w.update_pod(kill(&p, None));
        w.update_pod(sync("busybox"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            kills_done(&rec),
            1,
            "the kill did not wait for the 10-minute sync"
        );
        assert!(
            !rec.calls.lock().iter().any(|(k, _)| k == "sync"),
            "the cut sync never completed, and no sync replaced the pending kill"
        );
    }

    /// Once a pod is terminating its grace period only decreases, and a
    /// removal asked for once sticks (upstream `calculateEffectiveGracePeriod`).
    #[tokio::test(start_paused = true)]
    async fn merged_kills_keep_the_shortest_grace_and_the_removal() {
        let rec = Arc::new(Recorder::default());
        rec.kill_waits_grace.store(true, Ordering::SeqCst);
        let w = AsyncPodWorkers::new(
            rec.clone(),
            Arc::new(WorkQueue::default()),
            Duration::from_secs(60),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        let p = pod("busybox");
        let mut remove = kill(&p, Some(10));
        remove.kind = WorkKind::Kill { remove: true };
        w.update_pod(remove);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A later delete with a longer grace and no removal: neither sticks.
        w.update_pod(kill(&p, Some(300)));
        // The first kill ends at 10s; the merged one takes 10s more, not 300s.
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            *rec.calls.lock(),
            vec![
                ("kill".to_string(), "true".to_string()),
                ("kill".to_string(), "true".to_string())
            ],
            "the second kill ran with the removal"
        );
        assert!(w.is_removed("u1"));
        let merged = merge_kill(kill(&p, Some(300)), Some(&kill(&p, Some(5))), None);
        assert_eq!(pod::grace_period(&merged.pod), Duration::from_secs(5));
    }
}
