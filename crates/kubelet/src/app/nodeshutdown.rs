//! Graceful node shutdown (`kubelet-nodeshutdown`), upstream
//! `shutdownManager.Start`: the kubelet as the manager's [`Node`] seam (the
//! active pods, the pod killer with upstream's reason, message and
//! `DisruptionTarget` condition, the shutdown status node readiness
//! reads, the Node event) and the task that connects to logind. Nothing
//! here blocks the kubelet's start: the connection is made in the task,
//! with deadlines, and a node without logind runs without graceful
//! shutdown.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_nodeshutdown::groups::{self, PriorityGrace};
use kubelet_nodeshutdown::{KillFailed, Manager, Node, ShutdownPod, SystemdConnector};
use kubelet_types::events::{EventType, Recorder, node_ref};
use kubelet_types::{PodPhase, pod};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info_span;

use super::housekeeping::Housekeeping;
use super::spawn::spawn_in;
use crate::pod_killer::{KillRequest, PodKiller};
use crate::pod_manager::PodManager;
use crate::runtime_state::RuntimeState;
use crate::status::StatusManager;

/// The kubelet as the shutdown manager sees it.
struct KubeletNode {
    node_name: String,
    pods: PodManager,
    status: Arc<StatusManager>,
    killer: Arc<dyn PodKiller>,
    runtime_state: Arc<RuntimeState>,
    recorder: Arc<dyn Recorder>,
}

/// Upstream's kill request for a shutdown: `Failed`, `Terminated`, the
/// message, and `DisruptionTarget` (`TerminationByKubelet`).
fn kill_request(grace_period_seconds: i64) -> KillRequest {
    KillRequest {
        reason: kubelet_nodeshutdown::POD_REASON.to_string(),
        message: kubelet_nodeshutdown::POD_MESSAGE.to_string(),
        conditions: vec![PodCondition {
            type_: "DisruptionTarget".to_string(),
            status: "True".to_string(),
            reason: Some(kubelet_nodeshutdown::DISRUPTION_REASON.to_string()),
            message: Some(kubelet_nodeshutdown::POD_MESSAGE.to_string()),
            last_transition_time: Some(Time(jiff::Timestamp::now())),
            ..Default::default()
        }],
        grace_period_override: Some(grace_period_seconds),
    }
}

#[async_trait::async_trait]
impl Node for KubeletNode {
    fn active_pods(&self) -> Vec<ShutdownPod> {
        self.pods
            .get_pods()
            .into_iter()
            .filter(|p| {
                !self
                    .status
                    .get_pod_status(pod::uid(p))
                    .and_then(|s| s.phase)
                    .and_then(|ph| ph.parse::<PodPhase>().ok())
                    .is_some_and(PodPhase::is_terminal)
            })
            .map(|p| {
                let spec = p.spec.as_ref();
                ShutdownPod {
                    uid: pod::uid(&p).to_string(),
                    name: pod::describe(&p),
                    priority: spec.and_then(|s| s.priority).unwrap_or(0),
                    termination_grace_period_seconds: spec
                        .and_then(|s| s.termination_grace_period_seconds),
                }
            })
            .collect()
    }

    async fn kill_pod(&self, p: &ShutdownPod, grace: i64) -> Result<(), KillFailed> {
        // A pod deleted meanwhile has nothing left to kill.
        let Some(found) = self.pods.get_pod_by_uid(&p.uid) else {
            return Ok(());
        };
        self.killer
            .kill_pod(&found, kill_request(grace))
            .await
            .map_err(|e| KillFailed {
                pod: p.name.clone(),
                source: Box::new(e),
            })
    }

    fn set_shutting_down(&self, shutting_down: bool) {
        self.runtime_state.set_shutdown_status(
            shutting_down.then(|| kubelet_nodeshutdown::SHUTTING_DOWN.to_string()),
        );
    }

    fn record_event(&self, message: &str) {
        self.recorder.event(
            &node_ref(&self.node_name),
            EventType::Normal,
            kubelet_nodeshutdown::EVENT_REASON,
            message.to_string(),
        );
    }
}

/// Starts it on `tasks` under `stop`, when configured.
pub(super) fn spawn(h: &Housekeeping<'_>, tasks: &TaskTracker, stop: &CancellationToken) {
    let cfg = &h.cfg.housekeeping.shutdown;
    let by_priority: Vec<PriorityGrace> = cfg
        .by_pod_priority
        .iter()
        .map(|g| PriorityGrace {
            priority: g.priority,
            grace_period_seconds: g.shutdown_grace_period_seconds,
        })
        .collect();
    let ranges = groups::effective(
        cfg.grace_period,
        cfg.grace_period_critical_pods,
        &by_priority,
    );
    let node = Arc::new(KubeletNode {
        node_name: h.cfg.node_name.clone(),
        pods: h.pods.clone(),
        status: h.status.clone(),
        killer: h.killer.clone(),
        runtime_state: h.runtime_state.clone(),
        recorder: h.recorder.clone(),
    });
    let Some(manager) = Manager::new(ranges, node) else {
        return;
    };
    let connect = Arc::new(SystemdConnector {
        address: cfg
            .system_bus_address
            .clone()
            .unwrap_or_else(kubelet_nodeshutdown::default_system_bus_address),
        logind_conf_dir: cfg.logind_config_directory.clone().unwrap_or_else(|| {
            PathBuf::from(kubelet_nodeshutdown::systemd::LOGIND_CONFIG_DIRECTORY)
        }),
    });
    spawn_in(
        tasks,
        info_span!("nodeshutdown"),
        manager.run(connect, stop.child_token()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_request_is_upstreams() {
        let r = kill_request(6);
        assert_eq!(r.reason, "Terminated");
        assert_eq!(
            r.message,
            "Pod was terminated in response to imminent node shutdown."
        );
        assert_eq!(r.grace_period_override, Some(6));
        let c = &r.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
            ("DisruptionTarget", "True", Some("TerminationByKubelet"))
        );
    }
}
