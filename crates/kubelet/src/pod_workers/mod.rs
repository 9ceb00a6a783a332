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
mod tests;
