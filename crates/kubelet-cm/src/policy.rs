//! OOM score adjustment by QoS (upstream `pkg/kubelet/qos/policy.go`
//! `GetContainerOOMScoreAdjust`, with `KubeletOOMScoreAdjTieBreak` and
//! pod-level resources off, their defaults).

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::qos::{QosClass, pod_qos};
use kubelet_types::quantity::Quantity;

/// The kubelet's own oom_score_adj.
pub const KUBELET_OOM_SCORE_ADJ: i64 = -999;
/// Guaranteed containers and node-critical pods.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// BestEffort containers.
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// Priority at and above which a pod is critical (upstream `scheduling.SystemCriticalPriority`).
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Upstream `kubetypes.IsCriticalPod`: static, mirror, or system-critical priority.
fn is_critical(p: &Pod) -> bool {
    let mirror = p
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let priority = p.spec.as_ref().and_then(|s| s.priority);
    kubelet_types::pod::is_static(p)
        || mirror
        || priority.is_some_and(|v| v >= SYSTEM_CRITICAL_PRIORITY)
}

/// Upstream `kubetypes.IsNodeCriticalPod`: critical with priority class `system-node-critical`.
fn is_node_critical(p: &Pod) -> bool {
    is_critical(p)
        && p.spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref())
            == Some("system-node-critical")
}

fn memory_request(c: &Container) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .and_then(|q| Quantity::from_api(q).ok())
        .map_or(0, |q| q.value())
}

/// Upstream `isSidecarContainer`: an init container with `restartPolicy: Always`.
fn is_sidecar(p: &Pod, c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
        && p.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .is_some_and(|ics| ics.iter().any(|ic| ic.name == c.name))
}

/// The container's oom_score_adj: node-critical and Guaranteed -997,
/// BestEffort 1000, Burstable `1000 - 1000*memoryRequest/machineMemory`
/// kept within [3, 999] (3 = 1000 + the Guaranteed value; 1000 becomes 999
/// so a Burstable container outlives a BestEffort one). A sidecar scores no
/// higher than the regular container with the smallest memory request.
pub fn container_oom_score_adjust(p: &Pod, c: &Container, machine_memory: i64) -> i64 {
    if is_node_critical(p) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod_qos(p) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BESTEFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    if machine_memory <= 0 {
        // Unknown capacity (upstream would divide by zero): the Burstable ceiling.
        return BESTEFFORT_OOM_SCORE_ADJ - 1;
    }
    let adj_for =
        |req: i64| 1000 - (1000i128 * i128::from(req) / i128::from(machine_memory)) as i64;
    let mut adj = adj_for(memory_request(c));
    if is_sidecar(p, c) {
        let min_regular = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().map(memory_request).min())
            .unwrap_or(0);
        adj = adj.min(adj_for(min_regular));
    }
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        return 1000 + GUARANTEED_OOM_SCORE_ADJ;
    }
    if adj == BESTEFFORT_OOM_SCORE_ADJ {
        return adj - 1;
    }
    adj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    const GI: i64 = 1 << 30;

    #[test]
    fn scores_by_qos_class() {
        let g = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}),
        );
        let c = &g.spec.as_ref().expect("spec").containers[0];
        assert_eq!(container_oom_score_adjust(&g, c, 10 * GI), -997);
        let be = pod(
            serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [{"name": "a"}]}}),
        );
        let c = &be.spec.as_ref().expect("spec").containers[0];
        assert_eq!(container_oom_score_adjust(&be, c, 10 * GI), 1000);
    }

    #[test]
    fn burstable_scales_with_the_memory_request_within_bounds() {
        let b = |mem: &str| {
            pod(
                serde_json::json!({"metadata": {"uid": "u"}, "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "10m", "memory": mem}}}]}}),
            )
        };
        let score = |p: &Pod| {
            container_oom_score_adjust(p, &p.spec.as_ref().expect("spec").containers[0], 10 * GI)
        };
        assert_eq!(score(&b("1Gi")), 900);
        assert_eq!(score(&b("10Gi")), 3, "never below 1000 + -997");
        assert_eq!(score(&b("20Gi")), 3);
        assert_eq!(score(&b("1")), 999, "never 1000: BestEffort goes first");
    }

    #[test]
    fn sidecar_scores_no_higher_than_the_smallest_regular_container() {
        let p = pod(serde_json::json!({"metadata": {"uid": "u"}, "spec": {
            "initContainers": [{"name": "s", "restartPolicy": "Always", "resources": {"requests": {"memory": "100Mi"}}}],
            "containers": [{"name": "a", "resources": {"requests": {"memory": "2Gi"}}},
                           {"name": "b", "resources": {"requests": {"memory": "1Gi"}}}]}}));
        let s = &p
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .expect("init")[0];
        assert_eq!(container_oom_score_adjust(&p, s, 10 * GI), 900);
    }

    #[test]
    fn node_critical_pods_score_as_guaranteed() {
        let p = pod(
            serde_json::json!({"metadata": {"uid": "u", "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"priorityClassName": "system-node-critical", "containers": [{"name": "a"}]}}),
        );
        let c = &p.spec.as_ref().expect("spec").containers[0];
        assert_eq!(container_oom_score_adjust(&p, c, 10 * GI), -997);
    }
}
