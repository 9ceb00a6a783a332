//! The probe manager (upstream `pkg/kubelet/prober/prober_manager.go`):
//! starts one worker per container and probe type when a pod is added,
//! stops them when the pod terminates or goes away, and fills each
//! container status's `started` and `ready` from the probe results.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus};
use kubelet_runtime::{ProbeResult, ProbeResults};
use kubelet_types::events::Recorder;
use kubelet_types::pod;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::ProbeType;
use crate::clock::Clock;
use crate::prober::{Prober, spec_of};
use crate::worker::{Worker, runtime_id};

/// How a worker learns the container's ID, state, start time and the pod
/// IP (upstream: the status manager's `GetPodStatus`).
pub trait StatusProvider: Send + Sync {
    /// The pod's latest status, `None` when the kubelet has none yet (or
    /// any more).
    fn get_pod_status(&self, uid: &str) -> Option<PodStatus>;
}

/// One worker's identity (upstream `probeKey`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) pod_uid: String,
    pub(crate) container: String,
    pub(crate) kind: ProbeType,
}

/// What the manager keeps of a running worker.
struct Handle {
    /// Distinguishes this worker from a later one under the same key.
    id: u64,
    stop: CancellationToken,
    /// Asks for a probe now (upstream `manualTriggerCh`, one pending at most).
    trigger: Arc<Notify>,
}

/// State shared by the manager and its workers.
pub(crate) struct Shared {
    workers: Mutex<HashMap<Key, Handle>>,
    pub(crate) status: Arc<dyn StatusProvider>,
    pub(crate) prober: Prober,
    pub(crate) results: ProbeResults,
    /// When the manager started; workers started within a period of it jitter.
    pub(crate) start: Instant,
    pub(crate) clock: Clock,
    pub(crate) jitter: bool,
    shutdown: CancellationToken,
    next_id: AtomicU64,
    runtime: Option<tokio::runtime::Handle>,
}

impl Shared {
    /// Called by a worker as it exits; a newer worker under the key stays.
    pub(crate) fn remove_worker(&self, key: &Key, id: u64) {
        let mut workers = self.workers.lock();
        if workers.get(key).is_some_and(|h| h.id == id) {
            workers.remove(key);
        }
    }

    fn has_worker(&self, uid: &str, container: &str, kind: ProbeType) -> bool {
        self.workers.lock().contains_key(&Key {
            pod_uid: uid.to_string(),
            container: container.to_string(),
            kind,
        })
    }

    fn trigger(&self, uid: &str, container: &str, kind: ProbeType) -> bool {
        let key = Key {
            pod_uid: uid.to_string(),
            container: container.to_string(),
            kind,
        };
        match self.workers.lock().get(&key) {
            Some(h) => {
                h.trigger.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Manages pod probing (upstream `prober.Manager`). Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Shared>,
}

/// App containers and sidecars (init containers with `restartPolicy: Always`).
fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod::containers(pod)
        .iter()
        .chain(pod::init_containers(pod).iter().filter(|c| is_sidecar(c)))
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

impl Manager {
    /// A manager whose workers write to `results`, exec through `runtime`,
    /// read pod status from `status` and record probe events on `recorder`;
    /// every worker stops when `shutdown` is cancelled.
    pub fn new(
        results: ProbeResults,
        runtime: Arc<dyn cri::RuntimeService>,
        status: Arc<dyn StatusProvider>,
        recorder: Arc<dyn Recorder>,
        shutdown: CancellationToken,
    ) -> Manager {
        Self::with_clock(
            results,
            runtime,
            status,
            recorder,
            shutdown,
            Clock::System,
            true,
        )
    }

    pub(crate) fn with_clock(
        results: ProbeResults,
        runtime: Arc<dyn cri::RuntimeService>,
        status: Arc<dyn StatusProvider>,
        recorder: Arc<dyn Recorder>,
        shutdown: CancellationToken,
        clock: Clock,
        jitter: bool,
    ) -> Manager {
        Manager {
            inner: Arc::new(Shared {
                workers: Mutex::new(HashMap::new()),
                status,
                prober: Prober::new(runtime, recorder),
                results,
                start: Instant::now(),
                clock,
                jitter,
                shutdown,
                next_id: AtomicU64::new(0),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// Records every probe in `metrics` (`prober_probe_total`,
    /// `prober_probe_duration_seconds`, served at `/metrics/probes`). Call
    /// before the manager is cloned or started.
    pub fn with_metrics(mut self, metrics: Arc<kubelet_metrics::KubeletMetrics>) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(shared) => shared.prober.metrics = Some(metrics),
            None => tracing::warn!("prober metrics set after the manager was shared; ignored"),
        }
        self
    }

    /// Upstream `AddPod`: starts one worker per container (sidecars
    /// included) per probe it has. Idempotent: existing workers stay.
    pub fn add_pod(&self, pod: &Pod) {
        let Some(rt) = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.inner.runtime.clone())
        else {
            warn!(pod = %pod::describe(pod), "no tokio runtime to run probe workers on");
            return;
        };
        let uid = pod::uid(pod).to_string();
        let shared_pod = Arc::new(pod.clone());
        let mut workers = self.inner.workers.lock();
        for c in probed_containers(pod) {
            for kind in [
                ProbeType::Startup,
                ProbeType::Readiness,
                ProbeType::Liveness,
            ] {
                if spec_of(c, kind).is_none() {
                    continue;
                }
                let key = Key {
                    pod_uid: uid.clone(),
                    container: c.name.clone(),
                    kind,
                };
                if workers.contains_key(&key) {
                    continue;
                }
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                let stop = self.inner.shutdown.child_token();
                let trigger = Arc::new(Notify::new());
                debug!(pod = %pod::describe(pod), container = %c.name, probe = %kind, "starting probe worker");
                let worker = Worker::new(
                    self.inner.clone(),
                    key.clone(),
                    id,
                    shared_pod.clone(),
                    c.clone(),
                );
                workers.insert(
                    key,
                    Handle {
                        id,
                        stop: stop.clone(),
                        trigger: trigger.clone(),
                    },
                );
                rt.spawn(worker.run(stop, trigger));
            }
        }
    }

    fn stop(&self, pod: &Pod, kinds: &[ProbeType]) {
        let uid = pod::uid(pod);
        let workers = self.inner.workers.lock();
        for c in probed_containers(pod) {
            for kind in kinds {
                let key = Key {
                    pod_uid: uid.to_string(),
                    container: c.name.clone(),
                    kind: *kind,
                };
                if let Some(h) = workers.get(&key) {
                    h.stop.cancel();
                }
            }
        }
    }

    /// Upstream `StopLivenessAndStartup`: the pod is terminating; readiness
    /// keeps probing.
    pub fn stop_liveness_and_startup(&self, pod: &Pod) {
        self.stop(pod, &[ProbeType::Liveness, ProbeType::Startup]);
    }

    /// Upstream `RemovePod`: stops every worker of the pod; each forgets
    /// its results as it exits.
    pub fn remove_pod(&self, pod: &Pod) {
        self.stop(
            pod,
            &[
                ProbeType::Readiness,
                ProbeType::Liveness,
                ProbeType::Startup,
            ],
        );
    }

    /// Upstream `CleanupPods`: stops the workers of pods not in `desired`.
    pub fn cleanup_pods(&self, desired: &HashSet<String>) {
        for (key, h) in self.inner.workers.lock().iter() {
            if !desired.contains(&key.pod_uid) {
                h.stop.cancel();
            }
        }
    }

    /// Upstream `isContainerStarted`.
    fn is_started(&self, uid: &str, c: &ContainerStatus) -> bool {
        if c.state.as_ref().and_then(|s| s.running.as_ref()).is_none() {
            return false;
        }
        let id = runtime_id(c.container_id.as_deref().unwrap_or(""));
        if let Some(r) = self.inner.results.startup.get(id) {
            return r == ProbeResult::Success;
        }
        // A startup probe that has not run yet: not started.
        !self.inner.has_worker(uid, &c.name, ProbeType::Startup)
    }

    /// Readiness of a started container; asks a waiting readiness worker to
    /// probe now.
    fn is_ready(&self, uid: &str, c: &ContainerStatus) -> bool {
        if c.state.as_ref().and_then(|s| s.running.as_ref()).is_none() {
            return false;
        }
        let id = runtime_id(c.container_id.as_deref().unwrap_or(""));
        if self.inner.results.readiness.get(id) == Some(ProbeResult::Success) {
            return true;
        }
        // No readiness probe: ready. Otherwise not yet; probe at once.
        !self.inner.trigger(uid, &c.name, ProbeType::Readiness)
    }

    /// Upstream `UpdatePodStatus`: sets `started` and `ready` of each
    /// container status (and sidecar init container status) in `status`. A
    /// container that is not started is not ready; a regular init container
    /// is ready once it exited 0.
    pub fn update_pod_status(&self, pod: &Pod, status: &mut PodStatus) {
        let uid = pod::uid(pod);
        for c in status.container_statuses.iter_mut().flatten() {
            let started = self.is_started(uid, c);
            c.started = Some(started);
            c.ready = started && self.is_ready(uid, c);
        }
        let init_specs = pod::init_containers(pod);
        for c in status.init_container_statuses.iter_mut().flatten() {
            let started = self.is_started(uid, c);
            c.started = Some(started);
            let Some(spec) = init_specs.iter().find(|s| s.name == c.name) else {
                debug!(pod = %pod::describe(pod), container = %c.name, "init container status without spec");
                continue;
            };
            if !is_sidecar(spec) {
                if c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
                {
                    c.ready = true;
                }
                continue;
            }
            c.ready = started && self.is_ready(uid, c);
        }
    }

    /// Number of running workers (for tests and metrics).
    pub fn worker_count(&self) -> usize {
        self.inner.workers.lock().len()
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
