//! Killing a pod the kubelet itself gives up on (upstream `killPodNow`,
//! the `KillPodFunc` the eviction manager and the node shutdown manager
//! call): the pod's worker stops its containers with an optional grace
//! period override, the pod's status becomes `Failed` with the caller's
//! reason and message, and the pod is never started again while it stays
//! on the node.
//!
//! The request is kept in [`Terminations`], which the pod syncer reads
//! before every sync (as it reads `activeDeadlineSeconds`): the kill goes
//! through the pod's own worker, so it never races a sync of the same pod.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use kubelet_types::{PodPhase, pod};
use parking_lot::Mutex;

use crate::pod_workers::{PodWork, PodWorkers, WorkKind};
use crate::status::StatusManager;

/// How the kubelet ends a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct KillRequest {
    /// The pod's `status.reason` (`Evicted`, `Terminated`).
    pub reason: String,
    /// The pod's `status.message`.
    pub message: String,
    /// Conditions to set on the pod (`DisruptionTarget`), replacing one of
    /// the same type.
    pub conditions: Vec<PodCondition>,
    /// Seconds every container gets instead of its own grace period.
    pub grace_period_override: Option<i64>,
}

impl KillRequest {
    /// `status` as this request ends it: `Failed`, the reason and message,
    /// the conditions; container statuses and the start time are kept.
    pub fn terminal_status(&self, mut status: PodStatus) -> PodStatus {
        status.phase = Some(PodPhase::Failed.as_str().to_string());
        status.reason = Some(self.reason.clone());
        status.message = Some(self.message.clone());
        if !self.conditions.is_empty() {
            let mut conditions = status.conditions.take().unwrap_or_default();
            for c in &self.conditions {
                conditions.retain(|o| o.type_ != c.type_);
                conditions.push(c.clone());
            }
            status.conditions = Some(conditions);
        }
        status
    }
}

/// The pods the kubelet is ending, by UID; shared by the killer and the
/// pod syncer.
#[derive(Clone, Default)]
pub struct Terminations {
    requests: Arc<Mutex<HashMap<String, KillRequest>>>,
}

impl Terminations {
    /// The request for a pod, if the kubelet is ending it.
    pub fn get(&self, uid: &str) -> Option<KillRequest> {
        self.requests.lock().get(uid).cloned()
    }

    /// Records a request; the first one for a pod wins (a pod evicted is
    /// not terminated again by node shutdown), except that a shorter grace
    /// period override replaces a longer one.
    pub fn insert(&self, uid: &str, req: KillRequest) {
        let mut m = self.requests.lock();
        match m.get_mut(uid) {
            None => {
                m.insert(uid.to_string(), req);
            }
            Some(old) => {
                if let Some(g) = req.grace_period_override
                    && old.grace_period_override.is_none_or(|o| g < o)
                {
                    old.grace_period_override = Some(g);
                }
            }
        }
    }

    /// Forgets a pod that left the node.
    pub fn forget(&self, uid: &str) {
        self.requests.lock().remove(uid);
    }
}

/// Why a kill did not finish.
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    /// The pod's status did not turn `Failed` in time.
    #[error("timed out after {0:?} waiting for pod {1} to be killed")]
    Timeout(Duration, String),
}

/// Ends pods (upstream `eviction.KillPodFunc`, `nodeshutdown`'s `killPodFunc`).
#[async_trait::async_trait]
pub trait PodKiller: Send + Sync + 'static {
    /// Kills the pod and waits until it is stopped for good with a terminal
    /// status (the request's, or an earlier one's), at most the grace
    /// period plus `slack`.
    async fn kill_pod(&self, pod: &Arc<Pod>, req: KillRequest) -> Result<(), KillError>;
}

/// The kubelet's killer: through the pod workers.
pub struct WorkerKiller {
    /// Shared with the pod syncer.
    pub terminations: Terminations,
    /// The pod workers.
    pub workers: Arc<dyn PodWorkers>,
    /// Where the pod's status shows the kill.
    pub status: Arc<StatusManager>,
    /// Waited on top of the grace period.
    pub slack: Duration,
}

impl WorkerKiller {
    /// The pod's containers are stopped for good and its status is
    /// terminal (whichever request ended it first).
    fn done(&self, uid: &str) -> bool {
        self.status.is_terminated(uid)
            && self.status.get_pod_status(uid).is_some_and(|s| {
                matches!(s.phase.as_deref(), Some(ph) if ph == PodPhase::Failed.as_str() || ph == PodPhase::Succeeded.as_str())
            })
    }
}

#[async_trait::async_trait]
impl PodKiller for WorkerKiller {
    async fn kill_pod(&self, p: &Arc<Pod>, req: KillRequest) -> Result<(), KillError> {
        let uid = pod::uid(p).to_string();
        let grace = req
            .grace_period_override
            .or_else(|| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        self.terminations.insert(&uid, req);
        // A kill, not a sync: it cuts a sync in progress (an image pull, a
        // mount wait) and a longer kill, as upstream's `SyncPodKill` does;
        // the kill path reads the request's grace period and status.
        self.workers.update_pod(PodWork {
            kind: WorkKind::Kill { remove: false },
            pod: p.clone(),
        });
        let limit = Duration::from_secs(u64::try_from(grace).unwrap_or(0)) + self.slack;
        let wait = async {
            while !self.done(&uid) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| KillError::Timeout(limit, uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(reason: &str, grace: Option<i64>) -> KillRequest {
        KillRequest {
            reason: reason.into(),
            message: "m".into(),
            conditions: vec![],
            grace_period_override: grace,
        }
    }

    #[test]
    fn first_request_wins_but_a_shorter_grace_replaces() {
        let t = Terminations::default();
        t.insert("u", req("Evicted", Some(30)));
        t.insert("u", req("Terminated", Some(5)));
        let got = t.get("u").expect("request");
        assert_eq!(got.reason, "Evicted");
        assert_eq!(got.grace_period_override, Some(5));
        t.insert("u", req("Terminated", None));
        assert_eq!(t.get("u").and_then(|r| r.grace_period_override), Some(5));
        t.forget("u");
        assert!(t.get("u").is_none());
    }

    #[test]
    fn terminal_status_keeps_containers_and_replaces_conditions() {
        let mut r = req("Evicted", None);
        r.conditions = vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            ..Default::default()
        }];
        let before = PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![Default::default()]),
            conditions: Some(vec![
                PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                PodCondition {
                    type_: "DisruptionTarget".into(),
                    status: "False".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let s = r.terminal_status(before);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        assert_eq!(s.container_statuses.map(|c| c.len()), Some(1));
        let conds = s.conditions.unwrap_or_default();
        assert_eq!(conds.len(), 2);
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        );
    }
}
