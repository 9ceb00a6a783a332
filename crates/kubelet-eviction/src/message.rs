//! What an eviction says (upstream `evictionMessage`,
//! `getThresholdMetInfo` and the message formats of `helpers.go`): the
//! pod's status message, the `Evicted` event's annotations, and the
//! messages of local storage evictions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::quantity::{Format, Quantity};

use crate::api::{Resource, Threshold};
use crate::stats::{Observations, PodStats};

/// The pod's `status.reason` (upstream `Reason`).
pub const REASON: &str = "Evicted";
/// Event annotation: containers over their requests.
pub const OFFENDING_CONTAINERS_KEY: &str = "offending_containers";
/// Event annotation: those containers' usage.
pub const OFFENDING_CONTAINERS_USAGE_KEY: &str = "offending_containers_usage";
/// Event annotation: the starved resource.
pub const STARVED_RESOURCE_KEY: &str = "starved_resource";

/// Admission's message under pressure (upstream `nodeConditionMessageFmt`
/// with Go's `%v` of a slice).
pub fn node_condition_message(conditions: &[&str]) -> String {
    format!("The node had condition: [{}]. ", conditions.join(" "))
}

/// Upstream `emptyDirMessageFmt`.
pub fn empty_dir_message(volume: &str, limit: &Quantity) -> String {
    format!("Usage of EmptyDir volume {volume:?} exceeds the limit \"{limit}\". ")
}

/// Upstream `containerEphemeralStorageMessageFmt`.
pub fn container_ephemeral_message(container: &str, limit: &Quantity) -> String {
    format!("Container {container} exceeded its local ephemeral storage limit \"{limit}\". ")
}

/// Upstream `podEphemeralStorageMessageFmt`.
pub fn pod_ephemeral_message(limit: &Quantity) -> String {
    format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. ")
}

/// Upstream `getThresholdMetInfo`: the first threshold on `resource` with
/// an observation, as (threshold quantity, available).
fn threshold_met_info(
    resource: Resource,
    thresholds: &[Threshold],
    obs: &Observations,
) -> Option<(Quantity, Quantity)> {
    thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| {
            let o = obs.get(&t.signal)?;
            Some((
                t.value.quantity(o.capacity, Format::BinarySI),
                Quantity::new(o.available, resource.format()),
            ))
        })
}

/// Upstream `evictionMessage`: the message and the event's annotations.
pub fn eviction_message(
    resource: Resource,
    p: &Pod,
    stats: Option<&PodStats>,
    thresholds: &[Threshold],
    obs: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut annotations = BTreeMap::new();
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some((q, available)) = threshold_met_info(resource, thresholds, obs) {
        message.push_str(&format!(
            "Threshold quantity: {q}, available: {available}. "
        ));
    }
    let Some(stats) = stats else {
        return (message, annotations);
    };
    // Upstream `evictionMessage` names only the pod's (non-init) containers.
    let containers: Vec<_> = p
        .spec
        .as_ref()
        .map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .collect();
    let mut names = Vec::new();
    let mut usages = Vec::new();
    for cs in &stats.containers {
        let Some(c) = containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource.as_str()))
            .and_then(|q| Quantity::from_api(q).ok())
            .unwrap_or(Quantity::ZERO);
        let to_q = |v: u64| Quantity::new(i64::try_from(v).unwrap_or(i64::MAX), Format::BinarySI);
        let usage = match resource {
            Resource::EphemeralStorage => match (cs.rootfs.used_bytes, cs.logs.used_bytes) {
                (Some(r), Some(l)) => Some(to_q(r.saturating_add(l))),
                _ => None,
            },
            Resource::Memory => cs.memory_working_set.map(to_q),
            _ => None,
        };
        if let Some(u) = usage
            && u > request
        {
            message.push_str(&format!(
                "Container {} was using {u}, request is {request}, has larger consumption of {resource}. ",
                c.name
            ));
            names.push(c.name.clone());
            usages.push(u.to_string());
        }
    }
    annotations.insert(OFFENDING_CONTAINERS_KEY.into(), names.join(","));
    annotations.insert(OFFENDING_CONTAINERS_USAGE_KEY.into(), usages.join(","));
    annotations.insert(STARVED_RESOURCE_KEY.into(), resource.as_str().into());
    (message, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Signal, ThresholdValue};
    use crate::stats::{ContainerStats, Observation};
    use std::time::Duration;

    #[test]
    fn memory_message_as_upstream() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hog", "uid": "u1"},
            "spec": {"containers": [
                {"name": "x"},
                {"name": "y", "resources": {"requests": {"memory": "2Gi"}}}
            ], "initContainers": [{"name": "sidecar", "restartPolicy": "Always"}]}
        }))
        .expect("pod");
        let stats = PodStats {
            uid: "u1".into(),
            containers: vec![
                ContainerStats {
                    name: "x".into(),
                    memory_working_set: Some(1 << 30),
                    ..Default::default()
                },
                ContainerStats {
                    name: "y".into(),
                    memory_working_set: Some(1 << 20),
                    ..Default::default()
                },
                // Upstream names only spec.containers.
                ContainerStats {
                    name: "sidecar".into(),
                    memory_working_set: Some(1 << 30),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let t = Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::parse("100Mi").expect("q")),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        let obs: Observations = [(
            Signal::MemoryAvailable,
            Observation {
                available: 12 * 1024,
                capacity: 1 << 33,
                time: None,
            },
        )]
        .into();
        let (m, a) = eviction_message(Resource::Memory, &p, Some(&stats), &[t], &obs);
        assert_eq!(
            m,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 12Ki. \
             Container x was using 1Gi, request is 0, has larger consumption of memory. "
        );
        assert_eq!(a[OFFENDING_CONTAINERS_KEY], "x");
        assert_eq!(a[OFFENDING_CONTAINERS_USAGE_KEY], "1Gi");
        assert_eq!(a[STARVED_RESOURCE_KEY], "memory");
    }

    #[test]
    fn local_storage_messages() {
        let q = Quantity::parse("10Mi").expect("q");
        assert_eq!(
            empty_dir_message("cache", &q),
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". "
        );
        assert_eq!(
            container_ephemeral_message("c", &q),
            "Container c exceeded its local ephemeral storage limit \"10Mi\". "
        );
        assert_eq!(
            pod_ephemeral_message(&q),
            "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
        );
        assert_eq!(
            node_condition_message(&["MemoryPressure"]),
            "The node had condition: [MemoryPressure]. "
        );
    }
}
