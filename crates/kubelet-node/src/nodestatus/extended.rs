//! Extended resources in the node status (upstream `nodestatus.MachineInfo`'s
//! device plugin part and `Kubelet.reconcileExtendedResource`): the device
//! manager's capacity and allocatable per resource, 0 for resources whose
//! plugin is gone for good, and zeroed extended resources on a Node that
//! outlived the device manager's checkpoint (a recreated node).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Device plugin resources as node status reads them (upstream
/// `devicePluginResourceCapacityFunc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceCapacity {
    /// Devices per resource, healthy or not.
    pub capacity: BTreeMap<String, i64>,
    /// Healthy devices per resource.
    pub allocatable: BTreeMap<String, i64>,
    /// Resources whose plugin is gone: reported with capacity 0, so the
    /// scheduler still knows a device plugin managed them.
    pub deleted: Vec<String>,
}

/// What node status reads of the device manager.
#[async_trait::async_trait]
pub trait ExtendedResources: Send + Sync + 'static {
    /// The device plugins' resources now.
    async fn capacity(&self) -> DeviceCapacity;
    /// Whether the extended resources an existing Node carries must be
    /// zeroed at registration (upstream
    /// `ShouldResetExtendedResourceCapacity`: no device manager checkpoint).
    async fn should_reset_capacity(&self) -> bool;
}

/// A node without device plugins.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoExtendedResources;

#[async_trait::async_trait]
impl ExtendedResources for NoExtendedResources {
    async fn capacity(&self) -> DeviceCapacity {
        DeviceCapacity::default()
    }
    async fn should_reset_capacity(&self) -> bool {
        false
    }
}

/// Upstream `IsExtendedResourceName`: a domain-qualified name outside
/// `kubernetes.io`, not a quota `requests.` name.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, _)) = name.split_once('/') else {
        return false;
    };
    !(domain == "kubernetes.io"
        || domain.ends_with(".kubernetes.io")
        || name.starts_with("requests."))
}

/// Adds the device plugins' resources to capacity and allocatable (upstream
/// `MachineInfo` setter): capacity and allocatable of each resource as the
/// device manager counts them, 0 for each deleted one.
pub fn apply(
    capacity: &mut BTreeMap<String, Quantity>,
    allocatable: &mut BTreeMap<String, Quantity>,
    dev: &DeviceCapacity,
) {
    for (r, n) in &dev.capacity {
        capacity.insert(r.clone(), Quantity(n.to_string()));
        let a = dev.allocatable.get(r).copied().unwrap_or(0);
        allocatable.insert(r.clone(), Quantity(a.to_string()));
    }
    for r in &dev.deleted {
        capacity.insert(r.clone(), Quantity("0".into()));
        allocatable.insert(r.clone(), Quantity("0".into()));
    }
}

/// Extended resources the server's allocatable lists but neither its
/// capacity nor the new one does (upstream's `MachineInfo` setter drops
/// them from allocatable): the patch removes them.
pub fn stale_allocatable(server: &NodeStatus, new: &NodeStatus) -> Vec<String> {
    let in_capacity = |k: &str| {
        [&server.capacity, &new.capacity]
            .iter()
            .any(|c| c.as_ref().is_some_and(|c| c.contains_key(k)))
    };
    server
        .allocatable
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| is_extended_resource_name(k) && !in_capacity(k))
        .cloned()
        .collect()
}

/// The status patch zeroing every extended resource of an existing Node
/// (upstream `reconcileExtendedResource`), `None` when it has none.
pub fn reset_patch(existing: &NodeStatus) -> Option<serde_json::Value> {
    let zero =
        |m: &Option<BTreeMap<String, Quantity>>| -> serde_json::Map<String, serde_json::Value> {
            m.iter()
                .flatten()
                .filter(|(k, q)| is_extended_resource_name(k) && q.0 != "0")
                .map(|(k, _)| (k.clone(), serde_json::Value::String("0".into())))
                .collect()
        };
    let capacity = zero(&existing.capacity);
    let allocatable = zero(&existing.allocatable);
    if capacity.is_empty() && allocatable.is_empty() {
        return None;
    }
    Some(serde_json::json!({"status": {"capacity": capacity, "allocatable": allocatable}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names() {
        assert!(is_extended_resource_name("example.com/resource"));
        assert!(is_extended_resource_name("nvidia.com/gpu"));
        assert!(!is_extended_resource_name("cpu"));
        assert!(!is_extended_resource_name("hugepages-2Mi"));
        assert!(!is_extended_resource_name("kubernetes.io/batch"));
        assert!(!is_extended_resource_name("node.kubernetes.io/x"));
        assert!(!is_extended_resource_name("requests.example.com/x"));
    }

    #[test]
    fn device_resources_join_capacity_and_allocatable_and_deleted_ones_are_zero() {
        let mut cap = BTreeMap::from([("cpu".to_string(), Quantity("2".into()))]);
        let mut alloc = cap.clone();
        let dev = DeviceCapacity {
            capacity: BTreeMap::from([("example.com/resource".to_string(), 2)]),
            allocatable: BTreeMap::from([("example.com/resource".to_string(), 1)]),
            deleted: vec!["example.com/gone".into()],
        };
        apply(&mut cap, &mut alloc, &dev);
        assert_eq!(cap["example.com/resource"].0, "2");
        assert_eq!(alloc["example.com/resource"].0, "1");
        assert_eq!(cap["example.com/gone"].0, "0");
        assert_eq!(alloc["example.com/gone"].0, "0");
        assert_eq!(cap["cpu"].0, "2");
    }

    #[test]
    fn allocatable_without_capacity_is_stale() {
        let server = NodeStatus {
            capacity: Some(BTreeMap::from([(
                "example.com/kept".to_string(),
                Quantity("1".into()),
            )])),
            allocatable: Some(BTreeMap::from([
                ("example.com/kept".to_string(), Quantity("1".into())),
                ("example.com/ours".to_string(), Quantity("1".into())),
                ("example.com/gone".to_string(), Quantity("1".into())),
                ("hugepages-2Mi".to_string(), Quantity("0".into())),
            ])),
            ..Default::default()
        };
        let new = NodeStatus {
            capacity: Some(BTreeMap::from([(
                "example.com/ours".to_string(),
                Quantity("1".into()),
            )])),
            ..Default::default()
        };
        assert_eq!(stale_allocatable(&server, &new), vec!["example.com/gone"]);
    }

    #[test]
    fn reset_zeroes_extended_resources_only() {
        let status = NodeStatus {
            capacity: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("2".into())),
                ("example.com/resource".to_string(), Quantity("2".into())),
            ])),
            allocatable: Some(BTreeMap::from([(
                "example.com/resource".to_string(),
                Quantity("1".into()),
            )])),
            ..Default::default()
        };
        let patch = reset_patch(&status).expect("a patch");
        assert_eq!(
            patch,
            serde_json::json!({"status": {"capacity": {"example.com/resource": "0"},
                "allocatable": {"example.com/resource": "0"}}})
        );
        let none = NodeStatus {
            capacity: Some(BTreeMap::from([("cpu".to_string(), Quantity("2".into()))])),
            ..Default::default()
        };
        assert_eq!(reset_patch(&none), None);
    }
}
