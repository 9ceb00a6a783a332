//! The REST layer: path parsing, verbs, selectors, the pod and CSR strategies
//! (defaults on create, graceful deletion, status subresources, CSR signing)
//! and watch streams, with the status codes and `Status` bodies of the real
//! apiserver.

// Handlers return a ready HTTP response as their error: that is the point.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::{Attributes, Decision, Identity, authorize};
use crate::csr;
use crate::store::{Change, EventType, Key};
use crate::{Fault, Shared};

mod watch;
mod write;

use watch::{list, watch};
use write::{create, delete, patch, update};

/// Response body.
pub type Body = BoxBody<Bytes, Infallible>;

/// A resource the double serves.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// Plural name.
    pub resource: &'static str,
    /// `v1` or `group/version`.
    pub api_version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

const KINDS: &[Kind] = &[
    Kind {
        resource: "pods",
        api_version: "v1",
        kind: "Pod",
        namespaced: true,
    },
    Kind {
        resource: "nodes",
        api_version: "v1",
        kind: "Node",
        namespaced: false,
    },
    Kind {
        resource: "events",
        api_version: "v1",
        kind: "Event",
        namespaced: true,
    },
    Kind {
        resource: "configmaps",
        api_version: "v1",
        kind: "ConfigMap",
        namespaced: true,
    },
    Kind {
        resource: "secrets",
        api_version: "v1",
        kind: "Secret",
        namespaced: true,
    },
    Kind {
        resource: "namespaces",
        api_version: "v1",
        kind: "Namespace",
        namespaced: false,
    },
    Kind {
        resource: "services",
        api_version: "v1",
        kind: "Service",
        namespaced: true,
    },
    Kind {
        resource: "serviceaccounts",
        api_version: "v1",
        kind: "ServiceAccount",
        namespaced: true,
    },
    Kind {
        resource: "persistentvolumeclaims",
        api_version: "v1",
        kind: "PersistentVolumeClaim",
        namespaced: true,
    },
    Kind {
        resource: "persistentvolumes",
        api_version: "v1",
        kind: "PersistentVolume",
        namespaced: false,
    },
    Kind {
        resource: "runtimeclasses",
        api_version: "node.k8s.io/v1",
        kind: "RuntimeClass",
        namespaced: false,
    },
    // Served by 1.19 and 1.20 apiservers (v1 arrived in 1.20); see
    // `Options::runtime_class_v1beta1_only`.
    Kind {
        resource: "runtimeclasses",
        api_version: "node.k8s.io/v1beta1",
        kind: "RuntimeClass",
        namespaced: false,
    },
    // storage.k8s.io (crate::storage); the v1beta1 forms share the v1
    // objects, as the apiserver's storage versions do.
    Kind {
        resource: "csidrivers",
        api_version: "storage.k8s.io/v1",
        kind: "CSIDriver",
        namespaced: false,
    },
    Kind {
        resource: "csinodes",
        api_version: "storage.k8s.io/v1",
        kind: "CSINode",
        namespaced: false,
    },
    Kind {
        resource: "volumeattachments",
        api_version: "storage.k8s.io/v1",
        kind: "VolumeAttachment",
        namespaced: false,
    },
    Kind {
        resource: "storageclasses",
        api_version: "storage.k8s.io/v1",
        kind: "StorageClass",
        namespaced: false,
    },
    Kind {
        resource: "csistoragecapacities",
        api_version: "storage.k8s.io/v1",
        kind: "CSIStorageCapacity",
        namespaced: true,
    },
    Kind {
        resource: "volumeattributesclasses",
        api_version: "storage.k8s.io/v1",
        kind: "VolumeAttributesClass",
        namespaced: false,
    },
    Kind {
        resource: "csidrivers",
        api_version: "storage.k8s.io/v1beta1",
        kind: "CSIDriver",
        namespaced: false,
    },
    Kind {
        resource: "csinodes",
        api_version: "storage.k8s.io/v1beta1",
        kind: "CSINode",
        namespaced: false,
    },
    Kind {
        resource: "volumeattachments",
        api_version: "storage.k8s.io/v1beta1",
        kind: "VolumeAttachment",
        namespaced: false,
    },
    Kind {
        resource: "storageclasses",
        api_version: "storage.k8s.io/v1beta1",
        kind: "StorageClass",
        namespaced: false,
    },
    Kind {
        resource: "leases",
        api_version: "coordination.k8s.io/v1",
        kind: "Lease",
        namespaced: true,
    },
    Kind {
        resource: "certificatesigningrequests",
        api_version: "certificates.k8s.io/v1",
        kind: "CertificateSigningRequest",
        namespaced: false,
    },
    Kind {
        resource: "tokenreviews",
        api_version: "authentication.k8s.io/v1",
        kind: "TokenReview",
        namespaced: false,
    },
    Kind {
        resource: "subjectaccessreviews",
        api_version: "authorization.k8s.io/v1",
        kind: "SubjectAccessReview",
        namespaced: false,
    },
];

/// Looks up a resource by plural name.
pub fn kind(resource: &str) -> Option<Kind> {
    KINDS.iter().find(|k| k.resource == resource).copied()
}

struct Target {
    kind: Kind,
    namespace: String,
    name: String,
    sub: String,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, "", ""),
        [r, n] => (*r, *n, ""),
        [r, n, s] => (*r, *n, *s),
        _ => return None,
    };
    let kind = KINDS
        .iter()
        .find(|k| k.resource == resource && k.api_version == gv)
        .copied()?;
    Some(Target {
        kind,
        namespace,
        name: name.to_string(),
        sub: sub.to_string(),
    })
}

fn json_body(v: &Value) -> Body {
    Full::new(Bytes::from(v.to_string())).boxed()
}

pub(crate) fn respond(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(json_body(v));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A `Status` failure body.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

fn not_found(t: &Target) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{} \"{}\" not found", group_resource(t.kind), t.name),
    )
}

fn group_resource(k: Kind) -> String {
    match k.api_version.split_once('/') {
        Some((g, _)) => format!("{}.{g}", k.resource),
        None => k.resource.to_string(),
    }
}

fn conflict(t: &Target) -> Response<Body> {
    status(
        StatusCode::CONFLICT,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
            group_resource(t.kind),
            t.name
        ),
    )
}

pub(crate) fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(crate) fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

fn with_type(k: Kind, mut v: Value) -> Value {
    v["kind"] = json!(k.kind);
    v["apiVersion"] = json!(k.api_version);
    v
}

/// Serves one request.
pub async fn handle(
    shared: Arc<Shared>,
    peer: Option<Identity>,
    req: Request<Incoming>,
) -> Response<Body> {
    let bearer = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_string);
    let who = match bearer {
        Some(t) => {
            let known = shared.tokens.read().get(&t).cloned();
            known.or_else(|| {
                let store = shared.store.lock();
                shared
                    .signer
                    .authenticate(&t, &shared.options.api_audiences, &store)
                    .map(|(issued, _)| issued.identity())
            })
        }
        None => peer,
    };
    shared.log_request(&req, who.as_ref());
    match shared.fault() {
        Fault::None => {}
        Fault::Hang => {
            shared.wait_fault_cleared().await;
        }
        Fault::ServerError => {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: injected fault",
            );
        }
    }
    let Some(who) = who else {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    };
    let path = req.uri().path().to_string();
    let profile = shared.options.profile;
    if let Some(doc) = crate::profile::discovery::serve(profile, &path) {
        return doc;
    }
    // What the profile's release serves (crate::profile::discovery).
    let served = |t: &Target| {
        crate::profile::served(&shared.options, t.kind.api_version, t.kind.resource, &t.sub)
    };
    let Some(t) = parse_path(&path).filter(served) else {
        return profile.path_not_found();
    };
    let q = query(&req);
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (req.method().clone(), t.name.is_empty()) {
        (Method::GET, true) if watching => "watch",
        (Method::GET, true) => "list",
        (Method::GET, false) => "get",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, _) => "delete",
        _ => {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            );
        }
    };
    // Upstream's request info names a list or watch by its
    // `metadata.name` field selector, so authorizers see one object.
    let selected = matches!(verb, "list" | "watch")
        .then(|| q.get("fieldSelector").and_then(|f| name_selector(f)))
        .flatten();
    let name = selected.as_deref().unwrap_or(&t.name);
    let attrs = Attributes {
        verb,
        resource: t.kind.resource,
        subresource: &t.sub,
        namespace: &t.namespace,
        name,
    };
    let selector = q.get("fieldSelector").map(String::as_str).unwrap_or("");
    let decision = {
        let store = shared.store.lock();
        // The release's Node authorizer sees the parsed field selector.
        let reqs = crate::profile::fields::parse(selector).unwrap_or_default();
        crate::profile::node::authorize(profile, &who, &attrs, &reqs, &store)
            .unwrap_or_else(|| authorize(&who, &attrs, &store))
    };
    if let Decision::Deny(reason) = decision {
        return forbidden(&t, &who, verb, name, &reason);
    }
    if matches!(verb, "list" | "watch")
        && let Err(msg) = crate::profile::fields::check(profile, t.kind.resource, selector)
    {
        return status(StatusCode::BAD_REQUEST, "BadRequest", &msg);
    }
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    if crate::review::is_review(t.kind.resource) {
        return crate::review::serve(&shared, t.kind, verb, &body);
    }
    if t.kind.resource == "serviceaccounts" && !t.sub.is_empty() {
        return match (t.sub.as_str(), verb) {
            ("token", "create") => {
                crate::token::create(&shared, &who, &t.namespace, &t.name, &body)
            }
            ("token", _) => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ),
            _ => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            ),
        };
    }
    match verb {
        "watch" => watch(&shared, &t, &q),
        "list" => list(&shared, &t, &q),
        "get" => get(&shared, &t),
        "create" => create(&shared, &t, &who, &body),
        "update" => update(&shared, &t, &who, &body),
        "patch" => patch(&shared, &t, &who, &content_type, &body),
        _ => delete(&shared, &t, &q, &body),
    }
}

/// The name a `metadata.name=<n>` (or `==`) field selector picks.
fn name_selector(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (k, v) = term.split_once("==").or_else(|| term.split_once('='))?;
        (k.trim() == "metadata.name").then(|| v.trim().to_string())
    })
}

/// A 403 as upstream's `responsewriters.Forbidden` words it.
fn forbidden(t: &Target, who: &Identity, verb: &str, name: &str, reason: &str) -> Response<Body> {
    let scope = if t.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", t.namespace)
    };
    let group = t.kind.api_version.split_once('/').map_or("", |(g, _)| g);
    let resource = if t.sub.is_empty() {
        t.kind.resource.to_string()
    } else {
        format!("{}/{}", t.kind.resource, t.sub)
    };
    let subject = if name.is_empty() {
        group_resource(t.kind)
    } else {
        format!("{} \"{name}\"", group_resource(t.kind))
    };
    let mut msg = format!(
        "{subject} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}",
        who.user
    );
    if !reason.is_empty() {
        msg.push_str(": ");
        msg.push_str(reason);
    }
    status(StatusCode::FORBIDDEN, "Forbidden", &msg)
}

fn key(t: &Target, name: &str) -> Key {
    Key {
        resource: t.kind.resource.to_string(),
        namespace: t.namespace.clone(),
        name: name.to_string(),
    }
}

fn get(shared: &Shared, t: &Target) -> Response<Body> {
    let store = shared.store.lock();
    match store.get(&key(t, &t.name)) {
        Some(v) => respond(StatusCode::OK, &with_type(t.kind, v.clone())),
        None => not_found(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_resources() {
        let t = parse_path("/api/v1/namespaces/kube-system/pods/p1/status").expect("pod status");
        assert_eq!(
            (
                t.kind.resource,
                t.namespace.as_str(),
                t.name.as_str(),
                t.sub.as_str()
            ),
            ("pods", "kube-system", "p1", "status")
        );
        let t = parse_path("/api/v1/pods").expect("all pods");
        assert!(t.namespace.is_empty() && t.name.is_empty());
        let t = parse_path("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1")
            .expect("lease");
        assert_eq!(t.kind.kind, "Lease");
        assert!(parse_path("/apis/coordination.k8s.io/v1beta1/namespaces/x/leases/n").is_none());
    }
}
