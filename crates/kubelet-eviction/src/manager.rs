//! The eviction manager's control loop (upstream `managerImpl.Start`,
//! `synchronize`, `reclaimNodeLevelResources`, `evictPod`,
//! `waitForPodsCleanup`): every monitoring interval, or at once when a
//! memory notifier fires, observe the signals, track thresholds met and
//! their grace periods, publish node conditions, reclaim node-level
//! resources for disk, and evict at most one pod.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::events::{EventType, Recorder, node_ref, pod_ref};
use kubelet_types::pod;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::admit::{Pressure, PressureSender, is_critical};
use crate::api::{NodeCondition, Signal, Threshold};
use crate::message::{REASON, eviction_message};
use crate::rank::{StatsByUid, rank};
use crate::seams::{ActivePods, EvictionMetrics, PodEvictor, SummaryProvider};
use crate::stats::{Observations, observe};
use crate::thresholds::{self, FirstObserved, LastObserved};
use crate::{ContainerGc, ImageGc, local_storage};

/// Upstream `immediateEvictionGracePeriodSeconds`.
pub const IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS: i64 = 1;
/// Upstream `podCleanupTimeout`.
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream `podCleanupPollFreq`.
const POD_CLEANUP_POLL: Duration = Duration::from_secs(1);

/// A soft eviction's grace period: the pod's own, capped by
/// `evictionMaxPodGracePeriod` when that is set (above 0), at least
/// [`IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS`].
pub(crate) fn soft_grace(p: &Pod, max: i64) -> i64 {
    let own = p
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(kubelet_types::pod::DEFAULT_GRACE_PERIOD_SECONDS);
    let grace = if max <= 0 { own } else { own.min(max) };
    grace.max(IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS)
}

/// How the manager is configured (upstream `eviction.Config`).
#[derive(Clone, Debug)]
pub struct Config {
    /// Hard and soft thresholds.
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (soft evictions).
    pub max_pod_grace_period_seconds: i64,
    /// Upstream `evictionMonitoringPeriod` (10 s).
    pub monitoring_interval: Duration,
    /// `LocalStorageCapacityIsolation`: evict pods over their local storage limits.
    pub local_storage_capacity_isolation: bool,
    /// The node's name, for its events.
    pub node_name: String,
}

/// What the manager acts through.
pub struct Deps {
    /// Stats.
    pub summary: Arc<dyn SummaryProvider>,
    /// Pods.
    pub pods: Arc<dyn ActivePods>,
    /// Kills.
    pub evictor: Arc<dyn PodEvictor>,
    /// Image GC, for disk pressure.
    pub images: Option<Arc<dyn ImageGc>>,
    /// Container GC, for disk pressure.
    pub containers: Option<Arc<dyn ContainerGc>>,
    /// Events.
    pub recorder: Arc<dyn Recorder>,
    /// Metrics.
    pub metrics: Arc<dyn EvictionMetrics>,
}

#[derive(Default)]
struct State {
    first_observed: FirstObserved,
    conditions_last_observed: LastObserved,
    thresholds_met: Vec<Threshold>,
    last_observations: Observations,
    /// Signals whose threshold was met at the last synchronize (logged once).
    logged_met: Vec<Threshold>,
}

/// The eviction manager.
pub struct Manager {
    config: Config,
    deps: Deps,
    state: Mutex<State>,
    conditions: watch::Sender<Vec<NodeCondition>>,
    wake: Arc<Notify>,
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Manager {
    /// A manager publishing node conditions on `pressure` (see
    /// [`Pressure::channel`]).
    pub fn new(config: Config, deps: Deps, pressure: PressureSender) -> Self {
        Self {
            config,
            deps,
            state: Mutex::default(),
            conditions: pressure.0,
            wake: Arc::new(Notify::new()),
        }
    }

    /// The node conditions as the manager last computed them.
    pub fn pressure(&self) -> Pressure {
        Pressure::from_receiver(self.conditions.subscribe())
    }

    /// Wakes the loop at once (memory threshold notifiers).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// The thresholds it enforces.
    pub fn thresholds(&self) -> &[Threshold] {
        &self.config.thresholds
    }

    /// Upstream `Start`'s loop: after an eviction, waits for the pod to be
    /// cleaned up and synchronizes again; else sleeps the monitoring
    /// interval or until woken.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        if self.config.thresholds.is_empty() && !self.config.local_storage_capacity_isolation {
            return;
        }
        loop {
            let evicted = tokio::select! {
                () = stop.cancelled() => return,
                e = self.synchronize() => e,
            };
            match evicted {
                Some(p) => {
                    info!(pod = %pod::format_pod(&p), "Eviction manager: pods evicted, waiting for pod to be cleaned up");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = self.wait_for_cleanup(&p) => {}
                    }
                }
                None => {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(self.config.monitoring_interval) => {}
                        () = self.wake.notified() => {
                            debug!("Eviction manager: woken by a memory threshold notifier");
                        }
                    }
                }
            }
        }
    }

    async fn wait_for_cleanup(&self, p: &Pod) {
        let deadline = Instant::now() + POD_CLEANUP_TIMEOUT;
        loop {
            tokio::time::sleep(POD_CLEANUP_POLL).await;
            if self.deps.pods.cleaned_up(p).await {
                info!(pod = %pod::format_pod(p), "Eviction manager: pods successfully cleaned up");
                return;
            }
            if Instant::now() >= deadline {
                info!(pod = %pod::format_pod(p), "Eviction manager: timed out waiting for pods to be cleaned up");
                return;
            }
        }
    }

    /// One pass (upstream `synchronize`); returns the pod evicted, if any.
    pub async fn synchronize(&self) -> Option<Arc<Pod>> {
        let summary = match self.deps.summary.summary().await {
            Ok(s) => s,
            Err(e) => {
                error!(error = %e, "Eviction manager: failed to get summary stats");
                return None;
            }
        };
        let mut active = self.deps.pods.active_pods();
        let dedicated_imagefs = summary.node.dedicated_imagefs;
        let observations = observe(&summary.node);
        let stats: StatsByUid<'_> = summary.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let now = Instant::now();
        let all = &self.config.thresholds;

        let (to_reclaim, conditions_changed) = {
            let mut st = self.state.lock();
            let mut met = thresholds::met(all, &observations, false);
            if !st.thresholds_met.is_empty() {
                let unresolved = thresholds::met(&st.thresholds_met, &observations, true);
                met = thresholds::merge(met, unresolved);
            }
            for t in &met {
                if !st.logged_met.iter().any(|l| l.same(t))
                    && let Some(o) = observations.get(&t.signal)
                {
                    warn!(
                        signal = %t.signal,
                        threshold = thresholds::threshold_quantity(t, o, false),
                        available = o.available,
                        capacity = o.capacity,
                        grace_period = ?t.grace_period,
                        "Eviction manager: threshold met"
                    );
                }
            }
            for l in &st.logged_met {
                if !met.iter().any(|t| t.same(l)) {
                    let available = observations.get(&l.signal).map(|o| o.available);
                    info!(signal = %l.signal, ?available, "Eviction manager: threshold no longer met");
                }
            }
            st.logged_met = met.clone();
            let first = thresholds::first_observed(&met, &st.first_observed, now);
            let observed_now = thresholds::node_conditions(&met);
            let last = thresholds::last_observed(&observed_now, &st.conditions_last_observed, now);
            let conditions =
                thresholds::observed_since(&last, self.config.pressure_transition_period, now);
            let grace_met = thresholds::met_grace_period(&first, now);
            st.first_observed = first;
            st.conditions_last_observed = last;
            st.thresholds_met = grace_met.clone();
            let updated =
                thresholds::updated_stats(&grace_met, &observations, &st.last_observations);
            st.last_observations = observations.clone();
            drop(st);
            let mut changed = false;
            self.conditions.send_if_modified(|c| {
                let mut old = c.clone();
                let mut new = conditions.clone();
                old.sort();
                new.sort();
                if old != new {
                    info!(before = ?old, after = ?new, "Eviction manager: node conditions changed");
                    *c = conditions;
                    changed = true;
                }
                changed
            });
            (updated, changed)
        };
        let _ = conditions_changed;

        if self.config.local_storage_capacity_isolation
            && let Some(p) = local_storage::evict(self, &active, &stats, dedicated_imagefs).await
        {
            return Some(p);
        }
        if to_reclaim.is_empty() {
            debug!("Eviction manager: no resources are starved");
            return None;
        }
        // Memory first (upstream `byEvictionPriority`).
        let mut ordered = to_reclaim.clone();
        ordered.sort_by_key(|t| !t.signal.is_memory());
        let target = ordered[0];
        let resource = target.signal.resource();
        info!(resource = %resource, signal = %target.signal, "Eviction manager: attempting to reclaim");
        self.deps.recorder.event(
            &node_ref(&self.config.node_name),
            EventType::Warning,
            "EvictionThresholdMet",
            format!("Attempting to reclaim {resource}"),
        );
        if self.reclaim_node_level(target.signal).await {
            info!(resource = %resource, "Eviction manager: able to reduce resource pressure without evicting pods.");
            return None;
        }
        info!(resource = %resource, "Eviction manager: must evict pod(s) to reclaim");
        if active.is_empty() {
            error!(
                "Eviction manager: eviction thresholds have been met, but no pods are active to evict"
            );
            return None;
        }
        rank(target.signal, &mut active, &stats, dedicated_imagefs);
        let ranked: Vec<String> = active.iter().map(|p| pod::format_pod(p)).collect();
        info!(pods = ?ranked, "Eviction manager: pods ranked for eviction");
        let wall = SystemTime::now();
        for t in &to_reclaim {
            if let Some(at) = observations.get(&t.signal).and_then(|o| o.time)
                && let Ok(age) = wall.duration_since(at)
            {
                self.deps.metrics.stats_age(t.signal.as_str(), age);
            }
        }
        for p in &active {
            let grace = if target.is_hard() {
                IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS
            } else {
                soft_grace(p, self.config.max_pod_grace_period_seconds)
            };
            let (message, annotations) = eviction_message(
                resource,
                p,
                stats.get(pod::uid(p)).copied(),
                &to_reclaim,
                &observations,
            );
            let e = crate::seams::Eviction {
                message,
                grace_period_seconds: grace,
                disruption_target: true,
                annotations,
            };
            if self.evict_pod(p, e).await {
                self.deps.metrics.evicted(target.signal.as_str());
                return Some(p.clone());
            }
        }
        info!("Eviction manager: unable to evict any pods from the node");
        None
    }

    /// Upstream `reclaimNodeLevelResources`: container GC then image GC for
    /// disk signals, and whether the thresholds (with minimum reclaim) are
    /// then all resolved.
    async fn reclaim_node_level(&self, signal: Signal) -> bool {
        let disk = matches!(
            signal,
            Signal::NodeFsAvailable
                | Signal::NodeFsInodesFree
                | Signal::ImageFsAvailable
                | Signal::ImageFsInodesFree
                | Signal::ContainerFsAvailable
                | Signal::ContainerFsInodesFree
        );
        if !disk || (self.deps.containers.is_none() && self.deps.images.is_none()) {
            return false;
        }
        if let Some(c) = &self.deps.containers
            && let Err(e) = c.delete_all_unused_containers().await
        {
            info!(error = %e, signal = %signal, "Eviction manager: unexpected error when attempting to reduce resource pressure");
        }
        if let Some(g) = &self.deps.images {
            match g.delete_unused_images().await {
                Ok(freed) => {
                    info!(signal = %signal, freed_bytes = freed, "Eviction manager: deleted unused images")
                }
                Err(e) => {
                    info!(error = %e, signal = %signal, "Eviction manager: unexpected error when attempting to reduce resource pressure")
                }
            }
        }
        let summary = match self.deps.summary.summary().await {
            Ok(s) => s,
            Err(e) => {
                error!(error = %e, "Eviction manager: failed to get summary stats after resource reclaim");
                return false;
            }
        };
        let obs = observe(&summary.node);
        thresholds::met(&self.config.thresholds, &obs, true).is_empty()
    }

    /// Upstream `evictPod`: never a critical pod; records `Evicted` and kills.
    pub(crate) async fn evict_pod(&self, p: &Arc<Pod>, e: crate::seams::Eviction) -> bool {
        if is_critical(p) {
            error!(pod = %pod::format_pod(p), "Eviction manager: cannot evict a critical pod");
            return false;
        }
        info!(
            pod = %pod::format_pod(p),
            pod_uid = pod::uid(p),
            message = %e.message,
            grace_period = e.grace_period_seconds,
            annotations = ?e.annotations,
            "Evicting pod"
        );
        self.deps.recorder.event(
            &pod_ref(p, None),
            EventType::Warning,
            REASON,
            e.message.clone(),
        );
        match self.deps.evictor.evict(p, e).await {
            Ok(()) => {
                info!(pod = %pod::format_pod(p), "Eviction manager: pod is evicted successfully")
            }
            Err(err) => {
                error!(pod = %pod::format_pod(p), error = %err, "Eviction manager: pod failed to evict")
            }
        }
        true
    }

    pub(crate) fn metrics(&self) -> &dyn EvictionMetrics {
        self.deps.metrics.as_ref()
    }
}

/// Used bytes as `i64` (local storage comparisons).
pub(crate) fn used(v: Option<u64>) -> i64 {
    i(v.unwrap_or(0))
}

/// Stats by UID from a list.
pub fn by_uid(pods: &[crate::stats::PodStats]) -> HashMap<&str, &crate::stats::PodStats> {
    pods.iter().map(|p| (p.uid.as_str(), p)).collect()
}
