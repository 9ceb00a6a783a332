//! Pod lifecycle event generator (upstream `pkg/kubelet/pleg/generic.go`).
//!
//! Every second it lists all sandboxes and containers (two CRI calls), diffs
//! their states against the previous relist and wakes the pods whose
//! containers started, died, changed or went away. Pods with events are then
//! inspected (their full status read into the cache) in the background, a
//! bounded number at a time, each under its own deadline: one pod whose status
//! calls hang delays only its own events, never the relist or other pods.
//! The generator is healthy while a relist succeeded within the last 3 minutes.
//! A relist that finds what the previous one found keeps its record as it
//! is ([`quiet`]): no per-pod work on an idle node.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cri::{RuntimeService, pb};
use kubelet_metrics::KubeletMetrics;
use kubelet_types::labels as l;
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

mod cache;
mod metrics;
mod quiet;

pub use cache::PodCache;

use crate::manager::KubeRuntimeManager;
use crate::pod_status::ContainerState;

/// Upstream relist period.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// Upstream `relistThreshold`: unhealthy after this long without a relist.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// Upstream channel capacity.
pub const CHANNEL_CAPACITY: usize = 1000;

/// What happened to a container (or sandbox).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// It is running now.
    ContainerStarted,
    /// It exited.
    ContainerDied,
    /// It is gone from the runtime.
    ContainerRemoved,
    /// Its state is unknown or created.
    ContainerChanged,
}

/// One lifecycle event for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// Pod UID.
    pub uid: String,
    /// What happened.
    pub kind: EventKind,
    /// Container or sandbox ID.
    pub id: String,
}

/// A pod the runtime has, as seen by the last relist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimePod {
    /// Pod name from labels.
    pub name: String,
    /// Pod namespace from labels.
    pub namespace: String,
    /// Container and sandbox IDs with their states.
    pub states: HashMap<String, ContainerState>,
}

impl RuntimePod {
    /// True when anything of the pod still runs.
    pub fn is_running(&self) -> bool {
        self.states.values().any(|s| *s != ContainerState::Exited)
    }
}

struct State {
    /// Shared with readers ([`GenericPleg::runtime_pods`]): replaced, never
    /// changed in place.
    pods: Arc<HashMap<String, RuntimePod>>,
    in_flight: HashSet<String>,
    dirty: HashSet<String>,
}

/// The generic (relisting) PLEG.
pub struct GenericPleg {
    runtime: Arc<dyn RuntimeService>,
    manager: Arc<KubeRuntimeManager>,
    events: mpsc::Sender<PodLifecycleEvent>,
    cache: Arc<PodCache>,
    state: Mutex<State>,
    last_relist: Mutex<Option<Instant>>,
    started: Instant,
    inspections: Arc<Semaphore>,
    inspect_timeout: Duration,
    /// Where background inspections run (the kubelet's shared tracker).
    tasks: TaskTracker,
    metrics: OnceLock<Arc<KubeletMetrics>>,
    /// When the last successful relist started (upstream `relistTime`), for the interval metric.
    last_relist_start: Mutex<Option<Instant>>,
}

fn sandbox_state(s: &pb::PodSandbox) -> ContainerState {
    if s.state == pb::PodSandboxState::SandboxReady as i32 {
        ContainerState::Running
    } else {
        ContainerState::Exited
    }
}

/// Upstream `generateEvents` for one container.
fn events_for(old: Option<ContainerState>, new: Option<ContainerState>) -> Vec<EventKind> {
    use ContainerState::*;
    if old == new {
        return vec![];
    }
    match new {
        Some(Running) => vec![EventKind::ContainerStarted],
        Some(Exited) => vec![EventKind::ContainerDied],
        Some(Unknown | Created) => vec![EventKind::ContainerChanged],
        None => match old {
            Some(Exited) => vec![EventKind::ContainerRemoved],
            _ => vec![EventKind::ContainerDied, EventKind::ContainerRemoved],
        },
    }
}

impl GenericPleg {
    /// A PLEG over `manager`'s runtime, sending events on a bounded channel of
    /// [`CHANNEL_CAPACITY`]. At most `concurrency` pods are inspected at once,
    /// each within `inspect_timeout`, as tasks on `tasks`.
    pub fn new(
        manager: Arc<KubeRuntimeManager>,
        concurrency: usize,
        inspect_timeout: Duration,
        tasks: TaskTracker,
    ) -> (Arc<Self>, mpsc::Receiver<PodLifecycleEvent>) {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let pleg = Arc::new(Self {
            runtime: manager.runtime().clone(),
            manager,
            events: tx,
            cache: Arc::new(PodCache::default()),
            state: Mutex::new(State {
                pods: Arc::default(),
                in_flight: HashSet::new(),
                dirty: HashSet::new(),
            }),
            last_relist: Mutex::new(None),
            started: Instant::now(),
            inspections: Arc::new(Semaphore::new(concurrency.max(1))),
            inspect_timeout,
            tasks,
            metrics: OnceLock::new(),
            last_relist_start: Mutex::new(None),
        });
        (pleg, rx)
    }

    /// Records relist duration and interval, and the running pods and
    /// containers each relist sees, in `metrics` (the first call wins).
    pub fn set_metrics(&self, metrics: Arc<KubeletMetrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// The status cache the PLEG fills.
    pub fn cache(&self) -> &Arc<PodCache> {
        &self.cache
    }

    /// Pods the runtime had at the last relist, by UID (shared, not copied).
    pub fn runtime_pods(&self) -> Arc<HashMap<String, RuntimePod>> {
        self.state.lock().pods.clone()
    }

    /// Whether a relist has succeeded: before it, [`Self::runtime_pods`] is
    /// empty, not the runtime's answer. (The pods are stored before the
    /// relist time, so once this is true they are the runtime's.)
    pub fn has_relisted(&self) -> bool {
        self.last_relist.lock().is_some()
    }

    /// Healthy while a relist succeeded within [`RELIST_THRESHOLD`] (counted from start before the first).
    pub fn healthy(&self) -> Result<(), String> {
        let since = self.last_relist.lock().unwrap_or(self.started);
        let elapsed = since.elapsed();
        if elapsed > RELIST_THRESHOLD {
            return Err(format!(
                "pleg was last seen active {elapsed:?} ago; threshold is {RELIST_THRESHOLD:?}"
            ));
        }
        Ok(())
    }

    /// Relists every [`RELIST_PERIOD`] until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(RELIST_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = self.relist().await {
                warn!(error = %e, "PLEG relist failed");
            }
        }
    }

    /// One relist: list, diff, dispatch inspections. Returns the number of pods with events.
    pub async fn relist(self: &Arc<Self>) -> Result<usize, cri::CriError> {
        // What this relist sees is at least as new as this (upstream takes it first too).
        let timestamp = Instant::now();
        let listed = self.list().await;
        if let Some(m) = self.metrics.get() {
            // Upstream observes the duration of every relist, failed ones too.
            let interval = listed.as_ref().ok().and_then(|_| {
                let prev = self.last_relist_start.lock().replace(timestamp);
                // As upstream: from the previous relist's start to the end of this listing.
                prev.map(|p| p.elapsed())
            });
            m.observe_pleg_relist(timestamp.elapsed(), interval);
            if let Ok((sandboxes, containers)) = &listed {
                metrics::record_running(m, sandboxes, containers);
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                m.set_pleg_last_seen(wall);
            }
        }
        let (sandboxes, containers) = listed?;
        {
            let st = self.state.lock();
            if st.dirty.is_empty() && quiet::unchanged(&st.pods, &sandboxes, &containers) {
                drop(st);
                *self.last_relist.lock() = Some(Instant::now());
                self.cache.update_time(timestamp);
                return Ok(0);
            }
        }
        let mut current: HashMap<String, RuntimePod> = HashMap::new();
        for s in &sandboxes {
            let Some(uid) = s.labels.get(l::POD_UID) else {
                continue;
            };
            let pod = current.entry(uid.clone()).or_insert_with(|| RuntimePod {
                name: s.labels.get(l::POD_NAME).cloned().unwrap_or_default(),
                namespace: s.labels.get(l::POD_NAMESPACE).cloned().unwrap_or_default(),
                states: HashMap::new(),
            });
            pod.states.insert(s.id.clone(), sandbox_state(s));
        }
        for c in &containers {
            let Some(uid) = c.labels.get(l::POD_UID) else {
                continue;
            };
            let pod = current.entry(uid.clone()).or_insert_with(|| RuntimePod {
                name: c.labels.get(l::POD_NAME).cloned().unwrap_or_default(),
                namespace: c.labels.get(l::POD_NAMESPACE).cloned().unwrap_or_default(),
                states: HashMap::new(),
            });
            pod.states
                .insert(c.id.clone(), ContainerState::from_cri(c.state));
        }
        let relisted_at = Instant::now();

        let mut per_pod: Vec<(String, String, String, Vec<PodLifecycleEvent>)> = Vec::new();
        {
            let mut st = self.state.lock();
            let uids: HashSet<&String> = current.keys().chain(st.pods.keys()).collect();
            for uid in uids {
                let old = st.pods.get(uid);
                let new = current.get(uid);
                let ids: HashSet<&String> = old
                    .iter()
                    .flat_map(|p| p.states.keys())
                    .chain(new.iter().flat_map(|p| p.states.keys()))
                    .collect();
                let mut evs = Vec::new();
                for id in ids {
                    let o = old.and_then(|p| p.states.get(id)).copied();
                    let n = new.and_then(|p| p.states.get(id)).copied();
                    evs.extend(events_for(o, n).into_iter().map(|kind| PodLifecycleEvent {
                        uid: uid.clone(),
                        kind,
                        id: id.clone(),
                    }));
                }
                let reinspect = st.dirty.contains(uid) && !st.in_flight.contains(uid);
                if !evs.is_empty() || reinspect {
                    let p = new.or(old).cloned().unwrap_or_default();
                    per_pod.push((uid.clone(), p.name, p.namespace, evs));
                }
            }
            st.pods = Arc::new(current);
            *self.last_relist.lock() = Some(relisted_at);
        }
        let n = per_pod.len();
        for (uid, name, ns, evs) in per_pod {
            self.cache.mark_pending(&uid);
            self.dispatch(uid, name, ns, evs, timestamp);
        }
        // Every pod without a change is as the cache has it; changed ones are
        // pending until their inspection lands.
        self.cache.update_time(timestamp);
        Ok(n)
    }

    async fn list(&self) -> Result<(Vec<pb::PodSandbox>, Vec<pb::Container>), cri::CriError> {
        let sandboxes = self.runtime.list_pod_sandbox(None).await?;
        let containers = self.runtime.list_containers(None).await?;
        Ok((sandboxes, containers))
    }

    fn dispatch(
        self: &Arc<Self>,
        uid: String,
        name: String,
        ns: String,
        evs: Vec<PodLifecycleEvent>,
        timestamp: Instant,
    ) {
        {
            let mut st = self.state.lock();
            if st.in_flight.contains(&uid) {
                // The running inspection is already stale; inspect again when it ends.
                st.dirty.insert(uid);
                drop(st);
                self.send(evs);
                return;
            }
            st.in_flight.insert(uid.clone());
            st.dirty.remove(&uid);
        }
        let me = self.clone();
        let span = tracing::info_span!("pleg_inspect", pod.uid = %uid);
        let inspect = async move {
            let gone = !me.state.lock().pods.contains_key(&uid);
            if gone {
                me.cache.remove(&uid);
            } else {
                let permit = me.inspections.clone().acquire_owned().await;
                let res = tokio::time::timeout(
                    me.inspect_timeout,
                    me.manager.get_pod_status(&uid, &name, &ns),
                )
                .await;
                drop(permit);
                match res {
                    Ok(Ok(status)) => me.cache.set(&uid, Ok(status), timestamp),
                    Ok(Err(e)) => {
                        warn!(pod.uid = %uid, error = %e, "PLEG: cannot inspect pod; will retry on next relist");
                        me.state.lock().dirty.insert(uid.clone());
                        me.cache.set(&uid, Err(e), timestamp);
                    }
                    Err(_) => {
                        warn!(pod.uid = %uid, timeout = ?me.inspect_timeout, "PLEG: pod inspection timed out; will retry on next relist");
                        me.state.lock().dirty.insert(uid.clone());
                        let timeout = cri::CriError::Timeout {
                            op: "PodStatus",
                            timeout: me.inspect_timeout,
                        };
                        me.cache.set(&uid, Err(timeout.into()), timestamp);
                    }
                }
            }
            let stale = {
                let mut st = me.state.lock();
                st.in_flight.remove(&uid);
                st.dirty.contains(&uid)
            };
            // A change seen while this inspection ran waits for the next one.
            if !stale {
                me.cache.clear_pending(&uid);
            }
            me.send(evs);
        };
        self.tasks
            .spawn(tracing::Instrument::instrument(inspect, span));
    }

    fn send(&self, evs: Vec<PodLifecycleEvent>) {
        for ev in evs {
            match self.events.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(ev)) => {
                    debug!(pod.uid = %ev.uid, "PLEG channel full; the next relist recovers");
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime_config::RuntimeConfig;
    use cri::fake::FakeRuntime;

    async fn add_pod(fake: &FakeRuntime, uid: &str) -> (String, String) {
        let (sb, ids) = fake.add_running_pod(uid, &format!("pod-{uid}"), 1);
        (sb, ids.into_iter().next().unwrap_or_default())
    }

    fn pleg(fake: &FakeRuntime) -> (Arc<GenericPleg>, mpsc::Receiver<PodLifecycleEvent>) {
        let m = Arc::new(KubeRuntimeManager::new(
            Arc::new(fake.clone()),
            Arc::new(fake.clone()),
            RuntimeConfig::default(),
        ));
        GenericPleg::new(m, 4, Duration::from_secs(2), TaskTracker::new())
    }

    async fn drain(rx: &mut mpsc::Receiver<PodLifecycleEvent>, n: usize) -> Vec<PodLifecycleEvent> {
        let mut out = vec![];
        while out.len() < n {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
                Ok(Some(ev)) => out.push(ev),
                _ => break,
            }
        }
        out
    }

    #[tokio::test]
    async fn relist_turns_state_changes_into_events_and_fills_cache() {
        let fake = FakeRuntime::new();
        let (p, mut rx) = pleg(&fake);
        let (_sb, c) = add_pod(&fake, "u1").await;
        assert_eq!(p.relist().await.expect("relist"), 1);
        let evs = drain(&mut rx, 2).await;
        assert!(
            evs.iter()
                .all(|e| e.uid == "u1" && e.kind == EventKind::ContainerStarted)
        );
        assert_eq!(evs.len(), 2, "sandbox and container started");
        assert_eq!(p.cache().get("u1").map(|s| s.containers.len()), Some(1));
        // Nothing changed: no events.
        assert_eq!(p.relist().await.expect("relist"), 0);
        fake.exit_container(&c, 1);
        p.relist().await.expect("relist");
        let evs = drain(&mut rx, 1).await;
        assert_eq!(evs[0].kind, EventKind::ContainerDied);
        assert_eq!(evs[0].id, c);
        fake.remove_container(&c).await.expect("remove");
        p.relist().await.expect("relist");
        assert_eq!(drain(&mut rx, 1).await[0].kind, EventKind::ContainerRemoved);
        assert!(p.healthy().is_ok());
    }

    #[tokio::test]
    async fn a_hanging_pod_stalls_neither_the_relist_nor_other_pods() {
        let fake = FakeRuntime::new();
        let (p, mut rx) = pleg(&fake);
        let (_, stuck) = add_pod(&fake, "stuck").await;
        fake.hang_container_status(&stuck);
        add_pod(&fake, "ok").await;
        let t = std::time::SystemTime::now();
        p.relist().await.expect("relist");
        assert!(
            t.elapsed().unwrap_or_default() < Duration::from_secs(1),
            "relist did not wait"
        );
        let evs = drain(&mut rx, 2).await;
        assert!(evs.iter().all(|e| e.uid == "ok"), "{evs:?}");
        assert!(p.cache().get("ok").is_some());
        assert!(p.cache().get("stuck").is_none());
        // Relists go on while the stuck inspection is pending.
        for _ in 0..3 {
            p.relist().await.expect("relist");
        }
        assert!(p.healthy().is_ok());
    }

    #[tokio::test]
    async fn a_full_event_channel_drops_events_but_never_blocks_the_relist() {
        let fake = FakeRuntime::new();
        let (p, mut rx) = pleg(&fake);
        // 600 pods x (sandbox + container) = 1200 events for a 1000-slot channel nobody drains.
        for i in 0..600 {
            fake.add_running_pod(&format!("u{i}"), &format!("p{i}"), 1);
        }
        let relist = tokio::time::timeout(Duration::from_secs(5), p.relist()).await;
        assert_eq!(relist.expect("relist did not block").expect("relist"), 600);
        // Let the background inspections finish and try to send.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        assert!(n <= CHANNEL_CAPACITY && n > 0, "{n} events delivered");
        // The next relist still works and sees no changes.
        assert_eq!(p.relist().await.expect("relist"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn unhealthy_after_three_minutes_without_relist() {
        let fake = FakeRuntime::new();
        let (p, _rx) = pleg(&fake);
        p.relist().await.expect("relist");
        fake.set_down(true);
        tokio::time::advance(Duration::from_secs(120)).await;
        assert!(p.relist().await.is_err());
        assert!(p.healthy().is_ok());
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(p.healthy().is_err());
        fake.set_down(false);
        p.relist().await.expect("relist");
        assert!(p.healthy().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn workers_read_what_the_relist_inspected_without_more_cri_calls() {
        let fake = FakeRuntime::new();
        let (p, _rx) = pleg(&fake);
        let before = Instant::now();
        let (_sb, c) = add_pod(&fake, "u1").await;
        tokio::time::advance(Duration::from_secs(1)).await;
        p.relist().await.expect("relist");
        let s = p
            .cache()
            .get_newer_than("u1", before)
            .await
            .expect("status");
        assert_eq!(s.containers[0].state, ContainerState::Running);

        // A worker asks for a status newer than its last sync; the container dies.
        tokio::time::advance(Duration::from_secs(1)).await;
        let asked = Instant::now();
        fake.exit_container(&c, 1);
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.cache().get_newer_than("u1", asked).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no relist since");
        tokio::time::advance(Duration::from_secs(1)).await;
        fake.clear_calls();
        p.relist().await.expect("relist");
        let s = waiter.await.expect("task").expect("status");
        assert_eq!(s.containers[0].state, ContainerState::Exited);
        assert_eq!(
            fake.call_count("ContainerStatus"),
            1,
            "one inspection by the PLEG, none by the worker"
        );

        // Nothing changes: the next relist releases the worker with the cached
        // status and no CRI status call at all.
        let asked = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        fake.clear_calls();
        p.relist().await.expect("relist");
        let s = p.cache().get_newer_than("u1", asked).await.expect("status");
        assert_eq!(s.containers[0].state, ContainerState::Exited);
        assert_eq!(fake.call_count("ContainerStatus"), 0);
        assert_eq!(fake.call_count("PodSandboxStatus"), 0);
        // A pod the runtime never had: an empty status, once a relist passed.
        let s = p
            .cache()
            .get_newer_than("nope", asked)
            .await
            .expect("status");
        assert!(s.containers.is_empty() && s.sandboxes.is_empty());
    }

    #[test]
    fn event_table() {
        use ContainerState::*;
        assert_eq!(
            events_for(None, Some(Running)),
            vec![EventKind::ContainerStarted]
        );
        assert_eq!(
            events_for(Some(Running), Some(Exited)),
            vec![EventKind::ContainerDied]
        );
        assert_eq!(
            events_for(Some(Running), None),
            vec![EventKind::ContainerDied, EventKind::ContainerRemoved]
        );
        assert_eq!(
            events_for(Some(Exited), None),
            vec![EventKind::ContainerRemoved]
        );
        assert_eq!(events_for(Some(Running), Some(Running)), vec![]);
        assert_eq!(
            events_for(None, Some(Created)),
            vec![EventKind::ContainerChanged]
        );
    }
}
