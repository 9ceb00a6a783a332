//! The two ways the kubelet ends a pod that is still on the node: past its
//! `activeDeadlineSeconds` (upstream `active_deadline.go`), or because it
//! gave up on it (upstream `killPodNow` for eviction and node shutdown), and
//! what keeps such a pod ended after a kubelet restart (upstream
//! `generateAPIPodStatus` never leaves a terminal phase, and keeps the
//! reason and message that came with the phase).

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_types::pod;
use tracing::info;

use super::RuntimePodSyncer;
use crate::active_deadline;
use crate::error::Error;
use crate::pod_killer::KillRequest;
use crate::pod_workers::SyncOutcome;

/// A pod the kubelet ended before a restart (its last status, ours or the
/// apiserver's, is `Failed` with a pod-level reason: `Evicted`,
/// `Terminated`, ...) is ended again, never started: the kill request that
/// ended it, rebuilt from that status.
pub(super) fn restored_kill(cached: Option<&PodStatus>) -> Option<KillRequest> {
    let s = cached?;
    if s.phase.as_deref() != Some("Failed") {
        return None;
    }
    let reason = s.reason.clone().filter(|r| !r.is_empty())?;
    if reason == active_deadline::REASON {
        // Its own check ends it again.
        return None;
    }
    Some(KillRequest {
        reason,
        message: s.message.clone().unwrap_or_default(),
        conditions: vec![],
        grace_period_override: None,
    })
}

fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Upstream `generateAPIPodStatus`: a pod never leaves a terminal phase,
/// and the reason and message that came with a phase stay while it does.
pub(super) fn keep_phase(old: &PodStatus, new: &mut PodStatus) {
    if is_terminal(old.phase.as_deref()) && !is_terminal(new.phase.as_deref()) {
        new.phase.clone_from(&old.phase);
    }
    if new.phase == old.phase {
        if new.reason.as_deref().is_none_or(str::is_empty) {
            new.reason.clone_from(&old.reason);
        }
        if new.message.as_deref().is_none_or(str::is_empty) {
            new.message.clone_from(&old.message);
        }
    }
}

impl RuntimePodSyncer {
    /// Kills every container and the sandbox of `p` (`grace` overriding the
    /// pod's), then reads its status again (the status from before when the
    /// runtime cannot answer).
    async fn kill_and_reread(
        &self,
        p: &Pod,
        before: &kubelet_runtime::PodStatus,
        grace: Option<std::time::Duration>,
    ) -> (kubelet_runtime::Result<()>, kubelet_runtime::PodStatus) {
        let killed = self
            .runtime
            .kill_pod_with_spec(Some(p), before, grace, false)
            .await;
        let after = self
            .runtime
            .get_pod_status(pod::uid(p), pod::name(p), pod::namespace(p))
            .await
            .unwrap_or_else(|_| before.clone());
        (killed, after)
    }

    /// Stops a pod past its `activeDeadlineSeconds` and records `Failed`/`DeadlineExceeded`.
    pub(super) async fn fail_deadline(
        &self,
        p: &Pod,
        before: &kubelet_runtime::PodStatus,
    ) -> SyncOutcome {
        let uid = pod::uid(p);
        if before.live_containers().next().is_some() || before.has_ready_sandbox() {
            info!("Pod was active on the node longer than the specified deadline; stopping it");
        }
        let (killed, after) = self.kill_and_reread(p, before, None).await;
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

impl RuntimePodSyncer {
    /// Stops a pod the kubelet ends (eviction, node shutdown) with the
    /// request's grace period and records `Failed` with its reason; the pod
    /// is never started again (upstream `killPodNow` with a `PodStatusFunc`).
    pub(super) async fn fail_terminal(
        &self,
        p: &Pod,
        before: &kubelet_runtime::PodStatus,
        req: &crate::pod_killer::KillRequest,
    ) -> SyncOutcome {
        let uid = pod::uid(p);
        if before.live_containers().next().is_some() || before.has_ready_sandbox() {
            info!(reason = %req.reason, message = %req.message, "Killing pod");
        }
        let grace = req
            .grace_period_override
            .map(|g| std::time::Duration::from_secs(u64::try_from(g).unwrap_or(0)));
        let (killed, after) = self.kill_and_reread(p, before, grace).await;
        self.record_phase(p, &after, true, Some(req));
        if killed.is_ok() && after.live_containers().next().is_none() {
            // Upstream `SyncTerminatedPod`: the pod's volumes go now (a
            // Memory emptyDir's pages are what memory eviction reclaims),
            // its ConfigMap/Secret watches too, and container GC may take
            // its dead containers.
            if let Some((volumes, host)) = &self.volumes {
                volumes.pod_terminated(uid, false);
                host.unregister_pod(p);
            }
            self.status.mark_terminated(uid);
        }
        SyncOutcome {
            error: killed.err().map(Error::Kill),
            requeue_after: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kubelet_test_util::{FakeRuntime, pods};

    use super::*;
    use crate::pod_workers::PodSyncer;

    fn status(phase: &str, reason: Option<&str>) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            reason: reason.map(Into::into),
            message: reason.map(|r| format!("{r} message")),
            ..Default::default()
        }
    }

    #[test]
    fn a_terminal_phase_and_its_reason_stay() {
        let old = status("Failed", Some("Evicted"));
        let mut new = status("Running", None);
        keep_phase(&old, &mut new);
        assert_eq!(new.phase.as_deref(), Some("Failed"));
        assert_eq!(new.reason.as_deref(), Some("Evicted"));
        // Terminal to the other terminal phase is the generator's call.
        let mut new = status("Succeeded", None);
        keep_phase(&old, &mut new);
        assert_eq!(
            (new.phase.as_deref(), new.reason.as_deref()),
            (Some("Succeeded"), None)
        );
        // A live pod's new phase wins.
        let mut new = status("Running", None);
        keep_phase(&status("Pending", None), &mut new);
        assert_eq!(new.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn only_a_failed_pod_with_a_reason_is_ended_again() {
        let got = restored_kill(Some(&status("Failed", Some("Evicted")))).expect("kill");
        assert_eq!(
            (got.reason.as_str(), got.message.as_str()),
            ("Evicted", "Evicted message")
        );
        assert!(restored_kill(Some(&status("Failed", None))).is_none());
        assert!(restored_kill(Some(&status("Succeeded", Some("x")))).is_none());
        assert!(restored_kill(Some(&status("Running", Some("x")))).is_none());
        assert!(restored_kill(Some(&status("Failed", Some(active_deadline::REASON)))).is_none());
        assert!(restored_kill(None).is_none());
    }

    /// After a kubelet restart (or a reboot after node shutdown) an evicted
    /// `restartPolicy: Always` pod is never started again, and its status
    /// stays `Failed`/`Evicted`.
    #[tokio::test]
    async fn an_evicted_pod_is_not_started_after_a_restart() {
        let fake = FakeRuntime::new();
        let (s, status_manager) = super::super::tests::syncer(&fake);
        let mut p = pods::simple("web", "busybox", "Always");
        p.status = Some(status("Failed", Some("Evicted")));
        let p = Arc::new(p);
        s.sync_pod(&p).await;
        s.sync_pod(&p).await;
        assert_eq!(fake.call_count("CreateContainer"), 0, "never started");
        let got = status_manager.get_pod_status(pod::uid(&p)).expect("status");
        assert_eq!(
            (got.phase.as_deref(), got.reason.as_deref()),
            (Some("Failed"), Some("Evicted"))
        );
        assert!(status_manager.is_terminated(pod::uid(&p)));
    }
}
