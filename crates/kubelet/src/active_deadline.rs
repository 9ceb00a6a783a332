//! `activeDeadlineSeconds` (upstream `pkg/kubelet/active_deadline.go`): a pod
//! active on the node longer than its deadline is stopped and marked
//! `Failed` with reason `DeadlineExceeded`; it is never started again.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_types::PodPhase;

/// Upstream reason.
pub const REASON: &str = "DeadlineExceeded";
/// Upstream message.
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Time left before the pod's deadline, `Some(ZERO)` once it passed, `None`
/// when the pod has no deadline or no start time yet.
pub fn remaining(p: &Pod, status: Option<&PodStatus>, now: SystemTime) -> Option<Duration> {
    let secs = p.spec.as_ref()?.active_deadline_seconds?;
    let start = status?.start_time.as_ref()?;
    let start = SystemTime::from(start.0);
    let deadline = start + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    Some(deadline.duration_since(now).unwrap_or(Duration::ZERO))
}

/// True when the status already records the deadline failure.
pub fn exceeded(status: Option<&PodStatus>) -> bool {
    status.is_some_and(|s| {
        s.phase.as_deref() == Some(PodPhase::Failed.as_str()) && s.reason.as_deref() == Some(REASON)
    })
}

/// `status` turned into the deadline failure (keeping container statuses and start time).
pub fn failed(mut status: PodStatus) -> PodStatus {
    status.phase = Some(PodPhase::Failed.as_str().to_string());
    status.reason = Some(REASON.to_string());
    status.message = Some(MESSAGE.to_string());
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn deadline_from_start_time() {
        let p: Pod = serde_json::from_value(
            serde_json::json!({"spec": {"activeDeadlineSeconds": 30, "containers": []}}),
        )
        .expect("pod");
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let status = PodStatus {
            start_time: jiff::Timestamp::try_from(t0).ok().map(Time),
            ..Default::default()
        };
        assert_eq!(
            remaining(&p, Some(&status), t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            remaining(&p, Some(&status), t0 + Duration::from_secs(31)),
            Some(Duration::ZERO)
        );
        assert_eq!(remaining(&p, None, t0), None);
        let none: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": []}})).expect("pod");
        assert_eq!(remaining(&none, Some(&status), t0), None);
        let f = failed(status);
        assert!(exceeded(Some(&f)));
        assert_eq!(f.message.as_deref(), Some(MESSAGE));
    }
}
