//! Container garbage collection every minute (upstream `StartGarbageCollection`'s
//! container half, `container_gc.go` `realContainerGC`, over
//! `kuberuntime_gc.go`), and the same collection as eviction's
//! `DeleteAllUnusedContainers`.

use std::sync::Arc;
use std::time::Duration;

use kubelet_config::housekeeping::container_gc::ContainerGcConfig;
use kubelet_eviction::{ContainerGc, ReclaimError};
use kubelet_podconfig::SourcesReady;
use kubelet_runtime::KubeRuntimeManager;
use kubelet_types::events::{EventType, Recorder, node_ref};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, info_span};

use super::housekeeping::Housekeeping;
use super::spawn::spawn_in;
use crate::pod_manager::PodManager;
use crate::status::StatusManager;

/// Upstream `ContainerGCPeriod`.
const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// Upstream `events.ContainerGCFailed`.
const CONTAINER_GC_FAILED: &str = "ContainerGCFailed";

/// How the kubelet sees the pods the runtime holds (upstream's pod workers
/// as `podStateProvider`).
#[derive(Clone)]
struct PodStates {
    pods: PodManager,
    status: Arc<StatusManager>,
}

impl PodStates {
    /// `None` when the pod's content may all go (upstream
    /// `ShouldPodContentBeRemoved`: no source wants it, or it is deleted or
    /// evicted and its containers are stopped); `Some(true)` when it is
    /// terminated but still wanted (`ShouldPodRuntimeBeRemoved`);
    /// `Some(false)` when it is live.
    fn state(&self, uid: &str) -> Option<bool> {
        let p = self.pods.get_pod_by_uid(uid)?;
        let terminated = self.status.is_terminated(uid);
        let deleted = p.metadata.deletion_timestamp.is_some();
        let evicted = self
            .status
            .get_pod_status(uid)
            .is_some_and(|s| s.reason.as_deref() == Some("Evicted"));
        if terminated && (deleted || evicted) {
            return None;
        }
        Some(terminated)
    }
}

/// The collector: the runtime manager, the policy, the pod states.
#[derive(Clone)]
struct Collector {
    manager: Arc<KubeRuntimeManager>,
    policy: ContainerGcConfig,
    states: PodStates,
    sources_ready: Arc<SourcesReady>,
    metrics: Arc<kubelet_metrics::KubeletMetrics>,
}

impl Collector {
    /// Upstream `GarbageCollect(policy, allSourcesReady, evictNonDeletedPods)`.
    async fn collect(&self, evict_non_deleted_pods: bool) -> kubelet_runtime::Result<()> {
        let states = self.states.clone();
        let state = move |uid: &str| states.state(uid);
        self.manager
            .garbage_collect(
                self.policy.min_age,
                self.policy.max_per_pod_container,
                self.policy.max_containers,
                self.sources_ready.all_handled(),
                evict_non_deleted_pods,
                &state,
            )
            .await
            .map(|s| {
                let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
                self.metrics
                    .add_container_gc_removed("container", n(s.containers_removed));
                self.metrics
                    .add_container_gc_removed("sandbox", n(s.sandboxes_removed));
                self.metrics
                    .add_container_gc_removed("log_dir", n(s.log_dirs_removed));
            })
    }

    /// Every [`CONTAINER_GC_PERIOD`] from the start, until `stop`; a failure
    /// is an error log and a `ContainerGCFailed` event on the Node.
    async fn run(self, recorder: Arc<dyn Recorder>, node: String, stop: CancellationToken) {
        info!(
            period = ?CONTAINER_GC_PERIOD,
            min_age = ?self.policy.min_age,
            max_per_pod_container = self.policy.max_per_pod_container,
            max_containers = self.policy.max_containers,
            "Starting container garbage collection"
        );
        let mut tick = tokio::time::interval(CONTAINER_GC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failed_before = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = self.collect(false) => r,
            };
            match r {
                Ok(()) if failed_before => {
                    info!("Container garbage collection succeeded");
                    failed_before = false;
                }
                Ok(()) => debug!("Container garbage collection succeeded"),
                Err(e) => {
                    error!(error = %e, "Container garbage collection failed");
                    recorder.event(
                        &node_ref(&node),
                        EventType::Warning,
                        CONTAINER_GC_FAILED,
                        e.to_string(),
                    );
                    failed_before = true;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl ContainerGc for Collector {
    async fn delete_all_unused_containers(&self) -> Result<(), ReclaimError> {
        self.collect(true)
            .await
            .map_err(|e| ReclaimError(Box::new(e)))
    }
}

/// Starts it on `tasks` under `stop`; returns what eviction reclaims
/// disk with.
pub(super) fn spawn(
    h: &Housekeeping<'_>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> Option<Arc<dyn kubelet_eviction::ContainerGc>> {
    let c = Collector {
        manager: h.manager.clone(),
        metrics: h.metrics.clone(),
        policy: h.cfg.housekeeping.container_gc.clone(),
        states: PodStates {
            pods: h.pods.clone(),
            status: h.status.clone(),
        },
        sources_ready: h.sources_ready.clone(),
    };
    spawn_in(
        tasks,
        info_span!("container_gc"),
        c.clone().run(
            h.recorder.clone(),
            h.cfg.node_name.clone(),
            stop.child_token(),
        ),
    );
    Some(Arc::new(c))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Pod, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(uid: &str, deleted: bool) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("pod");
        if deleted {
            p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        }
        Arc::new(p)
    }

    #[test]
    fn pod_states_follow_upstreams_pod_workers() {
        let pods = PodManager::default();
        let status = Arc::new(StatusManager::default());
        let states = PodStates {
            pods: pods.clone(),
            status: status.clone(),
        };
        assert_eq!(states.state("unknown"), None);
        pods.add_pod(pod("live", false));
        assert_eq!(states.state("live"), Some(false));
        pods.add_pod(pod("done", false));
        status.mark_terminated("done");
        assert_eq!(states.state("done"), Some(true));
        pods.add_pod(pod("deleting", true));
        assert_eq!(
            states.state("deleting"),
            Some(false),
            "still being killed: keep its content"
        );
        status.mark_terminated("deleting");
        assert_eq!(states.state("deleting"), None);
        pods.add_pod(pod("evicted", false));
        status.set_pod_status(
            "evicted",
            PodStatus {
                phase: Some("Failed".into()),
                reason: Some("Evicted".into()),
                ..Default::default()
            },
        );
        assert_eq!(states.state("evicted"), Some(false));
        status.mark_terminated("evicted");
        assert_eq!(states.state("evicted"), None);
    }
}
