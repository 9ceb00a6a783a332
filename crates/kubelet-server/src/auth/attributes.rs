//! Request attributes for the node API (upstream
//! `NewNodeAuthorizerAttributesGetter` / `GetRequestAttributes` in
//! `pkg/kubelet/server/auth.go`): resource `nodes`, name the node, verb
//! from the method, subresource from the path. With `KubeletFineGrainedAuthz`
//! the pods, healthz, configz and statusz paths first ask for their own
//! subresource and fall back to `proxy`.

use http::Method;

use super::UserInfo;

/// What one authorization check asks (upstream `authorizer.Attributes` for
/// a resource request in the core group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// Who asks.
    pub user: UserInfo,
    /// `get`, `create`, `update`, `patch`, `delete`, or "" for other methods.
    pub verb: String,
    /// Always `nodes`.
    pub resource: String,
    /// `stats`, `metrics`, `log`, `checkpoint`, `pods`, `healthz`, `configz`,
    /// `statusz` or `proxy`.
    pub subresource: String,
    /// The node's name.
    pub name: String,
    /// API version (`v1`).
    pub api_version: String,
    /// The request path.
    pub path: String,
}

/// Builds the attributes of requests to this node's API.
#[derive(Debug, Clone)]
pub struct NodeAttributesGetter {
    node_name: String,
    fine_grained: bool,
}

/// Whether `path` is `prefix` or below it (upstream `isSubpath`).
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The API verb of an HTTP method.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The subresources a path is checked against, in order.
pub fn subresources(path: &str, fine_grained: bool) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(2);
    if fine_grained {
        if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
            out.push("pods");
        } else if is_subpath(path, "/healthz") {
            out.push("healthz");
        } else if is_subpath(path, "/configz") {
            out.push("configz");
        } else if is_subpath(path, "/statusz") {
            out.push("statusz");
        }
    }
    out.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        // "log", as the pods/log subresource is spelled.
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else {
        "proxy"
    });
    out
}

impl NodeAttributesGetter {
    /// For the node `node_name`; `fine_grained` is `KubeletFineGrainedAuthz`.
    pub fn new(node_name: &str, fine_grained: bool) -> Self {
        Self {
            node_name: node_name.to_string(),
            fine_grained,
        }
    }

    /// The attributes to check, in order; the first allowed one admits the
    /// request.
    pub fn get(&self, user: &UserInfo, method: &Method, path: &str) -> Vec<Attributes> {
        let verb = verb(method);
        let subs = subresources(path, self.fine_grained);
        tracing::trace!(user = %user.name, verb, resource = "nodes", subresources = ?subs,
            "Node request attributes");
        subs.into_iter()
            .map(|s| Attributes {
                user: user.clone(),
                verb: verb.to_string(),
                resource: "nodes".into(),
                subresource: s.to_string(),
                name: self.node_name.clone(),
                api_version: "v1".into(),
                path: path.to_string(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_mapping_table() {
        let table = [
            ("/stats/summary", "stats"),
            ("/stats", "stats"),
            ("/stats/", "stats"),
            ("/statsfoo", "proxy"),
            ("/metrics", "metrics"),
            ("/metrics/cadvisor", "metrics"),
            ("/metrics/resource", "metrics"),
            ("/metrics/probes", "metrics"),
            ("/metricsx", "proxy"),
            ("/logs/", "log"),
            ("/logs/syslog", "log"),
            ("/logs", "log"),
            ("/checkpoint/ns/pod/c", "checkpoint"),
            ("/containerLogs/ns/pod/c", "proxy"),
            ("/exec/ns/pod/c", "proxy"),
            ("/attach/ns/pod/c", "proxy"),
            ("/portForward/ns/pod", "proxy"),
            ("/run/ns/pod/c", "proxy"),
            ("/pods", "proxy"),
            ("/runningpods/", "proxy"),
            ("/healthz", "proxy"),
            ("/configz", "proxy"),
            ("/spec/", "proxy"),
            ("/", "proxy"),
        ];
        for (path, want) in table {
            assert_eq!(subresources(path, false), vec![want], "{path}");
        }
    }

    #[test]
    fn fine_grained_asks_its_own_subresource_then_proxy() {
        let table: [(&str, &[&str]); 9] = [
            ("/pods", &["pods", "proxy"]),
            ("/pods/", &["pods", "proxy"]),
            ("/runningpods/", &["pods", "proxy"]),
            ("/runningpods", &["pods", "proxy"]),
            ("/healthz/syncloop", &["healthz", "proxy"]),
            ("/configz", &["configz", "proxy"]),
            ("/statusz", &["statusz", "proxy"]),
            ("/stats/summary", &["stats"]),
            ("/exec/ns/p/c", &["proxy"]),
        ];
        for (path, want) in table {
            assert_eq!(subresources(path, true), want.to_vec(), "{path}");
        }
    }

    #[test]
    fn verbs_from_methods_and_node_name() {
        let g = NodeAttributesGetter::new("n1", false);
        let u = UserInfo {
            name: "alice".into(),
            ..UserInfo::default()
        };
        let table = [
            (Method::GET, "get"),
            (Method::POST, "create"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::HEAD, ""),
            (Method::OPTIONS, ""),
        ];
        for (m, want) in table {
            let a = g.get(&u, &m, "/exec/ns/p/c");
            assert_eq!(a.len(), 1);
            assert_eq!(a[0].verb, want, "{m}");
            assert_eq!(
                (
                    a[0].resource.as_str(),
                    a[0].name.as_str(),
                    a[0].subresource.as_str()
                ),
                ("nodes", "n1", "proxy")
            );
        }
    }
}
