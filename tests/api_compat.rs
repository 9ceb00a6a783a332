//! The guard of `docs/api-compatibility.md`: every request a kubelet under
//! test sends to the apiserver double must be listed there, with the
//! apiserver versions it works on. [`Joined::cleanup`](crate::cluster::Joined)
//! checks the requests of each cluster test, so a new request that nobody
//! placed on the version range fails the test that first makes it.
//!
//! The doc's request rows start with `` | `VERB /path` ``, placeholders
//! `{ns}`, `{name}` and `{node}` standing for one path segment each.

use std::path::PathBuf;

use apiserver_double::Request;

/// One documented request: its verb and path template, split in segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documented {
    /// `GET`, `POST`, ...
    pub verb: String,
    /// The template's segments (`["api", "v1", "namespaces", "{ns}", ...]`).
    pub segments: Vec<String>,
}

impl Documented {
    /// Whether `method path` is this request.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        self.verb == method
            && parts.len() == self.segments.len()
            && self.segments.iter().zip(&parts).all(|(t, p)| {
                if t.starts_with('{') && t.ends_with('}') {
                    !p.is_empty()
                } else {
                    t == p
                }
            })
    }
}

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/api-compatibility.md")
}

/// The request rows of `text`.
pub fn parse(text: &str) -> Vec<Documented> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter_map(|cell| {
            let (verb, path) = cell.split_once(' ')?;
            path.starts_with('/').then(|| Documented {
                verb: verb.to_string(),
                segments: path
                    .trim_start_matches('/')
                    .split('/')
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// The documented requests of `docs/api-compatibility.md`.
pub fn documented() -> Vec<Documented> {
    let text = std::fs::read_to_string(doc_path()).expect("docs/api-compatibility.md");
    parse(&text)
}

/// Whether a request came from a kubelet (a node or a bootstrapping one),
/// not from the test's admin client.
fn from_kubelet(r: &Request) -> bool {
    r.user
        .as_deref()
        .is_some_and(|u| u.starts_with("system:node:") || u.starts_with("system:bootstrap:"))
}

/// The kubelet requests in `log` that the doc does not list, as
/// `VERB /path`, each once.
pub fn undocumented(log: &[Request], doc: &[Documented]) -> Vec<String> {
    let mut out: Vec<String> = log
        .iter()
        .filter(|r| from_kubelet(r))
        .filter(|r| !doc.iter().any(|d| d.matches(&r.method, &r.path)))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Panics with every undocumented kubelet request in `log`.
pub fn assert_documented(log: &[Request]) {
    let missing = undocumented(log, &documented());
    assert!(
        missing.is_empty(),
        "requests of the kubelet missing from docs/api-compatibility.md (add each with the \
         apiserver versions it works on):\n  {}",
        missing.join("\n  ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, user: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            query: String::new(),
            user: Some(user.into()),
            serial: None,
            content_type: String::new(),
            at: tokio::time::Instant::now(),
        }
    }

    #[test]
    fn the_doc_lists_the_kubelets_core_requests() {
        let doc = documented();
        for (m, p) in [
            ("GET", "/api/v1/pods"),
            ("PATCH", "/api/v1/namespaces/default/pods/p/status"),
            ("GET", "/api/v1/services"),
            ("PATCH", "/api/v1/nodes/n1/status"),
            ("GET", "/version"),
        ] {
            assert!(doc.iter().any(|d| d.matches(m, p)), "{m} {p}");
        }
    }

    #[test]
    fn a_request_missing_from_the_doc_is_reported_and_admin_ones_are_not() {
        let doc = parse("| `GET /api/v1/namespaces/{ns}/pods/{name}` | – |\n");
        let log = vec![
            req("GET", "/api/v1/namespaces/a/pods/b", "system:node:n1"),
            req("DELETE", "/api/v1/namespaces/a/pods/b", "system:node:n1"),
            req("GET", "/api/v1/namespaces/a/pods", "system:node:n1"),
            req("POST", "/api/v1/namespaces", "kubernetes-admin"),
        ];
        assert_eq!(
            undocumented(&log, &doc),
            vec![
                "DELETE /api/v1/namespaces/a/pods/b".to_string(),
                "GET /api/v1/namespaces/a/pods".to_string()
            ]
        );
    }
}
