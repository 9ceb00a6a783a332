//! One probe worker (upstream `pkg/kubelet/prober/worker.go`): a task that
//! probes one container with one probe type every `periodSeconds` (after a
//! random initial jitter when the kubelet has just started), honours
//! `initialDelaySeconds` from the container's `startedAt`, startup gating,
//! the success and failure thresholds, holds after a liveness or startup
//! failure until the container is replaced, and records results in its
//! `ResultsManager` keyed by the bare runtime container ID.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus};
use kubelet_runtime::{ProbeResult, ResultsManager};
use kubelet_types::pod::{self, RestartPolicy};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, trace};

use crate::ProbeType;
use crate::manager::{Key, Shared};
use crate::prober::{
    DEFAULT_FAILURE_THRESHOLD, DEFAULT_PERIOD_SECONDS, DEFAULT_SUCCESS_THRESHOLD, or_default,
    spec_of,
};

/// The runtime ID in an API container ID (`containerd://<id>` -> `<id>`).
pub(crate) fn runtime_id(api_id: &str) -> &str {
    api_id.split_once("://").map_or(api_id, |(_, id)| id)
}

/// The status of the named container among app then init container statuses
/// (only one that has a container ID).
fn container_status<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    let find = |list: &'a Option<Vec<ContainerStatus>>| {
        list.iter()
            .flatten()
            .find(|c| c.name == name && c.container_id.as_deref().is_some_and(|id| !id.is_empty()))
    };
    find(&status.container_statuses).or_else(|| find(&status.init_container_statuses))
}

/// The state a worker keeps between probes.
pub(crate) struct Worker {
    shared: Arc<Shared>,
    key: Key,
    id: u64,
    pod: Arc<Pod>,
    container: Container,
    kind: ProbeType,
    results: ResultsManager,
    /// The result set while the initial delay runs (upstream `initialValue`).
    initial: ProbeResult,
    period: Duration,
    initial_delay: i64,
    success_threshold: i32,
    failure_threshold: i32,
    /// The last API container ID seen (`containerd://<id>`).
    container_id: Option<String>,
    last_result: Option<ProbeResult>,
    result_run: i32,
    /// Set after a liveness/startup failure: no probing until a new container.
    on_hold: bool,
}

impl Worker {
    pub(crate) fn new(
        shared: Arc<Shared>,
        key: Key,
        id: u64,
        pod: Arc<Pod>,
        container: Container,
    ) -> Self {
        let kind = key.kind;
        let (results, initial) = match kind {
            ProbeType::Readiness => (shared.results.readiness.clone(), ProbeResult::Failure),
            ProbeType::Liveness => (shared.results.liveness.clone(), ProbeResult::Success),
            ProbeType::Startup => (shared.results.startup.clone(), ProbeResult::Unknown),
        };
        let spec = spec_of(&container, kind);
        let period = or_default(spec.and_then(|s| s.period_seconds), DEFAULT_PERIOD_SECONDS);
        Self {
            period: Duration::from_secs(u64::try_from(period).unwrap_or(10)),
            initial_delay: i64::from(spec.and_then(|s| s.initial_delay_seconds).unwrap_or(0)),
            success_threshold: or_default(
                spec.and_then(|s| s.success_threshold),
                DEFAULT_SUCCESS_THRESHOLD,
            ),
            failure_threshold: or_default(
                spec.and_then(|s| s.failure_threshold),
                DEFAULT_FAILURE_THRESHOLD,
            ),
            shared,
            key,
            id,
            pod,
            container,
            kind,
            results,
            initial,
            container_id: None,
            last_result: None,
            result_run: 0,
            on_hold: false,
        }
    }

    /// Probes until stopped or the container is gone for good, then forgets
    /// its result and leaves the manager (upstream `worker.run`).
    pub(crate) async fn run(mut self, stop: CancellationToken, trigger: Arc<Notify>) {
        // Right after a kubelet start, spread the first probes over a period.
        if self.shared.jitter && self.period > self.shared.start.elapsed() {
            let wait = self.period.mul_f64(rand::random::<f64>());
            tokio::select! {
                _ = stop.cancelled() => {
                    self.cleanup();
                    return;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let mut ticker = tokio::time::interval_at(Instant::now() + self.period, self.period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let keep_going = tokio::select! {
                biased;
                _ = stop.cancelled() => false,
                k = self.do_probe() => k,
            };
            if !keep_going {
                break;
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = ticker.tick() => trace!(probe = %self.kind, container = %self.container.name, "periodic probe"),
                _ = trigger.notified() => trace!(probe = %self.kind, container = %self.container.name, "triggered probe"),
            }
        }
        self.cleanup();
    }

    fn cleanup(&mut self) {
        if let Some(id) = self.container_id.take() {
            self.results.remove(runtime_id(&id));
        }
        if let Some(m) = &self.shared.prober.metrics {
            // Upstream deletes a stopped worker's series.
            let labels = crate::prober::metric_labels(self.kind, &self.pod, &self.container);
            m.prober().forget(&labels, self.uid());
        }
        self.shared.remove_worker(&self.key, self.id);
    }

    fn uid(&self) -> &str {
        &self.key.pod_uid
    }

    /// Whether a terminated container will be started again.
    fn will_restart(&self) -> bool {
        self.container.restart_policy.as_deref() == Some("Always")
            || pod::restart_policy(&self.pod) != RestartPolicy::Never
    }

    /// Probes once and records the result; false when the worker should stop
    /// (upstream `doProbe`).
    pub(crate) async fn do_probe(&mut self) -> bool {
        let Some(status) = self.shared.status.get_pod_status(self.uid()) else {
            trace!(pod_uid = %self.uid(), "no status for pod");
            return true;
        };
        if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
            debug!(pod_uid = %self.uid(), probe = %self.kind, "pod is terminated, exiting probe worker");
            return false;
        }
        let Some(c) = container_status(&status, &self.container.name) else {
            trace!(pod_uid = %self.uid(), container = %self.container.name, "probe target container not found");
            return true;
        };
        let api_id = c.container_id.clone().unwrap_or_default();
        if self.container_id.as_deref() != Some(api_id.as_str()) {
            if let Some(old) = self.container_id.take() {
                self.results.remove(runtime_id(&old));
            }
            self.results
                .set(runtime_id(&api_id), self.initial, &self.key.pod_uid);
            self.container_id = Some(api_id.clone());
            // A new container: probe again.
            self.on_hold = false;
        }
        if self.on_hold {
            return true;
        }
        let id = runtime_id(&api_id);
        let state = c.state.as_ref();
        let Some(running) = state.and_then(|s| s.running.as_ref()) else {
            trace!(pod_uid = %self.uid(), container = %self.container.name, "non-running container probed");
            self.results
                .set(id, ProbeResult::Failure, &self.key.pod_uid);
            let terminated = state.is_some_and(|s| s.terminated.is_some());
            return !terminated || self.will_restart();
        };
        if self.pod.metadata.deletion_timestamp.is_some()
            && matches!(self.kind, ProbeType::Liveness | ProbeType::Startup)
        {
            debug!(pod_uid = %self.uid(), probe = %self.kind, "pod deletion requested, setting probe result to success");
            // A last result so the container shuts down quietly.
            self.results
                .set(id, ProbeResult::Success, &self.key.pod_uid);
            return false;
        }
        if let Some(started_at) = &running.started_at
            && self.shared.clock.seconds_since(started_at.0) < self.initial_delay
        {
            return true;
        }
        if c.started == Some(true) {
            // Startup is done; the worker stays for a restarted container.
            if self.kind == ProbeType::Startup {
                return true;
            }
        } else if self.kind != ProbeType::Startup {
            // Liveness and readiness wait for startup to succeed.
            return true;
        }
        let result = match self
            .shared
            .prober
            .probe(self.kind, &self.pod, &status, &self.container, id)
            .await
        {
            Ok(r) => r,
            // Prober error: throw the result away.
            Err(_) => return true,
        };
        if self.last_result == Some(result) {
            self.result_run += 1;
        } else {
            self.last_result = Some(result);
            self.result_run = 1;
        }
        if (result == ProbeResult::Failure && self.result_run < self.failure_threshold)
            || (result == ProbeResult::Success && self.result_run < self.success_threshold)
        {
            // Below threshold: keep the current state.
            return true;
        }
        self.results.set(id, result, &self.key.pod_uid);
        if self.kind != ProbeType::Readiness && result == ProbeResult::Failure {
            // The container will be restarted; wait for the new one.
            self.on_hold = true;
            self.result_run = 0;
        }
        true
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
