//! The Node authorizer and NodeRestriction rules that differ between
//! releases (`docs/apiserver-versions.md` §3 and §4); the rules common to
//! both stay in [`crate::auth`].
//!
//! - `plugin/pkg/auth/authorizer/node/node_authorizer.go` (newest stored
//!   copy, `AuthorizeNodeWithSelectors` GA and locked in 1.34): a node may
//!   get a pod only when the pod is bound to it, list/watch pods only with
//!   `spec.nodeName=<self>` (or one named related pod), and read only its
//!   own Node. 1.19 (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`
//!   `NodeRules`, v1.19.10) lets a node get, list and watch any pod and node.
//! - `plugin/pkg/admission/noderestriction/admission.go` `admitPodCreate`:
//!   a node creates only mirror pods bound to itself, with at most one
//!   ownerReference, to its own Node as controller. From 1.20/1.21 on the
//!   ownerReference is required; v1.19.10 accepts a mirror pod without one.
//! - `admitPVCStatus`: through `persistentvolumeclaims/{name}/status` a
//!   node changes only `status.capacity` and `status.conditions`; from 1.32
//!   (RecoverVolumeExpansionFailure beta and on, GA in 1.34) also
//!   `status.allocatedResources` and `status.allocatedResourceStatuses`.
//!   The v1.19-era copy words the refusal "fields other than
//!   status.capacity and status.conditions" with `diff.ObjectReflectDiff`,
//!   the newest "status.quantity" with `cmp.Diff`; the release of that
//!   change was not pinned down (only 1.19 and 1.35 are served), so 1.24
//!   is assumed. The diff after the colon is the double's own wording.

// Admission returns a ready HTTP response as its error, as the REST layer.
#![allow(clippy::result_large_err)]

use http::StatusCode;
use serde_json::Value;

use super::Profile;
use super::fields::Requirement;
use crate::Shared;
use crate::auth::{Attributes, Decision, Identity};
use crate::rest::{Body, status};
use crate::store::{Key, Store};

fn bound_to(store: &Store, namespace: &str, name: &str, node: &str) -> bool {
    store
        .get(&Key {
            resource: "pods".into(),
            namespace: namespace.into(),
            name: name.into(),
        })
        .and_then(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
        == Some(node)
}

/// What `p`'s Node authorizer says where it differs from [`crate::auth`]:
/// `Some` overrides that authorizer, `None` defers to it.
pub fn authorize(
    p: Profile,
    who: &Identity,
    attrs: &Attributes<'_>,
    selector: &[Requirement],
    store: &Store,
) -> Option<Decision> {
    // `authorizeServiceAccount`: with `KubeletServiceAccountTokenForCredentialProviders`
    // (beta, on, from 1.34) a node may get the service accounts of its pods,
    // for credential provider plugins in token mode; before, only tokens.
    if attrs.resource == "serviceaccounts" && attrs.verb == "get" && attrs.subresource.is_empty() {
        if !p.at_least(34) {
            return None;
        }
        let node = who.node_name()?;
        return Some(
            if crate::graph::node_reaches(
                store,
                node,
                "serviceaccounts",
                attrs.namespace,
                attrs.name,
            ) {
                Decision::Allow
            } else {
                Decision::Deny(format!(
                    "no relationship found between node '{node}' and this object"
                ))
            },
        );
    }
    if !p.at_least(32) {
        // Before AuthorizeNodeWithSelectors (beta, on, in 1.32) RBAC's
        // NodeRules grant pods and nodes get/list/watch cluster-wide.
        return None;
    }
    let node = who.node_name()?;
    if !attrs.subresource.is_empty() {
        return None;
    }
    let no_relation = || {
        Decision::Deny(format!(
            "no relationship found between node '{node}' and this object"
        ))
    };
    match (attrs.resource, attrs.verb) {
        ("pods", "get") => Some(if bound_to(store, attrs.namespace, attrs.name, node) {
            Decision::Allow
        } else {
            no_relation()
        }),
        ("pods", "list" | "watch") => {
            let scoped = selector
                .iter()
                .any(|r| r.field == "spec.nodeName" && r.equals && r.value == node);
            Some(if scoped {
                Decision::Allow
            } else if !attrs.name.is_empty() {
                if bound_to(store, attrs.namespace, attrs.name, node) {
                    Decision::Allow
                } else {
                    no_relation()
                }
            } else {
                Decision::Deny("can only list/watch pods with spec.nodeName field selector".into())
            })
        }
        ("nodes", "get" | "list" | "watch") => Some(if attrs.name == node {
            Decision::Allow
        } else if attrs.name.is_empty() {
            Decision::Deny(format!(
                "node '{node}' cannot read all nodes, only its own Node object"
            ))
        } else {
            Decision::Deny(format!(
                "node '{node}' cannot read '{}', only its own Node object",
                attrs.name
            ))
        }),
        _ => None,
    }
}

fn forbidden(name: &str, why: &str) -> http::Response<Body> {
    status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!("pods \"{name}\" is forbidden: {why}"),
    )
}

/// NodeRestriction's `admitPodCreate` for a pod `who` creates, if `who` is
/// a node; the error is the response.
pub fn admit_pod_create(
    shared: &Shared,
    who: &Identity,
    resource: &str,
    name: &str,
    pod: &Value,
) -> Result<(), http::Response<Body>> {
    let Some(node) = who.node_name() else {
        return Ok(());
    };
    if resource != "pods" {
        return Ok(());
    }
    let deny = |why: String| Err(forbidden(name, &why));
    let str_at = |ptr: &str| pod.pointer(ptr).and_then(Value::as_str).unwrap_or("");
    if pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_none()
    {
        return deny(format!(
            "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
        ));
    }
    if str_at("/spec/nodeName") != node {
        return deny(format!(
            "node \"{node}\" can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let set_to_itself =
        format!("node \"{node}\" can only create pods with an owner reference set to itself");
    match owners.as_slice() {
        [] if shared.options.profile.at_least(21) => return deny(set_to_itself),
        [] => {}
        [owner] => {
            let field = |k: &str| owner.get(k).and_then(Value::as_str).unwrap_or("");
            if field("apiVersion") != "v1" || field("kind") != "Node" || field("name") != node {
                return deny(set_to_itself);
            }
            if owner.get("controller").and_then(Value::as_bool) != Some(true) {
                return deny(format!(
                    "node \"{node}\" can only create pods with a controller owner reference set to itself"
                ));
            }
            if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
                return deny(format!(
                    "node \"{node}\" must not set blockOwnerDeletion on an owner reference"
                ));
            }
            let store = shared.store.lock();
            let Some(registered) = store.get(&Key {
                resource: "nodes".into(),
                namespace: String::new(),
                name: node.into(),
            }) else {
                return Err(status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("nodes \"{node}\" not found"),
                ));
            };
            let uid = registered
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("");
            if field("uid") != uid {
                return deny(format!(
                    "node {node} UID mismatch: expected {} got {uid}",
                    field("uid")
                ));
            }
        }
        _ => {
            return deny(format!(
                "node \"{node}\" can only create pods with a single owner reference set to itself"
            ));
        }
    }
    let refs = crate::graph::pod_refs(pod);
    let reference = if !str_at("/spec/serviceAccountName").is_empty() {
        Some("a service account")
    } else if !refs.secrets.is_empty() {
        Some("secrets")
    } else if !refs.configmaps.is_empty() {
        Some("configmaps")
    } else if !refs.pvcs.is_empty() {
        Some("persistentvolumeclaims")
    } else {
        None
    };
    match reference {
        Some(what) => deny(format!(
            "node \"{node}\" can not create pods that reference {what}"
        )),
        None => Ok(()),
    }
}

/// The claim status fields a node may change through `status`.
fn pvc_status_fields(p: Profile) -> &'static [&'static str] {
    if p.at_least(32) {
        &[
            "capacity",
            "conditions",
            "allocatedResources",
            "allocatedResourceStatuses",
        ]
    } else {
        &["capacity", "conditions"]
    }
}

/// A claim without what a node may change and what the comparison ignores
/// (resourceVersion, managedFields, the type).
fn pvc_comparable(p: Profile, claim: &Value) -> Value {
    let mut c = claim.clone();
    if let Some(o) = c.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    if let Some(s) = c.get_mut("status").and_then(Value::as_object_mut) {
        for f in pvc_status_fields(p) {
            s.remove(*f);
        }
    }
    c
}

/// The paths where `old` and `new` differ, with both values.
fn json_diff(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                json_diff(
                    &sub,
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if old != new => out.push(format!("{path}: {old} != {new}")),
        _ => {}
    }
}

/// NodeRestriction's `admitPVCStatus` for a write `who` makes to claim
/// `name` through `sub`, `new` being the object after the patch or the
/// body of the update, before the status strategy keeps only its status;
/// the error is the 403.
pub fn admit_pvc_status(
    p: Profile,
    who: &Identity,
    resource: &str,
    sub: &str,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), http::Response<Body>> {
    let Some(node) = who.node_name() else {
        return Ok(());
    };
    if resource != "persistentvolumeclaims" {
        return Ok(());
    }
    let forbidden = |why: String| {
        Err(status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("persistentvolumeclaims \"{name}\" is forbidden: {why}"),
        ))
    };
    if sub != "status" {
        return forbidden("may only update PVC status".into());
    }
    let (a, b) = (pvc_comparable(p, old), pvc_comparable(p, new));
    if a == b {
        return Ok(());
    }
    let mut changed = Vec::new();
    json_diff("", &a, &b, &mut changed);
    let allowed = if p.at_least(24) {
        "status.quantity"
    } else {
        "status.capacity"
    };
    forbidden(format!(
        "node \"{node}\" is not allowed to update fields other than {allowed} and status.conditions: {}",
        changed.join("; ")
    ))
}
