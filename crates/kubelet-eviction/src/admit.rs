//! The node's pressure as others read it, and the eviction admit handler
//! (upstream `managerImpl.Admit`, `IsUnderMemoryPressure` and friends):
//! under memory pressure alone only BestEffort pods that do not tolerate
//! the memory-pressure taint are refused; under any other pressure every
//! pod is, critical pods excepted.

use k8s_openapi::api::core::v1::{Pod, Toleration};
use kubelet_types::qos::{QosClass, pod_qos};
use tokio::sync::watch;

use crate::api::NodeCondition;
use crate::message::{REASON, node_condition_message};

/// Priority at and above which a pod is critical (upstream
/// `scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Upstream `kubelettypes.IsCriticalPod`: static, mirror, or of
/// system-critical priority.
pub fn is_critical(p: &Pod) -> bool {
    let mirror = p
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    kubelet_types::pod::is_static(p)
        || mirror
        || p.spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|v| v >= SYSTEM_CRITICAL_PRIORITY)
}

/// Upstream `Toleration.ToleratesTaint` for a taint without a value.
fn tolerates(t: &Toleration, key: &str, effect: &str) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == effect);
    let key_ok = t.key.as_deref().is_none_or(|k| k.is_empty()) || t.key.as_deref() == Some(key);
    let op = t.operator.as_deref().unwrap_or("Equal");
    let value_ok = match op {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("").is_empty(),
        _ => false,
    };
    // An empty key matches every key only with `Exists`.
    let empty_key = t.key.as_deref().is_none_or(|k| k.is_empty());
    effect_ok && key_ok && value_ok && (!empty_key || op == "Exists")
}

/// Where the manager publishes the conditions.
#[derive(Debug)]
pub struct PressureSender(pub(crate) watch::Sender<Vec<NodeCondition>>);

/// The conditions eviction last reported; cheap to clone.
#[derive(Clone, Debug)]
pub struct Pressure {
    rx: watch::Receiver<Vec<NodeCondition>>,
}

impl Pressure {
    /// A pressure that never changes from `conditions` (tests, no eviction).
    pub fn fixed(conditions: Vec<NodeCondition>) -> Self {
        let (_tx, rx) = watch::channel(conditions);
        Self { rx }
    }

    pub(crate) fn from_receiver(rx: watch::Receiver<Vec<NodeCondition>>) -> Self {
        Self { rx }
    }

    /// A channel: the manager publishes on the sender, readers hold the
    /// receiving side (created before the manager, so admission and node
    /// status can be wired first).
    pub fn channel() -> (PressureSender, Self) {
        let (tx, rx) = watch::channel(Vec::new());
        (PressureSender(tx), Self { rx })
    }

    /// The conditions now, in the order eviction observed them.
    pub fn conditions(&self) -> Vec<NodeCondition> {
        self.rx.borrow().clone()
    }

    /// Whether `c` holds.
    pub fn has(&self, c: NodeCondition) -> bool {
        self.rx.borrow().contains(&c)
    }

    /// Resolves when the conditions change.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// Upstream `Admit`: `Err((reason, message))` refuses the pod.
    pub fn admit(&self, p: &Pod) -> Result<(), (String, String)> {
        let conditions = self.conditions();
        if conditions.is_empty() || is_critical(p) {
            return Ok(());
        }
        if conditions == [NodeCondition::MemoryPressure] {
            if pod_qos(p) != QosClass::BestEffort {
                return Ok(());
            }
            let tolerations = p.spec.as_ref().and_then(|s| s.tolerations.as_ref());
            if tolerations
                .into_iter()
                .flatten()
                .any(|t| tolerates(t, "node.kubernetes.io/memory-pressure", "NoSchedule"))
            {
                return Ok(());
            }
        }
        let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
        tracing::info!(
            pod = %kubelet_types::pod::format_pod(p),
            node_condition = ?names,
            "Failed to admit pod to node"
        );
        Err((REASON.to_string(), node_condition_message(&names)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": spec
        }))
        .expect("pod")
    }

    fn best_effort() -> Pod {
        pod(serde_json::json!({"containers": [{"name": "c"}]}))
    }

    fn burstable() -> Pod {
        pod(serde_json::json!({"containers": [{"name": "c",
            "resources": {"requests": {"memory": "10Mi"}}}]}))
    }

    #[test]
    fn memory_pressure_rejects_best_effort_only() {
        let p = Pressure::fixed(vec![NodeCondition::MemoryPressure]);
        let err = p.admit(&best_effort()).expect_err("rejected");
        assert_eq!(err.0, "Evicted");
        assert_eq!(err.1, "The node had condition: [MemoryPressure]. ");
        assert!(p.admit(&burstable()).is_ok());
        let tolerating = pod(serde_json::json!({"containers": [{"name": "c"}],
            "tolerations": [{"key": "node.kubernetes.io/memory-pressure",
                "operator": "Exists", "effect": "NoSchedule"}]}));
        assert!(p.admit(&tolerating).is_ok());
        let other_taint = pod(serde_json::json!({"containers": [{"name": "c"}],
            "tolerations": [{"key": "node.kubernetes.io/disk-pressure",
                "operator": "Exists", "effect": "NoSchedule"}]}));
        assert!(p.admit(&other_taint).is_err());
    }

    #[test]
    fn disk_pressure_rejects_all_but_critical() {
        let p = Pressure::fixed(vec![
            NodeCondition::MemoryPressure,
            NodeCondition::DiskPressure,
        ]);
        let err = p.admit(&burstable()).expect_err("rejected");
        assert_eq!(
            err.1,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        let critical = pod(serde_json::json!({"containers": [{"name": "c"}],
            "priority": 2_000_001_000}));
        assert!(p.admit(&critical).is_ok());
        assert!(Pressure::fixed(vec![]).admit(&best_effort()).is_ok());
    }
}
