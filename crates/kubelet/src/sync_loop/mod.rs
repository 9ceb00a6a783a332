//! The sync loop (upstream `kubelet.go` `syncLoop` / `syncLoopIteration`): one
//! `select!` over pod config updates, PLEG events, probe results, a 1s tick that dispatches
//! pods due on the work queue, and housekeeping every 2s that stops and
//! removes pods no source wants (only once every source has reported).
//!
//! The loop depends on its collaborators through traits: [`Pleg`] (the
//! runtime's pods as of the last relist), [`PodWorkers`] (the pod syncer) and
//! [`Manager`] (desired pods), so it is unit-tested on paused time with fakes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kubelet_runtime::pleg::{GenericPleg, PodLifecycleEvent, RuntimePod};
use kubelet_types::{PodOperation, PodUpdate, pod};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::lifecycle::PodAdmitter;
use crate::pod_manager::Manager;
use crate::pod_workers::{PodWork, PodWorkers, WorkKind, WorkQueue};
use crate::prober::ProbeManager;
use crate::status::StatusManager;
use kubelet_podconfig::SourcesReady;
use kubelet_runtime::prober_results::{ProbeResult, ProbeResults, Update};

/// Upstream sync tick.
pub const SYNC_TICK: Duration = Duration::from_secs(1);
/// Upstream housekeeping period.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// How long the loop waits quietly for the runtime's first ready answer
/// before saying so.
const RUNTIME_WAIT_LOG: Duration = Duration::from_secs(5);

/// When the loop last started an iteration, for `/healthz` (upstream
/// `syncLoopMonitor` / `LatestLoopEntryTime`).
#[derive(Debug)]
pub struct Heartbeat {
    origin: Instant,
    /// Milliseconds after `origin` of the last iteration; `u64::MAX` before the first.
    last_ms: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(u64::MAX),
        }
    }
}

impl Heartbeat {
    fn beat(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// When the loop last started an iteration; `None` before the first.
    pub fn latest(&self) -> Option<Instant> {
        match self.last_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(self.origin + Duration::from_millis(ms)),
        }
    }
}

/// What the loop reads of the PLEG (upstream `PodLifecycleEventGenerator`
/// and the runtime pod cache housekeeping reads).
#[async_trait::async_trait]
pub trait Pleg: Send + Sync {
    /// Pods the runtime had at the last relist, by UID.
    async fn runtime_pods(&self) -> Arc<HashMap<String, RuntimePod>>;
    /// Whether [`Self::runtime_pods`] is the runtime's answer yet (a relist
    /// succeeded), not the empty map of a PLEG that never listed.
    fn has_relisted(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl Pleg for GenericPleg {
    async fn runtime_pods(&self) -> Arc<HashMap<String, RuntimePod>> {
        GenericPleg::runtime_pods(self)
    }

    fn has_relisted(&self) -> bool {
        GenericPleg::has_relisted(self)
    }
}

/// The loop's inputs and collaborators.
pub struct SyncLoop {
    /// Merged pod updates.
    pub config: mpsc::Receiver<PodUpdate>,
    /// PLEG events.
    pub pleg_events: mpsc::Receiver<PodLifecycleEvent>,
    /// The PLEG (for the pods the runtime has).
    pub pleg: Arc<dyn Pleg>,
    /// Pod workers.
    pub workers: Arc<dyn PodWorkers>,
    /// The work queue the workers requeue on.
    pub queue: Arc<WorkQueue>,
    /// Whether every source reported; the loop records each source whose
    /// update it handled.
    pub sources_ready: Arc<SourcesReady>,
    /// Desired pods.
    pub desired: Arc<dyn Manager>,
    /// Liveness of the loop.
    pub heartbeat: Arc<Heartbeat>,
    /// Pod statuses (rejected pods get theirs here).
    pub status: Arc<StatusManager>,
    /// Pod admission (`maxPods` and the other predicates).
    pub admitter: Arc<PodAdmitter>,
    /// Pods refused at admission; never run.
    pub rejected: HashSet<String>,
    /// The prober: workers start for admitted pods and stop with them.
    pub probes: Arc<dyn ProbeManager>,
    /// Changed probe results.
    pub probe_updates: ProbeUpdates,
    /// Removes the cgroups of pods that are definitely not running
    /// (upstream `cleanupOrphanedPodCgroups`); `None` without `cgroupsPerQOS`.
    pub orphan_cgroups: Option<Arc<dyn OrphanPodCgroups>>,
}

/// Upstream `Kubelet.cleanupOrphanedPodCgroups`: the pod cgroups on disk
/// whose pods are not in `possibly_running` are removed (what is left in
/// them killed first).
#[async_trait::async_trait]
pub trait OrphanPodCgroups: Send + Sync {
    /// Starts one pass and returns (upstream destroys in goroutines): the
    /// loop never waits for cgroup IO or systemd.
    async fn cleanup(&self, possibly_running: HashSet<String>);
}

/// Housekeeping passes between two orphaned pod cgroup cleanups: upstream
/// cleans at every pass (2 s); here every 30 s, one directory listing per
/// QoS tier, so that an idle node stays quiet (nothing waits for it).
const ORPHAN_CGROUP_PASSES: u32 = 15;

/// The streams of changed probe results (upstream `livenessManager.Updates()`,
/// `readinessManager.Updates()`, `startupManager.Updates()`).
pub struct ProbeUpdates {
    liveness: mpsc::UnboundedReceiver<Update>,
    readiness: mpsc::UnboundedReceiver<Update>,
    startup: mpsc::UnboundedReceiver<Update>,
}

impl ProbeUpdates {
    /// Subscribes to the three result managers (the loop is their one consumer).
    pub fn subscribe(results: &ProbeResults) -> Self {
        Self {
            liveness: results.liveness.updates(),
            readiness: results.readiness.updates(),
            startup: results.startup.updates(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

/// Upstream `status.NeedToReconcilePodReadiness`: the pod has readiness
/// gates and its Ready condition, recomputed from its current status,
/// differs from the one it carries.
fn need_to_reconcile_pod_readiness(p: &Pod) -> bool {
    let gates = p
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let Some(status) = p.status.as_ref().filter(|_| gates) else {
        return false;
    };
    let conditions = status.conditions.clone().unwrap_or_default();
    let all: Vec<_> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .cloned()
        .collect();
    let phase = status
        .phase
        .as_deref()
        .and_then(|ph| ph.parse::<kubelet_types::PodPhase>().ok())
        .unwrap_or(kubelet_types::PodPhase::Pending);
    let want = crate::status::conditions::pod_ready(p, &conditions, &all, phase);
    let have = conditions.iter().find(|c| c.type_ == "Ready");
    have.is_none_or(|c| c.status != want.status)
}

fn orphan_stub(uid: &str, name: &str, namespace: &str) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.to_string());
    p.metadata.name = Some(name.to_string());
    p.metadata.namespace = Some(namespace.to_string());
    Arc::new(p)
}

impl SyncLoop {
    fn dispatch(&self, kind: WorkKind, p: Arc<Pod>) {
        self.workers.update_pod(PodWork { kind, pod: p });
    }

    /// Pods admitted and not finished (upstream `filterOutTerminatedPods`).
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.desired
            .get_pods()
            .into_iter()
            .filter(|p| !self.rejected.contains(pod::uid(p)))
            .filter(|p| {
                let phase = self
                    .status
                    .get_pod_status(pod::uid(p))
                    .and_then(|s| s.phase);
                !phase
                    .and_then(|p| p.parse::<kubelet_types::PodPhase>().ok())
                    .is_some_and(kubelet_types::PodPhase::is_terminal)
            })
            .collect()
    }

    fn handle_config(&mut self, u: PodUpdate) {
        debug!(op = ?u.op, source = %u.source, n = u.pods.len(), "SyncLoop config update");
        match u.op {
            PodOperation::Add | PodOperation::Update => {
                for p in u.pods {
                    let verb = if u.op == PodOperation::Add {
                        "ADD"
                    } else {
                        "UPDATE"
                    };
                    info!(pod = %pod::describe(&p), source = %u.source, "SyncLoop {verb}");
                    let uid = pod::uid(&p).to_string();
                    if self.rejected.contains(&uid) {
                        self.desired.add_pod(p);
                        continue;
                    }
                    let is_new = !self.desired.contains(&uid);
                    let admitted = || {
                        let active = self.active_pods();
                        let others: Vec<&Pod> = active.iter().map(AsRef::as_ref).collect();
                        self.admitter.admit(&p, &others)
                    };
                    if u.op == PodOperation::Add
                        && is_new
                        && p.metadata.deletion_timestamp.is_none()
                        && let Err(r) = admitted()
                    {
                        tracing::warn!(pod = %pod::describe(&p), reason = %r.0, message = %r.1,
                            "Pod rejected at admission");
                        self.status
                            .set_pod_status(&uid, self.admitter.reject(&p, &r));
                        self.rejected.insert(uid.clone());
                        self.desired.add_pod(p);
                        continue;
                    }
                    self.desired.add_pod(p.clone());
                    let kind = if p.metadata.deletion_timestamp.is_some() {
                        self.probes.stop_liveness_and_startup(&p);
                        WorkKind::Kill { remove: false }
                    } else {
                        // Idempotent: an UPDATE of a pod first seen after a restart also gets its workers.
                        self.probes.add_pod(&p);
                        WorkKind::Sync
                    };
                    self.dispatch(kind, p);
                }
            }
            PodOperation::Delete => {
                for p in u.pods {
                    info!(pod = %pod::describe(&p), "SyncLoop DELETE");
                    if self.rejected.contains(pod::uid(&p)) {
                        continue;
                    }
                    self.desired.add_pod(p.clone());
                    self.probes.stop_liveness_and_startup(&p);
                    self.dispatch(WorkKind::Kill { remove: false }, p);
                }
            }
            PodOperation::Remove => {
                for p in u.pods {
                    info!(pod = %pod::describe(&p), "SyncLoop REMOVE");
                    self.desired.remove_pod(pod::uid(&p));
                    self.probes.remove_pod(&p);
                    if self.rejected.remove(pod::uid(&p)) {
                        self.status.remove(pod::uid(&p));
                        continue;
                    }
                    self.dispatch(WorkKind::Kill { remove: true }, p);
                }
            }
            PodOperation::Reconcile => {
                for p in u.pods {
                    self.desired.add_pod(p.clone());
                    // Upstream `HandlePodReconcile`: a status change from
                    // others (a readiness gate's condition) that changes Ready.
                    if !self.rejected.contains(pod::uid(&p))
                        && p.metadata.deletion_timestamp.is_none()
                        && need_to_reconcile_pod_readiness(&p)
                    {
                        debug!(pod = %pod::describe(&p), "SyncLoop RECONCILE: readiness gates changed");
                        self.dispatch(WorkKind::Sync, p);
                    }
                }
            }
            PodOperation::Set => {}
        }
    }

    fn handle_pleg(&self, ev: &PodLifecycleEvent) {
        if self.rejected.contains(&ev.uid) {
            return;
        }
        let p = self.desired.get_pod_by_uid(&ev.uid);
        if let Some(p) = p
            && p.metadata.deletion_timestamp.is_none()
        {
            debug!(pod = %pod::describe(&p), event = ?ev.kind, "SyncLoop (PLEG)");
            self.dispatch(WorkKind::Sync, p);
        }
    }

    /// Upstream `handleProbeSync`: readiness and startup changes go to the
    /// status at once; any change (a liveness one only when failed) syncs the pod.
    fn handle_probe(&self, kind: ProbeKind, u: Update) {
        let Some(p) = self.desired.get_pod_by_uid(&u.pod_uid) else {
            return;
        };
        let ok = u.result == ProbeResult::Success;
        match kind {
            ProbeKind::Liveness if u.result != ProbeResult::Failure => return,
            ProbeKind::Liveness => {}
            ProbeKind::Readiness => {
                self.status.set_container_readiness(&p, &u.container_id, ok);
            }
            ProbeKind::Startup => {
                self.status.set_container_startup(&p, &u.container_id, ok);
            }
        }
        if self.rejected.contains(&u.pod_uid) || p.metadata.deletion_timestamp.is_some() {
            return;
        }
        debug!(pod = %pod::describe(&p), probe = ?kind, result = u.result.as_str(),
            container.id = %u.container_id, "SyncLoop (probe)");
        self.dispatch(WorkKind::Sync, p);
    }

    fn handle_tick(&self) {
        for uid in self.queue.take_due() {
            if self.rejected.contains(&uid) {
                continue;
            }
            let p = self.desired.get_pod_by_uid(&uid);
            if let Some(p) = p
                && p.metadata.deletion_timestamp.is_none()
            {
                self.dispatch(WorkKind::Sync, p);
            }
        }
    }

    /// Upstream `HandlePodCleanups`: stop and remove runtime pods nobody wants;
    /// forget workers of pods that are gone.
    async fn housekeeping(&self, pass: u32) {
        self.workers.gc_backoff();
        if !self.sources_ready.all_handled() {
            return;
        }
        let desired = self.desired.snapshot();
        let possibly_running: HashSet<String> = desired
            .keys()
            .filter(|uid| !self.rejected.contains(*uid))
            .cloned()
            .collect();
        self.probes.cleanup_pods(&possibly_running);
        // A pod removed and re-added with the same UID (an identical manifest put back)
        // may have had its sync dropped behind the pending kill: sync it again.
        for (uid, p) in &desired {
            if !self.rejected.contains(uid)
                && self.workers.is_removed(uid)
                && p.metadata.deletion_timestamp.is_none()
            {
                self.dispatch(WorkKind::Sync, p.clone());
            }
        }
        let runtime = self.pleg.runtime_pods().await;
        for (uid, rp) in runtime.iter() {
            if desired.contains_key(uid) {
                continue;
            }
            if self.workers.is_removed(uid) {
                continue;
            }
            if !self.workers.has_worker(uid) {
                info!(pod.uid = %uid, pod = %format!("{}/{}", rp.namespace, rp.name), running = rp.is_running(),
                    "Cleaning up pod that no source wants");
                let stub = orphan_stub(uid, &rp.name, &rp.namespace);
                self.dispatch(WorkKind::Kill { remove: true }, stub);
            }
        }
        for uid in self.workers.uids() {
            if !desired.contains_key(&uid)
                && self.workers.is_removed(&uid)
                && !runtime.contains_key(&uid)
            {
                debug!(pod.uid = %uid, "Forgetting pod worker");
                self.workers.forget(&uid);
            }
        }
        // Never before the PLEG listed the runtime: a pod nobody wants may
        // still run there, and destroying its cgroup would kill it without
        // its grace period (its worker stops it first).
        if let Some(orphans) = &self.orphan_cgroups
            && pass.wrapping_add(1).is_multiple_of(ORPHAN_CGROUP_PASSES)
            && self.pleg.has_relisted()
        {
            // Possibly running: desired pods (rejected ones never ran), what
            // the runtime still has, and pods whose worker has not finished.
            let mut keep = possibly_running;
            keep.extend(runtime.keys().cloned());
            keep.extend(
                self.workers
                    .uids()
                    .into_iter()
                    .filter(|u| !self.workers.is_removed(u)),
            );
            orphans.cleanup(keep).await;
        }
    }

    /// Runs until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(SYNC_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut hk = tokio::time::interval(HOUSEKEEPING_PERIOD);
        hk.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut passes: u32 = 0;
        // No heartbeat before the runtime's first ready answer, as upstream
        // (`syncLoopMonitor` is stored only past `runtimeErrors`): /healthz
        // stays healthy while a node boots with its runtime still down.
        tokio::select! {
            () = stop.cancelled() => return,
            () = self.admitter.runtime_known() => {}
            () = tokio::time::sleep(RUNTIME_WAIT_LOG) => {
                info!("Skipping pod synchronization until the container runtime answers ready");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.admitter.runtime_known() => {}
                }
            }
        }
        loop {
            self.heartbeat.beat();
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                u = self.config.recv() => match u {
                    Some(u) => {
                        let source = u.source;
                        self.handle_config(u);
                        // Upstream `sourcesReady.AddSource` after the handler:
                        // the source's pods are admitted and known.
                        self.sources_ready.mark_handled(source);
                    }
                    None => return,
                },
                ev = self.pleg_events.recv() => if let Some(ev) = ev { self.handle_pleg(&ev) },
                Some(u) = self.probe_updates.liveness.recv() => self.handle_probe(ProbeKind::Liveness, u),
                Some(u) = self.probe_updates.readiness.recv() => self.handle_probe(ProbeKind::Readiness, u),
                Some(u) = self.probe_updates.startup.recv() => self.handle_probe(ProbeKind::Startup, u),
                _ = tick.tick() => self.handle_tick(),
                _ = hk.tick() => {
                    self.housekeeping(passes).await;
                    passes = passes.wrapping_add(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
