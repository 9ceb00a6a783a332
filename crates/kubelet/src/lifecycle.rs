//! Pod admission (upstream `lifecycle/predicate.go` `GeneralPredicates`, the
//! pod-count part, and `Kubelet.rejectPod`): a pod that would exceed `maxPods`
//! is rejected as `Failed` with reason `OutOfpods` and never started.

use k8s_openapi::api::core::v1::PodStatus;

/// Why a pod was not admitted: (reason, message), upstream strings.
pub type Rejection = (String, String);

/// Admits a new pod when fewer than `max_pods` pods are active.
pub fn admit(active: usize, max_pods: u32) -> Result<(), Rejection> {
    let capacity = usize::try_from(max_pods).unwrap_or(usize::MAX);
    if active < capacity {
        return Ok(());
    }
    Err((
        "OutOfpods".to_string(),
        format!(
            "Node didn't have enough resource: pods, requested: 1, used: {active}, capacity: {capacity}"
        ),
    ))
}

/// The status a rejected pod gets (upstream `rejectPod`).
pub fn rejected_status((reason, message): &Rejection) -> PodStatus {
    PodStatus {
        phase: Some(kubelet_types::PodPhase::Failed.as_str().to_string()),
        reason: Some(reason.clone()),
        message: Some(format!("Pod {message}")),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_count_limit() {
        assert!(admit(0, 1).is_ok());
        let r = admit(1, 1).expect_err("full");
        assert_eq!(r.0, "OutOfpods");
        assert_eq!(
            r.1,
            "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"
        );
        let s = rejected_status(&r);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert!(
            s.message
                .as_deref()
                .is_some_and(|m| m.starts_with("Pod Node didn't"))
        );
    }
}
