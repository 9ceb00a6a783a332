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

use crate::auth::{Attributes, Identity, authorize};
use crate::csr;
use crate::store::{Change, EventType, Key};
use crate::{Fault, Shared};

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
    let kind = kind(resource).filter(|k| k.api_version == gv)?;
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

fn respond(code: StatusCode, v: &Value) -> Response<Body> {
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

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn new_uid() -> String {
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

/// `a.b.c` lookup into JSON.
fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// Field and label selectors with `=`, `==`, `!=` (and label existence).
#[derive(Debug, Default, Clone)]
struct Selectors {
    fields: Vec<(String, String, bool)>,
    labels: Vec<(String, Option<String>, bool)>,
}

impl Selectors {
    fn parse(q: &HashMap<String, String>) -> Self {
        let split = |s: &str| -> (String, Option<String>, bool) {
            if let Some((k, v)) = s.split_once("!=") {
                (k.trim().into(), Some(v.trim().into()), false)
            } else if let Some((k, v)) = s.split_once("==").or_else(|| s.split_once('=')) {
                (k.trim().into(), Some(v.trim().into()), true)
            } else {
                (s.trim().into(), None, true)
            }
        };
        let list = |key: &str| -> Vec<(String, Option<String>, bool)> {
            q.get(key)
                .map(|s| s.split(',').filter(|x| !x.is_empty()).map(split).collect())
                .unwrap_or_default()
        };
        Self {
            fields: list("fieldSelector")
                .into_iter()
                .map(|(k, v, eq)| (k, v.unwrap_or_default(), eq))
                .collect(),
            labels: list("labelSelector"),
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        let fields_ok = self.fields.iter().all(|(k, v, eq)| {
            let actual = field(obj, k).and_then(Value::as_str).unwrap_or("");
            (actual == v) == *eq
        });
        let labels = obj.pointer("/metadata/labels");
        let labels_ok = self.labels.iter().all(|(k, v, eq)| {
            let actual = labels.and_then(|l| l.get(k)).and_then(Value::as_str);
            match v {
                None => actual.is_some(),
                Some(v) => (actual == Some(v.as_str())) == *eq,
            }
        });
        fields_ok && labels_ok
    }
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
        Some(t) => shared.tokens.read().get(&t).cloned(),
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
    let Some(t) = parse_path(&path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
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
    let attrs = Attributes {
        verb,
        resource: t.kind.resource,
        subresource: &t.sub,
        namespace: &t.namespace,
        name: &t.name,
    };
    if !authorize(&who, &attrs) {
        let scope = if t.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", t.namespace)
        };
        let group = t.kind.api_version.split_once('/').map_or("", |(g, _)| g);
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!(
                "{} \"{}\" is forbidden: User \"{}\" cannot {verb} resource \"{}\" in API group \"{group}\" {scope}",
                group_resource(t.kind),
                t.name,
                who.user,
                t.kind.resource
            ),
        );
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
    match verb {
        "watch" => watch(&shared, &t, &q),
        "list" => list(&shared, &t, &q),
        "get" => get(&shared, &t),
        "create" => create(&shared, &t, &who, &body),
        "update" => update(&shared, &t, &body),
        "patch" => patch(&shared, &t, &content_type, &body),
        _ => delete(&shared, &t, &q, &body),
    }
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

fn list(shared: &Shared, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let sel = Selectors::parse(q);
    let store = shared.store.lock();
    let ns = (!t.namespace.is_empty()).then_some(t.namespace.as_str());
    let mut items: Vec<Value> = store
        .list(t.kind.resource, ns)
        .into_iter()
        .filter(|o| sel.matches(o))
        .collect();
    // Paging: `continue` is the offset into the same snapshot revision.
    let offset: usize = q
        .get("continue")
        .and_then(|c| c.split_once(':'))
        .and_then(|(_, o)| o.parse().ok())
        .unwrap_or(0);
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    items = items.into_iter().skip(offset).collect();
    let mut meta = json!({"resourceVersion": store.revision().to_string()});
    if limit > 0 && items.len() > limit {
        items.truncate(limit);
        meta["continue"] = json!(format!("{}:{}", store.revision(), offset + limit));
    }
    respond(
        StatusCode::OK,
        &json!({"kind": format!("{}List", t.kind.kind), "apiVersion": t.kind.api_version,
            "metadata": meta, "items": items}),
    )
}

fn watch_event(kind: Kind, ty: &str, object: Value) -> Bytes {
    let mut line = json!({"type": ty, "object": with_type(kind, object)}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// Translates a change for a filtered watch (the cacher's semantics: an
/// object that stops matching is DELETED for this watcher).
fn translate(c: &Change, t: &Target, sel: &Selectors) -> Option<(&'static str, Value)> {
    if c.key.resource != t.kind.resource
        || (!t.namespace.is_empty() && c.key.namespace != t.namespace)
    {
        return None;
    }
    let now = sel.matches(&c.object);
    let before = c.previous.as_ref().is_some_and(|p| sel.matches(p));
    let ty = match (c.kind, before, now) {
        (EventType::Deleted, _, true) => "DELETED",
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        _ => return None,
    };
    Some((ty, c.object.clone()))
}

fn watch(shared: &Arc<Shared>, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let sel = Selectors::parse(q);
    let kind = t.kind;
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    let target = Target {
        kind,
        namespace: t.namespace.clone(),
        name: String::new(),
        sub: String::new(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let requested = q.get("resourceVersion").cloned().unwrap_or_default();
    let (initial, backlog, mut live, start) = {
        let store = shared.store.lock();
        let rv = store.revision();
        if requested.is_empty() || requested == "0" {
            let ns = (!t.namespace.is_empty()).then_some(t.namespace.as_str());
            let objs: Vec<Value> = store
                .list(kind.resource, ns)
                .into_iter()
                .filter(|o| sel.matches(o))
                .collect();
            match store.watch_from(rv) {
                Some((b, l)) => (objs, b, l, rv),
                None => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "watch"),
            }
        } else {
            let from = requested.parse::<u64>().unwrap_or(0);
            match store.watch_from(from) {
                Some((b, l)) => (vec![], b, l, from),
                None => {
                    let msg = format!(
                        "too old resource version: {from} ({})",
                        store.compacted() + 1
                    );
                    let err = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                        "metadata": {}, "status": "Failure", "message": msg, "reason": "Expired", "code": 410}});
                    let body = Full::new(Bytes::from(format!("{err}\n"))).boxed();
                    return Response::new(body);
                }
            }
        }
    };
    let mut closed = shared.watch_generation.subscribe();
    let interval = shared.options.bookmark_interval;
    tokio::spawn(async move {
        let mut progress = start;
        for o in initial {
            if tx.send(watch_event(kind, "ADDED", o)).await.is_err() {
                return;
            }
        }
        for c in backlog {
            progress = c.rv;
            if let Some((ty, o)) = translate(&c, &target, &sel)
                && tx.send(watch_event(kind, ty, o)).await.is_err()
            {
                return;
            }
        }
        let deadline = timeout.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            let until_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = until_deadline => return,
                _ = closed.changed() => return,
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"metadata": {"resourceVersion": progress.to_string()}});
                    if tx.send(watch_event(kind, "BOOKMARK", b)).await.is_err() { return; }
                }
                c = live.recv() => {
                    // A lagging watcher is closed; the client re-watches from its last revision.
                    let Ok(c) = c else { return };
                    if c.rv <= progress { continue; }
                    progress = c.rv;
                    if let Some((ty, o)) = translate(&c, &target, &sel)
                        && tx.send(watch_event(kind, ty, o)).await.is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn parse_object(body: &[u8]) -> Result<Value, Response<Body>> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| {
            status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the body must be a JSON object",
            )
        })
}

fn invalid(t: &Target, name: &str, msg: &str) -> Response<Body> {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{} \"{name}\" is invalid: {msg}", t.kind.kind),
    )
}

fn create(shared: &Shared, t: &Target, who: &Identity, body: &[u8]) -> Response<Body> {
    let mut obj = match parse_object(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    if t.kind.resource == "tokenreviews" {
        let token = obj
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or("");
        let user = shared.tokens.read().get(token).cloned();
        obj["status"] = match user {
            Some(u) => {
                json!({"authenticated": true, "user": {"username": u.user, "groups": u.groups}})
            }
            None => json!({"authenticated": false}),
        };
        return respond(StatusCode::CREATED, &with_type(t.kind, obj));
    }
    let mut name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() {
        let Some(prefix) = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        else {
            return invalid(
                t,
                "",
                "metadata.name: Required value: name or generateName is required",
            );
        };
        let suffix: String = (0..5)
            .map(|_| char::from(b"bcdfghjklmnpqrstvwxz2456789"[rand::random_range(0..27)]))
            .collect();
        name = format!("{prefix}{suffix}");
    }
    if t.kind.namespaced && t.namespace.is_empty() {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    }
    if let Some(node) = who.node_name()
        && t.kind.resource == "pods"
    {
        // NodeRestriction: a node may create only mirror pods bound to itself.
        let mirror = obj
            .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
            .is_some();
        let bound = obj.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node);
        if !mirror || !bound {
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "pods \"{name}\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
                ),
            );
        }
    }
    let k = key(t, &name);
    let mut store = shared.store.lock();
    if store.get(&k).is_some() {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", group_resource(t.kind)),
        );
    }
    let meta = obj["metadata"]
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut meta = Value::Object(meta);
    meta["name"] = json!(name);
    if t.kind.namespaced {
        meta["namespace"] = json!(t.namespace);
    }
    meta["uid"] = json!(new_uid());
    meta["creationTimestamp"] = json!(now());
    if let Some(m) = meta.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("deletionTimestamp");
    }
    obj["metadata"] = meta;
    match t.kind.resource {
        "pods" => {
            if let Err(r) = pod_on_create(t, &name, &mut obj) {
                return r;
            }
        }
        "certificatesigningrequests" => {
            obj["spec"]["username"] = json!(who.user);
            obj["spec"]["groups"] = json!(who.groups);
            obj["status"] = json!({});
            csr::auto_approve(shared, &mut obj);
        }
        "nodes" => {
            obj.as_object_mut()
                .map(|o| o.entry("status").or_insert(json!({})));
        }
        _ => {}
    }
    let stored = store.put(k, obj);
    respond(StatusCode::CREATED, &with_type(t.kind, stored))
}

fn pod_on_create(t: &Target, name: &str, obj: &mut Value) -> Result<(), Response<Body>> {
    let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(obj.clone())
        .map_err(|e| invalid(t, name, &format!("cannot decode: {e}")))?;
    kubelet_types::defaults::apply_api_defaults(&mut pod);
    if let Err(e) = kubelet_types::defaults::validate(&pod) {
        return Err(invalid(t, name, &e));
    }
    let qos = kubelet_runtime::sandbox_qos_class(&pod);
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Pending".into()),
        qos_class: Some(qos.into()),
        ..Default::default()
    });
    let mut v = serde_json::to_value(&pod).map_err(|e| invalid(t, name, &e.to_string()))?;
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    *obj = v;
    Ok(())
}

/// Checks `metadata.uid` / `metadata.resourceVersion` given in a write against the stored object.
fn preconditions(
    t: &Target,
    stored: &Value,
    uid: Option<&str>,
    rv: Option<&str>,
) -> Result<(), Response<Body>> {
    let s_uid = stored
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(u) = uid.filter(|u| !u.is_empty())
        && u != s_uid
    {
        return Err(status(
            StatusCode::CONFLICT,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {} \"{}\": Precondition failed: UID in precondition: {u}, UID in object meta: {s_uid}",
                group_resource(t.kind),
                t.name
            ),
        ));
    }
    let s_rv = stored
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(r) = rv.filter(|r| !r.is_empty())
        && r != s_rv
    {
        return Err(conflict(t));
    }
    Ok(())
}

/// Keeps what a write through `sub` may not change.
fn restrict(t: &Target, old: &Value, mut new: Value) -> Value {
    let has_status = matches!(
        t.kind.resource,
        "pods" | "nodes" | "certificatesigningrequests"
    );
    match t.sub.as_str() {
        "status" | "approval" => {
            let mut out = old.clone();
            if t.sub == "approval" {
                out["status"]["conditions"] = new
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or(Value::Null);
            } else {
                out["status"] = new["status"].take();
            }
            out
        }
        _ => {
            if has_status {
                new["status"] = old["status"].clone();
            }
            // Identity fields never change.
            for f in [
                "uid",
                "creationTimestamp",
                "name",
                "namespace",
                "deletionTimestamp",
            ] {
                match old["metadata"].get(f) {
                    Some(v) => new["metadata"][f] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(f);
                        }
                    }
                }
            }
            new
        }
    }
}

fn finish_write(shared: &Shared, t: &Target, k: Key, new: Value, old: &Value) -> Response<Body> {
    let mut new = new;
    if t.kind.resource == "certificatesigningrequests" && t.sub == "approval" {
        csr::sign_if_approved(shared, &mut new);
    }
    if new == *old {
        // A no-op write keeps the resourceVersion and sends no event.
        return respond(StatusCode::OK, &with_type(t.kind, new));
    }
    let stored = shared.store.lock().put(k, new);
    respond(StatusCode::OK, &with_type(t.kind, stored))
}

fn update(shared: &Shared, t: &Target, body: &[u8]) -> Response<Body> {
    let obj = match parse_object(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let k = key(t, &t.name);
    let old = match shared.store.lock().get(&k).cloned() {
        Some(o) => o,
        None => return not_found(t),
    };
    let uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    if let Err(r) = preconditions(t, &old, uid, rv) {
        return r;
    }
    let mut new = restrict(t, &old, obj);
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    finish_write(shared, t, k, new, &old)
}

fn patch(shared: &Shared, t: &Target, content_type: &str, body: &[u8]) -> Response<Body> {
    let k = key(t, &t.name);
    let old = match shared.store.lock().get(&k).cloned() {
        Some(o) => o,
        None => return not_found(t),
    };
    let patched = match crate::patch::apply(content_type, &old, body) {
        Ok(p) => p,
        Err(crate::patch::PatchError::UnsupportedMediaType) => {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                &crate::patch::PatchError::UnsupportedMediaType.to_string(),
            );
        }
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let p: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let uid = p.pointer("/metadata/uid").and_then(Value::as_str);
    let rv = p
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    if let Err(r) = preconditions(t, &old, uid, rv) {
        return r;
    }
    let mut new = restrict(t, &old, patched);
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    finish_write(shared, t, k, new, &old)
}

fn delete(shared: &Shared, t: &Target, q: &HashMap<String, String>, body: &[u8]) -> Response<Body> {
    let opts: Value = serde_json::from_slice(body).unwrap_or(json!({}));
    let grace = q
        .get("gracePeriodSeconds")
        .and_then(|g| g.parse::<i64>().ok())
        .or_else(|| opts.get("gracePeriodSeconds").and_then(Value::as_i64));
    let k = key(t, &t.name);
    let mut store = shared.store.lock();
    let Some(old) = store.get(&k).cloned() else {
        return not_found(t);
    };
    let uid = opts.pointer("/preconditions/uid").and_then(Value::as_str);
    let rv = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str);
    if let Err(r) = preconditions(t, &old, uid, rv) {
        return r;
    }
    let has_finalizers = old
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    // Pods bound to a node terminate gracefully: the kubelet confirms with grace 0.
    let graceful = if t.kind.resource == "pods" {
        let bound = old
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let finished = matches!(
            old.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        let default = old
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        let g = grace.unwrap_or(default).max(0);
        let current = old
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        (bound && !finished && g > 0)
            .then_some(g)
            .map(|g| current.map_or(g, |c| c.min(g)))
    } else {
        None
    };
    if graceful.is_none() && !has_finalizers {
        let gone = store.delete(&k).unwrap_or(old);
        return respond(StatusCode::OK, &with_type(t.kind, gone));
    }
    let mut new = old.clone();
    let g = graceful.unwrap_or(0);
    if new.pointer("/metadata/deletionTimestamp").is_none() || graceful.is_some() {
        let at = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_secs(g))
            .unwrap_or_else(|_| jiff::Timestamp::now());
        new["metadata"]["deletionTimestamp"] = json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        new["metadata"]["deletionGracePeriodSeconds"] = json!(g);
    }
    if new == old {
        return respond(StatusCode::OK, &with_type(t.kind, old));
    }
    let stored = store.put(k, new);
    respond(StatusCode::OK, &with_type(t.kind, stored))
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

    #[test]
    fn selectors_filter_on_fields_and_labels() {
        let mut q = HashMap::new();
        q.insert("fieldSelector".to_string(), "spec.nodeName=n1".to_string());
        q.insert("labelSelector".to_string(), "app=web,tier!=db".to_string());
        let s = Selectors::parse(&q);
        assert!(
            s.matches(&json!({"spec": {"nodeName": "n1"}, "metadata": {"labels": {"app": "web"}}}))
        );
        assert!(
            !s.matches(
                &json!({"spec": {"nodeName": "n2"}, "metadata": {"labels": {"app": "web"}}})
            )
        );
        assert!(!s.matches(&json!({"spec": {"nodeName": "n1"}, "metadata": {"labels": {"app": "web", "tier": "db"}}})));
    }
}
