//! Labels and annotations kubelet-rs puts on sandboxes and containers, the
//! same keys upstream uses (`pkg/kubelet/kuberuntime/labels.go`), so `crictl`
//! shows pod names and a restarted kubelet can adopt what is running.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::{labels, pod};

/// Sandbox labels: the pod's own labels plus name, namespace and UID.
pub fn sandbox_labels(p: &Pod) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = p
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(labels::POD_NAME.into(), pod::name(p).into());
    out.insert(labels::POD_NAMESPACE.into(), pod::namespace(p).into());
    out.insert(labels::POD_UID.into(), pod::uid(p).into());
    out
}

/// Sandbox annotations: the pod's annotations.
pub fn sandbox_annotations(p: &Pod) -> HashMap<String, String> {
    p.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Container labels: pod name, namespace, UID and container name.
pub fn container_labels(p: &Pod, c: &Container) -> HashMap<String, String> {
    HashMap::from([
        (labels::POD_NAME.into(), pod::name(p).into()),
        (labels::POD_NAMESPACE.into(), pod::namespace(p).into()),
        (labels::POD_UID.into(), pod::uid(p).into()),
        (labels::CONTAINER_NAME.into(), c.name.clone()),
    ])
}

/// Container annotations: spec hash and its version, restart count,
/// termination settings, ports.
pub fn container_annotations(
    p: &Pod,
    c: &Container,
    restart_count: i32,
) -> HashMap<String, String> {
    let mut out = HashMap::from([
        (labels::CONTAINER_HASH.into(), pod::container_hash(c)),
        (
            labels::CONTAINER_HASH_VERSION.into(),
            kubelet_types::hash::HASH_VERSION.into(),
        ),
        (
            labels::CONTAINER_RESTART_COUNT.into(),
            restart_count.to_string(),
        ),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.into(),
            c.termination_message_path.clone().unwrap_or_default(),
        ),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
            c.termination_message_policy.clone().unwrap_or_default(),
        ),
    ]);
    if let Some(g) = p
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        out.insert(labels::POD_TERMINATION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty())
        && let Ok(json) = serde_json::to_string(ports)
    {
        out.insert(labels::CONTAINER_PORTS.into(), json);
    }
    // Upstream `newContainerAnnotations` writes the preStop handler too, so an
    // upstream kubelet that takes over can run it for a container whose pod
    // is gone.
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(pre_stop)
    {
        out.insert(labels::CONTAINER_PRE_STOP_HANDLER.into(), json);
    }
    out
}

/// The pod UID label of a sandbox or container, if it has one.
pub fn pod_uid(labels_: &HashMap<String, String>) -> Option<&str> {
    labels_.get(labels::POD_UID).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [container]}
        }))
        .expect("pod")
    }

    #[test]
    fn pre_stop_handler_is_annotated_as_upstream_writes_it() {
        let p = pod(serde_json::json!({"name": "c", "image": "i",
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 1"]}}}}));
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let a = container_annotations(&p, c, 0);
        let v: serde_json::Value = serde_json::from_str(
            a.get(labels::CONTAINER_PRE_STOP_HANDLER)
                .expect("preStop annotation"),
        )
        .expect("json");
        assert_eq!(
            v,
            serde_json::json!({"exec": {"command": ["sh", "-c", "sleep 1"]}})
        );

        let p = pod(serde_json::json!({"name": "c", "image": "i"}));
        let c = &p.spec.as_ref().expect("spec").containers[0];
        assert!(!container_annotations(&p, c, 0).contains_key(labels::CONTAINER_PRE_STOP_HANDLER));
    }
}
