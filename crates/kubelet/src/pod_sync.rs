//! The pod sync the workers run (upstream `Kubelet.syncPod` and `killPod`):
//! read runtime state, record the generated API status, apply the runtime
//! manager's actions; or stop, and for pods gone for good, remove.

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use kubelet_runtime::KubeRuntimeManager;
use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use kubelet_types::pod;
use tracing::info;

use crate::active_deadline;
use crate::error::Error;
use crate::pod_workers::{PodSyncer, SyncOutcome};
use crate::runtime_state::RuntimeState;
use crate::status::{StatusManager, check_container_state_transition, generate_api_pod_status};

/// Syncs pods on a CRI runtime and records their status.
pub struct RuntimePodSyncer {
    runtime: Arc<KubeRuntimeManager>,
    status: Arc<StatusManager>,
    runtime_state: Arc<RuntimeState>,
    host_ips: Vec<std::net::IpAddr>,
    recorder: Arc<dyn Recorder>,
}

impl RuntimePodSyncer {
    /// The runtime's name, from `runtime_state` as of its last (re)connect,
    /// prefixes container IDs in status (`containerd://…`).
    pub fn new(
        runtime: Arc<KubeRuntimeManager>,
        status: Arc<StatusManager>,
        runtime_state: Arc<RuntimeState>,
        host_ips: Vec<std::net::IpAddr>,
    ) -> Self {
        Self {
            runtime,
            status,
            runtime_state,
            host_ips,
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
        }
    }

    /// Records pod events (FailedSync) to `recorder`.
    pub fn with_recorder(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.recorder = recorder;
        self
    }

    fn record(&self, p: &Pod, rs: &kubelet_runtime::PodStatus) {
        let uid = pod::uid(p);
        let waiting = |name: &str| self.runtime.waiting_reason(uid, name);
        let runtime_name = self.runtime_state.runtime_name();
        let api = generate_api_pod_status(p, rs, &waiting, &runtime_name, &self.host_ips);
        if let Some(old) = self.status.get_pod_status(uid)
            && let Err(e) = check_container_state_transition(&old, &api, pod::restart_policy(p))
        {
            tracing::error!(error = %e, "Refusing pod status update");
            return;
        }
        self.status.set_pod_status(uid, api);
    }
}

impl RuntimePodSyncer {
    /// Stops a pod past its `activeDeadlineSeconds` and records `Failed`/`DeadlineExceeded`.
    async fn fail_deadline(&self, p: &Pod, before: &kubelet_runtime::PodStatus) -> SyncOutcome {
        let uid = pod::uid(p);
        if before.live_containers().next().is_some() || before.has_ready_sandbox() {
            info!("Pod was active on the node longer than the specified deadline; stopping it");
        }
        let killed = self
            .runtime
            .kill_pod(before, pod::grace_period(p), false)
            .await;
        let after = match self
            .runtime
            .get_pod_status(uid, pod::name(p), pod::namespace(p))
            .await
        {
            Ok(s) => s,
            Err(_) => before.clone(),
        };
        self.record(p, &after);
        if let Some(s) = self.status.get_pod_status(uid) {
            self.status.set_pod_status(uid, active_deadline::failed(s));
        }
        SyncOutcome {
            error: killed.err().map(Error::Kill),
            requeue_after: None,
        }
    }
}

#[async_trait::async_trait]
impl PodSyncer for RuntimePodSyncer {
    async fn sync_pod(&self, p: &Arc<Pod>) -> SyncOutcome {
        let (uid, name, ns) = (pod::uid(p), pod::name(p), pod::namespace(p));
        let before = match self.runtime.get_pod_status(uid, name, ns).await {
            Ok(s) => s,
            Err(e) => {
                self.recorder.event(
                    &pod_ref(p, None),
                    EventType::Warning,
                    reason::FAILED_SYNC,
                    format!("error determining status: {e}"),
                );
                return SyncOutcome {
                    error: Some(Error::PodStatus(e)),
                    requeue_after: None,
                };
            }
        };
        let now = SystemTime::now();
        // Checked before a new status is recorded, so a failed pod never looks alive again.
        let cached = self.status.get_pod_status(uid);
        if active_deadline::exceeded(cached.as_ref())
            || active_deadline::remaining(p, cached.as_ref(), now)
                == Some(std::time::Duration::ZERO)
        {
            return self.fail_deadline(p, &before).await;
        }
        self.record(p, &before);
        let left = active_deadline::remaining(p, self.status.get_pod_status(uid).as_ref(), now);
        let mut result = self.runtime.sync_pod(p, &before, now).await;
        if let Some(left) = left {
            // Come back when the deadline passes.
            result.requeue_after = Some(result.requeue_after.map_or(left, |r| r.min(left)));
        }
        if result.started > 0 {
            // Report what was started now, rather than after the next PLEG relist.
            match self.runtime.get_pod_status(uid, name, ns).await {
                Ok(after) => self.record(p, &after),
                Err(_) => self.record(p, &before),
            }
        } else if !result.errors.is_empty() {
            // Failed starts change the waiting reasons: show them now rather than on the next sync.
            self.record(p, &before);
        }
        let requeue_after = result.requeue_after;
        let error = if result.errors.is_empty() {
            None
        } else {
            Some(Error::Sync(result.errors))
        };
        SyncOutcome {
            error,
            requeue_after,
        }
    }

    fn gc_backoff(&self) {
        self.runtime.gc_backoff(SystemTime::now());
    }

    async fn kill_pod(&self, p: &Arc<Pod>, remove: bool) -> Result<(), Error> {
        let (uid, name, ns) = (pod::uid(p), pod::name(p), pod::namespace(p));
        let status = self
            .runtime
            .get_pod_status(uid, name, ns)
            .await
            .map_err(Error::PodStatus)?;
        self.runtime
            .kill_pod(&status, pod::grace_period(p), true)
            .await
            .map_err(Error::Kill)?;
        if remove {
            // Killing changes states, not which containers and sandboxes exist.
            self.runtime
                .remove_pod(&status)
                .await
                .map_err(Error::Kill)?;
            self.status.remove(uid);
            info!("Pod stopped and removed");
        } else {
            let status = self
                .runtime
                .get_pod_status(uid, name, ns)
                .await
                .map_err(Error::PodStatus)?;
            self.record(p, &status);
            self.status.mark_terminated(uid);
            info!("Pod stopped");
        }
        Ok(())
    }
}
