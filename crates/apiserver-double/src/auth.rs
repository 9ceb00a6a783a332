//! Authentication (client certificates, bearer tokens: bootstrap tokens and
//! static tokens) and authorization (RBAC-like rules for `system:masters`,
//! bootstrappers and the Node authorizer + NodeRestriction for kubelets).
//! Service account tokens the double issued are bearer tokens too
//! ([`crate::token`]).

use std::collections::HashMap;

use crate::graph;
use crate::store::Store;

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User name.
    pub user: String,
    /// Groups (always including `system:authenticated`).
    pub groups: Vec<String>,
    /// Serial number of the client certificate, if that is how the user authenticated.
    pub serial: Option<String>,
}

impl Identity {
    /// A user in groups.
    pub fn new(user: &str, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Self {
            user: user.into(),
            groups,
            serial: None,
        }
    }

    fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }

    /// The node name if this is a kubelet (`system:node:<name>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        if self.in_group("system:nodes") {
            self.user.strip_prefix("system:node:")
        } else {
            None
        }
    }
}

/// The bootstrap token the double accepts (`<id>.<secret>`, kubeadm's format).
pub const BOOTSTRAP_TOKEN: &str = "07401b.f395accd246ae52d";

/// Bearer tokens the server knows.
pub fn default_tokens() -> HashMap<String, Identity> {
    let mut m = HashMap::new();
    let id = BOOTSTRAP_TOKEN.split('.').next().unwrap_or_default();
    m.insert(
        BOOTSTRAP_TOKEN.to_string(),
        Identity::new(
            &format!("system:bootstrap:{id}"),
            &[
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token",
            ],
        ),
    );
    m
}

/// What a request wants to do.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// get, list, watch, create, update, patch, delete.
    pub verb: &'a str,
    /// Plural resource.
    pub resource: &'a str,
    /// Subresource or "".
    pub subresource: &'a str,
    /// Namespace or "".
    pub namespace: &'a str,
    /// Object name or "".
    pub name: &'a str,
}

/// An authorizer's answer (upstream `authorizer.Decision` with its reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Not allowed; the reason (possibly empty) ends the 403 message.
    Deny(String),
}

impl Decision {
    fn deny(reason: &str) -> Self {
        Self::Deny(reason.to_string())
    }

    /// Whether this is [`Decision::Allow`].
    pub fn allowed(&self) -> bool {
        matches!(self, Self::Allow)
    }
}

impl From<bool> for Decision {
    fn from(allowed: bool) -> Self {
        if allowed {
            Self::Allow
        } else {
            Self::Deny(String::new())
        }
    }
}

/// Whether `who` may do `what`: `system:masters`, the bootstrappers' CSR
/// rights, and for kubelets the Node authorizer (upstream
/// `plugin/pkg/auth/authorizer/node`), whose secrets, configmaps, claims,
/// volumes and service account tokens are reached through the pods bound to
/// the node in `store` ([`crate::graph`]); a VolumeAttachment is reached
/// when its `spec.nodeName` is the node, a CSINode by its name. A node
/// may update or patch the `status` of a claim it reaches (what it changes
/// is NodeRestriction's, [`crate::profile::node::admit_pvc_status`]).
pub fn authorize(who: &Identity, what: &Attributes<'_>, store: &Store) -> Decision {
    if who.in_group("system:masters") {
        return Decision::Allow;
    }
    let read = matches!(what.verb, "get" | "list" | "watch");
    if what.resource == "certificatesigningrequests" && what.subresource.is_empty() {
        return (read || what.verb == "create").into();
    }
    let Some(node) = who.node_name() else {
        return Decision::Deny(String::new());
    };
    let related = |resource: &str| -> Decision {
        if what.name.is_empty() {
            return Decision::deny("No Object name found");
        }
        let ok = if resource == "persistentvolumes" {
            graph::node_reaches_pv(store, node, what.name)
        } else if resource == "volumeattachments" {
            graph::node_reaches_va(store, node, what.name)
        } else {
            graph::node_reaches(store, node, resource, what.namespace, what.name)
        };
        if ok {
            Decision::Allow
        } else {
            Decision::Deny(format!(
                "no relationship found between node '{node}' and this object"
            ))
        }
    };
    match what.resource {
        "secrets" | "configmaps" => {
            if !read {
                Decision::deny("can only read resources of this type")
            } else if !what.subresource.is_empty() {
                Decision::deny("cannot read subresource")
            } else if what.namespace.is_empty() {
                Decision::deny("can only read namespaced object of this type")
            } else {
                related(what.resource)
            }
        }
        // `authorizeStatusUpdate` (ExpandPersistentVolumes, on from 1.11, GA
        // in 1.24): a node writes the status of the claims its pods use,
        // for online expansion; NodeRestriction checks what it changes.
        "persistentvolumeclaims" if what.subresource == "status" => {
            if !matches!(what.verb, "update" | "patch") {
                Decision::deny("can only get/update/patch this type")
            } else {
                related(what.resource)
            }
        }
        "persistentvolumeclaims" | "persistentvolumes" | "volumeattachments" => {
            if what.verb != "get" {
                Decision::deny("can only get individual resources of this type")
            } else if !what.subresource.is_empty() {
                Decision::deny("cannot get subresource")
            } else {
                related(what.resource)
            }
        }
        "serviceaccounts" => {
            if what.verb != "create" || what.name.is_empty() {
                Decision::deny("can only create tokens for individual service accounts")
            } else if what.subresource != "token" {
                Decision::deny("can only create token subresource of serviceaccount")
            } else {
                related(what.resource)
            }
        }
        // The static rules of the `system:node` ClusterRole.
        "nodes" => (read || what.verb == "create" || what.name == node).into(),
        "leases" => (what.namespace == "kube-node-lease"
            && (what.name == node || what.verb == "create"))
            .into(),
        // Mirror pod creation is checked against the body (NodeRestriction).
        "pods" => (read || matches!(what.verb, "create" | "delete" | "update" | "patch")).into(),
        "events" => matches!(what.verb, "create" | "update" | "patch").into(),
        "services" => read.into(),
        // The Node authorizer's `authorizeCSINode`: a node reads and writes
        // only its own CSINode (its creation is checked by NodeRestriction).
        "csinodes" => {
            if !matches!(what.verb, "get" | "create" | "update" | "patch" | "delete") {
                Decision::deny("can only get, create, update, patch, or delete a CSINode")
            } else if !what.subresource.is_empty() {
                Decision::deny("cannot authorize CSINode subresources")
            } else if what.verb != "create" && what.name != node {
                Decision::deny("can only access CSINode with the same name as the requesting node")
            } else {
                Decision::Allow
            }
        }
        // `system:node` may get, list and watch CSIDrivers (NodeRules).
        "csidrivers" => read.into(),
        // `system:node` may read RuntimeClasses (upstream's node ClusterRole).
        "runtimeclasses" => read.into(),
        "tokenreviews" | "subjectaccessreviews" => (what.verb == "create").into(),
        _ => Decision::Deny(String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(verb: &'a str, resource: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            resource,
            subresource: "",
            namespace: "",
            name,
        }
    }

    fn authorize(who: &Identity, what: &Attributes<'_>) -> bool {
        super::authorize(who, what, &Store::new(10)).allowed()
    }

    #[test]
    fn bootstrappers_may_only_request_certificates() {
        let t = default_tokens();
        let b = t.get(BOOTSTRAP_TOKEN).expect("bootstrap token");
        assert!(authorize(
            b,
            &attrs("create", "certificatesigningrequests", "")
        ));
        assert!(authorize(
            b,
            &attrs("watch", "certificatesigningrequests", "")
        ));
        assert!(!authorize(b, &attrs("get", "nodes", "n1")));
        assert!(!authorize(b, &attrs("list", "pods", "")));
    }

    #[test]
    fn a_node_may_change_only_its_own_node() {
        let n = Identity::new("system:node:n1", &["system:nodes"]);
        assert!(authorize(&n, &attrs("patch", "nodes", "n1")));
        assert!(!authorize(&n, &attrs("patch", "nodes", "n2")));
        assert!(authorize(&n, &attrs("get", "nodes", "n2")));
        let stranger = Identity::new("system:node:n1", &[]);
        assert!(!authorize(&stranger, &attrs("get", "nodes", "n1")));
    }
}
