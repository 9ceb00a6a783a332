//! What a status report would change on the apiserver (upstream
//! `tryUpdateNodeStatus`'s comparison, `nodeStatusHasChanged` and
//! `nodeConditionsHaveChanged` in `kubelet_node_status.go`).
//!
//! Upstream runs its setters over the Node it just read from the apiserver and
//! compares the result with what it read, so anything that differs from the
//! server (a condition the node lifecycle controller set to `Unknown` while
//! the kubelet could not report, say) is patched at the next interval.
//! [`patched`] gives the same view here: the server's status with the
//! kubelet's strategic-merge patch applied. [`changed`] compares two statuses
//! as upstream's `apiequality.Semantic.DeepEqual` would, ignoring heartbeats:
//! conditions in type order, quantities by value, empty lists and maps equal
//! to absent ones.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_types::quantity::Quantity as Parsed;

/// The status the apiserver holds once `ours` is patched onto `server`:
/// conditions merge by type, capacity and allocatable by key, nodeInfo by
/// field; images, volumes in use (once known) and (when the kubelet owns
/// them) addresses are replaced; fields the kubelet does not set (attached
/// volumes, NetworkUnavailable, ...) stay.
pub fn patched(server: &NodeStatus, ours: &NodeStatus, own_addresses: bool) -> NodeStatus {
    let mut out = server.clone();
    if own_addresses && ours.addresses.is_some() {
        out.addresses.clone_from(&ours.addresses);
    }
    for (mine, theirs) in [
        (&ours.capacity, &mut out.capacity),
        (&ours.allocatable, &mut out.allocatable),
    ] {
        if let Some(mine) = mine {
            theirs
                .get_or_insert_with(BTreeMap::new)
                .extend(mine.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    if let Some(mine) = &ours.conditions {
        let list = out.conditions.get_or_insert_with(Vec::new);
        for c in mine {
            match list.iter_mut().find(|o| o.type_ == c.type_) {
                Some(o) => o.clone_from(c),
                None => list.push(c.clone()),
            }
        }
    }
    if ours.daemon_endpoints.is_some() {
        out.daemon_endpoints.clone_from(&ours.daemon_endpoints);
    }
    if ours.images.is_some() {
        out.images.clone_from(&ours.images);
    }
    if ours.volumes_in_use.is_some() {
        out.volumes_in_use.clone_from(&ours.volumes_in_use);
    }
    if let Some(mine) = &ours.node_info {
        let swap = out.node_info.take().and_then(|i| i.swap);
        let mut info = mine.clone();
        if info.swap.is_none() {
            info.swap = swap;
        }
        out.node_info = Some(info);
    }
    out
}

/// Whether two statuses differ in anything but heartbeat times (upstream
/// `nodeStatusHasChanged`).
pub fn changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    normalised(old) != normalised(new)
}

/// A status as upstream's semantic equality sees it.
fn normalised(s: &NodeStatus) -> NodeStatus {
    let mut s = s.clone();
    let mut conditions: Vec<NodeCondition> = s.conditions.take().unwrap_or_default();
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    for c in &mut conditions {
        c.last_heartbeat_time = None;
    }
    s.conditions = non_empty(conditions);
    s.capacity = s.capacity.map(by_value).and_then(non_empty_map);
    s.allocatable = s.allocatable.map(by_value).and_then(non_empty_map);
    s.addresses = s.addresses.and_then(non_empty);
    s.images = s.images.and_then(non_empty);
    s.volumes_attached = s.volumes_attached.and_then(non_empty);
    s.volumes_in_use = s.volumes_in_use.and_then(non_empty);
    s.runtime_handlers = s.runtime_handlers.and_then(non_empty);
    s
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn non_empty_map<K, V>(m: BTreeMap<K, V>) -> Option<BTreeMap<K, V>> {
    (!m.is_empty()).then_some(m)
}

/// Quantities rewritten by value (`1Gi` and `1024Mi` compare equal); one that
/// does not parse is kept as written.
fn by_value(m: BTreeMap<String, Quantity>) -> BTreeMap<String, Quantity> {
    m.into_iter()
        .map(|(k, q)| match Parsed::from_api(&q) {
            Ok(p) => (k, Quantity(format!("{}n", p.as_nanos()))),
            Err(_) => (k, q),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn t(s: i64) -> Option<Time> {
        Some(Time(jiff::Timestamp::from_second(s).expect("t")))
    }

    fn cond(ty: &str, status: &str, beat: i64, transition: i64) -> NodeCondition {
        NodeCondition {
            type_: ty.into(),
            status: status.into(),
            reason: Some("R".into()),
            message: Some("m".into()),
            last_heartbeat_time: t(beat),
            last_transition_time: t(transition),
        }
    }

    fn status(conditions: Vec<NodeCondition>) -> NodeStatus {
        NodeStatus {
            conditions: Some(conditions),
            ..Default::default()
        }
    }

    #[test]
    fn heartbeats_and_condition_order_are_not_changes() {
        let a = status(vec![
            cond("Ready", "True", 1, 1),
            cond("DiskPressure", "False", 1, 1),
        ]);
        let b = status(vec![
            cond("DiskPressure", "False", 9, 1),
            cond("Ready", "True", 9, 1),
        ]);
        assert!(!changed(&a, &b));
    }

    #[test]
    fn a_status_or_transition_change_is_a_change() {
        let a = status(vec![cond("Ready", "Unknown", 1, 1)]);
        assert!(changed(&a, &status(vec![cond("Ready", "True", 1, 1)])));
        assert!(changed(
            &status(vec![cond("Ready", "True", 1, 1)]),
            &status(vec![cond("Ready", "True", 1, 2)])
        ));
        assert!(changed(&a, &status(vec![])), "a condition less");
    }

    #[test]
    fn quantities_compare_by_value_and_empty_equals_absent() {
        let q = |s: &str| -> NodeStatus {
            NodeStatus {
                capacity: Some([("memory".to_string(), Quantity(s.into()))].into()),
                images: Some(vec![]),
                ..Default::default()
            }
        };
        assert!(!changed(&q("1Gi"), &q("1024Mi")));
        assert!(changed(&q("1Gi"), &q("1025Mi")));
        let mut bare = q("1Gi");
        bare.images = None;
        assert!(!changed(&bare, &q("1Gi")));
    }

    #[test]
    fn the_patch_replaces_the_kubelets_conditions_and_keeps_others() {
        let server = NodeStatus {
            conditions: Some(vec![
                cond("NetworkUnavailable", "False", 1, 1),
                cond("Ready", "Unknown", 1, 1),
            ]),
            capacity: Some([("example.com/gpu".to_string(), Quantity("1".into()))].into()),
            volumes_in_use: Some(vec!["v".into()]),
            ..Default::default()
        };
        let ours = NodeStatus {
            conditions: Some(vec![cond("Ready", "True", 2, 2)]),
            capacity: Some([("cpu".to_string(), Quantity("2".into()))].into()),
            ..Default::default()
        };
        let out = patched(&server, &ours, true);
        let conditions = out.conditions.clone().unwrap_or_default();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[1], cond("Ready", "True", 2, 2));
        assert_eq!(out.capacity.as_ref().map(BTreeMap::len), Some(2));
        assert_eq!(out.volumes_in_use, server.volumes_in_use);
        assert!(changed(&server, &out));
        assert!(!changed(&out, &patched(&out, &ours, true)), "idempotent");
    }
}
