//! Pod QoS classes (upstream `pkg/apis/core/v1/helper/qos/qos.go`
//! `GetPodQOS` / `ComputePodQOS`, as in Kubernetes 1.19 to 1.33, without
//! pod-level resources).
//!
//! Only `cpu` and `memory` count, and only quantities above zero: a container
//! asking for `cpu: "0"` asks for nothing, so such a pod is BestEffort.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::error::Error;
use crate::pod;
use crate::quantity::Quantity;

/// A pod's quality-of-service class (upstream `v1.PodQOSClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has equal, non-zero CPU and memory requests and limits.
    Guaranteed,
    /// Some container asks for CPU or memory, but not as Guaranteed.
    Burstable,
    /// No container asks for CPU or memory.
    BestEffort,
}

impl QosClass {
    /// The API name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QosClass {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "Guaranteed" => Ok(Self::Guaranteed),
            "Burstable" => Ok(Self::Burstable),
            "BestEffort" => Ok(Self::BestEffort),
            _ => Err(Error::Unknown {
                kind: "QoS class",
                value: s.to_string(),
            }),
        }
    }
}

const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// The container's positive CPU and memory quantities from `list`.
fn positive<'a>(
    list: Option<&'a BTreeMap<String, ApiQuantity>>,
) -> impl Iterator<Item = (&'static str, Quantity)> + 'a {
    QOS_RESOURCES.into_iter().filter_map(move |name| {
        let q = list?.get(name)?;
        // The apiserver refuses unparsable quantities; one that slips through
        // (a static pod) counts as not given.
        Quantity::from_api(q)
            .ok()
            .filter(|q| q.signum() > 0)
            .map(|q| (name, q))
    })
}

/// A container's requests as the apiserver defaults them: a limit without a
/// request is also the request (upstream `SetDefaults_Pod`), so a raw and a
/// defaulted pod have the same class.
fn effective_requests(c: &Container) -> BTreeMap<String, ApiQuantity> {
    let res = c.resources.as_ref();
    let mut out = res.and_then(|r| r.requests.clone()).unwrap_or_default();
    for (k, v) in res.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
        out.entry(k.clone()).or_insert_with(|| v.clone());
    }
    out
}

/// Upstream `ComputePodQOS`: the class from the containers' resources alone,
/// app and init containers alike.
pub fn compute_pod_qos(p: &Pod) -> QosClass {
    let mut requests: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut guaranteed = true;
    for c in pod::containers(p).iter().chain(pod::init_containers(p)) {
        let reqs = effective_requests(c);
        for (name, q) in positive(Some(&reqs)) {
            let sum = requests.entry(name).or_default();
            *sum = sum.saturating_add(q);
        }
        let mut found = 0;
        for (name, q) in positive(c.resources.as_ref().and_then(|r| r.limits.as_ref())) {
            found += 1;
            let sum = limits.entry(name).or_default();
            *sum = sum.saturating_add(q);
        }
        // Both CPU and memory limits, in every container.
        if found < QOS_RESOURCES.len() {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed
        && requests.len() == limits.len()
        && requests.iter().all(|(k, r)| limits.get(k) == Some(r))
    {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}

/// Upstream `GetPodQOS` (1.28+): `status.qosClass` when the apiserver has set
/// it (it never changes after creation), else [`compute_pod_qos`].
pub fn pod_qos(p: &Pod) -> QosClass {
    p.status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| compute_pod_qos(p))
}

#[cfg(test)]
mod tests;
