//! The scheduler's checks the kubelet repeats before it runs a pod (upstream
//! `scheduler.AdmissionCheck` through `lifecycle/predicate.go`
//! `generalFilter`): resources (`noderesources.Fits`), node affinity and
//! selector (`nodeaffinity`), node name, host ports (`nodeports`), and
//! NoExecute taints (`corev1.FindMatchingUntoleratedTaint`).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kubelet_types::pod;
use kubelet_types::quantity::Quantity;

/// One failed check: an insufficient resource, or a named predicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Upstream `InsufficientResourceError`.
    Insufficient {
        /// `cpu`, `memory`, `pods`, ...
        resource: String,
        /// What the pod asks (milli-CPU for cpu).
        requested: i64,
        /// What admitted pods already use.
        used: i64,
        /// Allocatable.
        capacity: i64,
    },
    /// Upstream `PredicateFailureError`.
    Predicate {
        /// The plugin's name (`NodeAffinity`, `NodePorts`, ...): the reason.
        name: &'static str,
        /// Its failure description.
        desc: &'static str,
    },
}

impl Failure {
    /// Upstream's reason and message for the pod's status and event.
    pub fn reason_and_message(&self) -> (String, String) {
        match self {
            Failure::Insufficient {
                resource,
                requested,
                used,
                capacity,
            } => (
                format!("OutOf{resource}"),
                format!(
                    "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
                ),
            ),
            Failure::Predicate { name, desc } => {
                (name.to_string(), format!("Predicate {name} failed: {desc}"))
            }
        }
    }
}

/// The amount of a resource in the unit upstream compares: milli-CPU for
/// `cpu`, the value for everything else.
fn amount(name: &str, q: &ApiQuantity) -> i64 {
    match Quantity::from_api(q) {
        Ok(q) if name == "cpu" => q.milli_value(),
        Ok(q) => q.value(),
        Err(_) => 0,
    }
}

fn add(into: &mut BTreeMap<String, i64>, from: &BTreeMap<String, i64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

fn max_into(into: &mut BTreeMap<String, i64>, from: &BTreeMap<String, i64>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
}

fn container_requests(c: &Container) -> BTreeMap<String, i64> {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, q)| (k.clone(), amount(k, q)))
        .collect()
}

/// Upstream `resourcehelper.PodRequests`: the app containers' sum, or the
/// largest init container step if larger (sidecars add to every later
/// step and to the sum), plus the pod overhead.
pub fn pod_requests(p: &Pod) -> BTreeMap<String, i64> {
    let mut reqs = BTreeMap::new();
    for c in pod::containers(p) {
        add(&mut reqs, &container_requests(c));
    }
    let mut sidecars = BTreeMap::new();
    let mut init = BTreeMap::new();
    for c in pod::init_containers(p) {
        let own = container_requests(c);
        let step = if pod::is_restartable_init_container(c) {
            add(&mut reqs, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut step = own;
            add(&mut step, &sidecars);
            step
        };
        max_into(&mut init, &step);
    }
    max_into(&mut reqs, &init);
    let overhead: BTreeMap<String, i64> = p
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, q)| (k.clone(), amount(k, q)))
        .collect();
    add(&mut reqs, &overhead);
    reqs
}

/// Upstream `noderesources.Fits` with all failures: the pod count first,
/// then each requested resource against allocatable minus what `others` use.
fn fits(p: &Pod, others: &[&Pod], allocatable: &BTreeMap<String, ApiQuantity>) -> Vec<Failure> {
    let mut out = Vec::new();
    let cap = |name: &str| allocatable.get(name).map_or(0, |q| amount(name, q));
    let pods_cap = cap("pods");
    let used_pods = i64::try_from(others.len()).unwrap_or(i64::MAX);
    if used_pods + 1 > pods_cap {
        out.push(Failure::Insufficient {
            resource: "pods".into(),
            requested: 1,
            used: used_pods,
            capacity: pods_cap,
        });
    }
    let want = pod_requests(p);
    if want.values().all(|v| *v == 0) {
        return out;
    }
    let mut used = BTreeMap::new();
    for o in others {
        add(&mut used, &pod_requests(o));
    }
    let mut names: Vec<&String> = want.keys().collect();
    // Upstream checks cpu, memory, ephemeral-storage, then the scalar resources.
    names.sort_by_key(|n| match n.as_str() {
        "cpu" => 0,
        "memory" => 1,
        "ephemeral-storage" => 2,
        _ => 3,
    });
    for name in names {
        let requested = want[name];
        if requested == 0 || name == "pods" {
            continue;
        }
        // An extended resource the node does not have is left to the
        // cluster (upstream `removeMissingExtendedResources`).
        let native = ["cpu", "memory", "ephemeral-storage"].contains(&name.as_str())
            || name.starts_with("hugepages-");
        if !native && !allocatable.contains_key(name) {
            continue;
        }
        let used = used.get(name).copied().unwrap_or(0);
        let capacity = cap(name);
        if requested > capacity - used {
            out.push(Failure::Insufficient {
                resource: name.clone(),
                requested,
                used,
                capacity,
            });
        }
    }
    out
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Upstream `MatchNodeSelectorTerms`: any term, each with all its
/// requirements; a term without requirements matches nothing.
fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name")
                .then_some(node.metadata.name.as_deref())
                .flatten();
            requirement_matches(r, value)
        })
}

/// Upstream `nodeaffinity` filter: the nodeSelector and the required node affinity.
fn node_affinity_matches(p: &Pod, node: &Node) -> bool {
    let Some(spec) = p.spec.as_ref() else {
        return true;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)));
    selector_ok && affinity_ok
}

/// (hostIP, protocol, hostPort) of the pod's containers that ask for a host port.
fn host_ports(p: &Pod) -> Vec<(String, String, i32)> {
    pod::containers(p)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|port| port.host_port.is_some_and(|h| h > 0))
        .map(|port| {
            (
                port.host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port.host_port.unwrap_or_default(),
            )
        })
        .collect()
}

/// Upstream `nodeports`: a wildcard host IP conflicts with every IP.
fn ports_conflict(p: &Pod, others: &[&Pod]) -> bool {
    let used: HashSet<(String, String, i32)> = others.iter().flat_map(|o| host_ports(o)).collect();
    host_ports(p).iter().any(|(ip, proto, port)| {
        used.iter().any(|(uip, uproto, uport)| {
            uport == port && uproto == proto && (ip == "0.0.0.0" || uip == "0.0.0.0" || ip == uip)
        })
    })
}

/// Upstream `Toleration.ToleratesTaint`.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// The kubelet's checks of a new pod against the node and the pods it runs,
/// in upstream's order.
pub fn general_filter(p: &Pod, others: &[&Pod], node: &Node) -> Vec<Failure> {
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.clone())
        .unwrap_or_default();
    let mut out = fits(p, others, &allocatable);
    if !node_affinity_matches(p, node) {
        out.push(Failure::Predicate {
            name: "NodeAffinity",
            desc: "node(s) didn't match Pod's node affinity/selector",
        });
    }
    let node_name = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("");
    if !node_name.is_empty() && Some(node_name) != node.metadata.name.as_deref() {
        out.push(Failure::Predicate {
            name: "NodeName",
            desc: "node(s) didn't match the requested node name",
        });
    }
    if ports_conflict(p, others) {
        out.push(Failure::Predicate {
            name: "NodePorts",
            desc: "node(s) didn't have free ports for the requested pod ports",
        });
    }
    if !pod::is_static(p) {
        let tolerations = p
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let untolerated = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter(|t| t.effect == "NoExecute")
            .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)));
        if untolerated {
            out.push(Failure::Predicate {
                name: "TaintToleration",
                desc: "node(s) had untolerated taint",
            });
        }
    }
    out
}

#[cfg(test)]
#[path = "predicate_tests.rs"]
mod tests;
