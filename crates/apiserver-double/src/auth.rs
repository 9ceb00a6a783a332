//! Authentication (client certificates, bearer tokens: bootstrap tokens and
//! static tokens) and authorization (RBAC-like rules for `system:masters`,
//! bootstrappers and the Node authorizer + NodeRestriction for kubelets).

use std::collections::HashMap;

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

/// Whether `who` may do `what`.
pub fn authorize(who: &Identity, what: &Attributes<'_>) -> bool {
    if who.in_group("system:masters") {
        return true;
    }
    let read = matches!(what.verb, "get" | "list" | "watch");
    if what.resource == "certificatesigningrequests" && what.subresource.is_empty() {
        return read || what.verb == "create";
    }
    let Some(node) = who.node_name() else {
        return false;
    };
    match what.resource {
        "nodes" => read || what.verb == "create" || what.name == node,
        "leases" => {
            what.namespace == "kube-node-lease" && (what.name == node || what.verb == "create")
        }
        // Mirror pod creation is checked against the body (NodeRestriction).
        "pods" => read || matches!(what.verb, "create" | "delete" | "update" | "patch"),
        "events" => matches!(what.verb, "create" | "update" | "patch"),
        "configmaps" | "secrets" | "services" | "persistentvolumeclaims" => read,
        "tokenreviews" | "subjectaccessreviews" => what.verb == "create",
        _ => false,
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
