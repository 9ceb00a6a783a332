//! The QoS class the apiserver records in `status.qosClass` on create, ported
//! on its own (upstream `pkg/apis/core/v1/helper/qos/qos.go` `GetPodQOS`,
//! as of 1.19-1.33 with the `PodLevelResources` gate off).
//!
//! Only cpu and memory count, and only quantities above zero: requests and
//! limits are summed over regular and init containers, and the pod is
//! Guaranteed when every container has cpu and memory limits and the sums
//! of requests and limits match.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::quantity::Quantity;

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    /// Requests equal limits for cpu and memory in every container.
    Guaranteed,
    /// Some request or limit, but not Guaranteed.
    Burstable,
    /// No cpu or memory request or limit above zero.
    BestEffort,
}

impl QosClass {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Adds the positive cpu and memory quantities of `list` into `sums`;
/// returns the names it added.
fn accumulate(
    list: Option<&BTreeMap<String, ApiQuantity>>,
    sums: &mut BTreeMap<&'static str, Quantity>,
) -> BTreeSet<&'static str> {
    let mut found = BTreeSet::new();
    for (name, q) in list.into_iter().flatten() {
        let Some(&name) = QOS_RESOURCES.iter().find(|r| **r == name.as_str()) else {
            continue;
        };
        // Quantities were validated on decode; one that does not parse counts as zero.
        let Ok(q) = Quantity::parse(&q.0) else {
            continue;
        };
        if q.signum() <= 0 {
            continue;
        }
        found.insert(name);
        match sums.get_mut(name) {
            Some(sum) => sum.add(&q),
            None => {
                sums.insert(name, q);
            }
        }
    }
    found
}

/// Upstream `GetPodQOS`.
pub fn pod_qos(pod: &Pod) -> QosClass {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    let mut guaranteed = true;
    let containers = pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for c in containers {
        let r = c.resources.as_ref();
        accumulate(r.and_then(|r| r.requests.as_ref()), &mut requests);
        let found = accumulate(r.and_then(|r| r.limits.as_ref()), &mut limits);
        if !QOS_RESOURCES.iter().all(|n| found.contains(n)) {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    let matching = requests
        .iter()
        .all(|(name, req)| limits.get(name).is_some_and(|lim| lim == req));
    if guaranteed && matching && requests.len() == limits.len() {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}
