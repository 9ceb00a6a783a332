//! Writes: create, update, patch and delete with the generic registry's
//! rules (upstream `apiserver/pkg/endpoints/handlers/{create,update,patch,delete}.go`
//! and `registry/generic/registry/store.go`): preconditions, status
//! subresources, graceful deletion, and the pod strategy ([`crate::pod`]).

use super::*;

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

pub(super) fn create(shared: &Shared, t: &Target, who: &Identity, body: &[u8]) -> Response<Body> {
    let mut obj = match parse_object(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
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
    // NodeRestriction as the profile's release runs it.
    if let Err(r) =
        crate::profile::node::admit_pod_create(shared, who, t.kind.resource, &name, &obj)
    {
        return r;
    }
    if let Err(msg) = crate::storage::admit_create(who, t.kind.resource, &name) {
        return status(StatusCode::FORBIDDEN, "Forbidden", &msg);
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
    let ca = shared.ca.cert_pem.as_str();
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
    crate::profile::decode::drop_unknown_fields(shared.options.profile, t.kind.resource, &mut obj);
    match t.kind.resource {
        "pods" => {
            if shared.options.service_account_admission {
                crate::controllers::ensure_namespace(&mut store, &k.namespace, ca);
                if let Err(why) = crate::profile::service_account::admit_pod(
                    shared,
                    &mut store,
                    &t.namespace,
                    &mut obj,
                ) {
                    return status(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        &format!("pods \"{name}\" is forbidden: {why}"),
                    );
                }
            }
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
        storage if crate::storage::is_storage(storage) => {
            if let Err(errs) = crate::storage::on_create(shared.options.profile, storage, &mut obj)
            {
                return invalid_fields(t, &name, &errs);
            }
        }
        other => {
            if let Err(errs) = crate::strategy::on_create(other, &store, &mut obj) {
                return invalid_fields(t, &name, &errs);
            }
        }
    }
    // The double creates a namespace on first use instead of refusing the
    // object (upstream's NamespaceLifecycle would answer 404).
    crate::controllers::ensure_namespace(&mut store, &k.namespace, ca);
    let stored = store.put(k.clone(), obj);
    if t.kind.resource == "namespaces" {
        crate::controllers::publish(&mut store, &name, ca);
    }
    respond(StatusCode::CREATED, &with_type(t.kind, stored))
}

fn pod_on_create(t: &Target, name: &str, obj: &mut Value) -> Result<(), Response<Body>> {
    crate::pod::on_create(obj).map_err(|e| match e {
        crate::pod::Rejected::Decode(m) => status(StatusCode::BAD_REQUEST, "BadRequest", &m),
        crate::pod::Rejected::Invalid(errs) => invalid_fields(t, name, &errs),
    })
}

/// A 422 `Status` listing field errors, as upstream `errors.NewInvalid`.
fn invalid_fields(
    t: &Target,
    name: &str,
    errs: &[crate::validation::FieldError],
) -> Response<Body> {
    let code = StatusCode::UNPROCESSABLE_ENTITY;
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{} \"{name}\" is invalid: {}", t.kind.kind, crate::validation::aggregate(errs)),
            "reason": "Invalid",
            "details": {"name": name, "kind": t.kind.kind, "causes": crate::validation::causes(errs)},
            "code": code.as_u16()}),
    )
}

/// Pods written by update or patch are decoded and defaulted again, as
/// every write through the apiserver's codec is.
fn pod_on_write(t: &Target, new: &mut Value, patched: bool) -> Result<(), Response<Body>> {
    if t.kind.resource != "pods" {
        return Ok(());
    }
    crate::pod::on_update(new).map_err(|m| {
        if patched {
            // A patch that leaves an undecodable object (upstream patch.go).
            status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                &format!(
                    " \"\" is invalid: patch: Invalid value: {:?}: {m}",
                    new.to_string()
                ),
            )
        } else {
            status(StatusCode::BAD_REQUEST, "BadRequest", &m)
        }
    })
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

/// The admission of an update or patch (NodeRestriction's
/// `admitPVCStatus`), on the object as written, before [`restrict`].
fn admit_write(
    shared: &Shared,
    t: &Target,
    who: &Identity,
    old: &Value,
    new: &Value,
) -> Result<(), Response<Body>> {
    crate::profile::node::admit_pvc_status(
        shared.options.profile,
        who,
        t.kind.resource,
        &t.sub,
        &t.name,
        old,
        new,
    )
}

/// Keeps what a write through `sub` may not change.
fn restrict(t: &Target, old: &Value, mut new: Value) -> Value {
    let has_status = matches!(
        t.kind.resource,
        "pods"
            | "nodes"
            | "certificatesigningrequests"
            | "services"
            | "persistentvolumeclaims"
            | "persistentvolumes"
            | "namespaces"
            | "volumeattachments"
    );
    match t.sub.as_str() {
        "ephemeralcontainers" if t.kind.resource == "pods" => {
            crate::pod::drop_non_ephemeral_container_updates(old, &new)
        }
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

/// How many times an update or patch is computed again when the object
/// changed under it (upstream `GuaranteedUpdate` retries on conflict).
const UPDATE_TRIES: usize = 5;

/// Stores `new`, computed from `old`, if the object is still `old` (same
/// resourceVersion): `None` when it changed meanwhile (compute again), a 404
/// when it was deleted meanwhile. A write never brings back a deleted
/// object or undoes a concurrent one (upstream `GuaranteedUpdate` in
/// `staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`).
fn finish_write(
    shared: &Shared,
    t: &Target,
    k: Key,
    new: Value,
    old: &Value,
) -> Option<Response<Body>> {
    let mut new = new;
    crate::profile::decode::drop_unknown_fields(shared.options.profile, t.kind.resource, &mut new);
    if t.kind.resource == "certificatesigningrequests" && t.sub == "approval" {
        csr::sign_if_approved(shared, &mut new);
    }
    if t.sub.is_empty()
        && let Err(errs) = crate::strategy::on_update(t.kind.resource, old, &mut new)
    {
        return Some(invalid_fields(t, &t.name, &errs));
    }
    if t.sub.is_empty()
        && let Err(errs) =
            crate::storage::on_update(shared.options.profile, t.kind.resource, old, &mut new)
    {
        return Some(invalid_fields(t, &t.name, &errs));
    }
    if t.kind.resource == "pods"
        && let Err(r) = pod_update(t, old, &mut new)
    {
        return Some(r);
    }
    let mut store = shared.store.lock();
    match store.get(&k) {
        None => return Some(not_found(t)),
        Some(cur) if cur["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] => {
            return None;
        }
        Some(_) => {}
    }
    if new == *old {
        // A no-op write keeps the resourceVersion and sends no event.
        return Some(respond(StatusCode::OK, &with_type(t.kind, new)));
    }
    let stored = store.put(k.clone(), new);
    crate::controllers::reconcile(&mut store, &k, &shared.ca.cert_pem);
    Some(respond(StatusCode::OK, &with_type(t.kind, stored)))
}

/// The pod strategy on update: the main resource may not touch ephemeral
/// containers, the `ephemeralcontainers` subresource is validated as
/// upstream's, and spec changes move the generation.
fn pod_update(t: &Target, old: &Value, new: &mut Value) -> Result<(), Response<Body>> {
    let checked = match t.sub.as_str() {
        "" => crate::pod::validate_update(old, new),
        "ephemeralcontainers" => crate::pod::validate_ephemeral_update(old, new),
        _ => Ok(()),
    };
    checked.map_err(|e| match e {
        crate::pod::Rejected::Decode(m) => status(StatusCode::BAD_REQUEST, "BadRequest", &m),
        crate::pod::Rejected::Invalid(errs) => invalid_fields(t, &t.name, &errs),
    })?;
    crate::pod::update_generation(old, new);
    Ok(())
}

pub(super) fn update(shared: &Shared, t: &Target, who: &Identity, body: &[u8]) -> Response<Body> {
    for _ in 0..UPDATE_TRIES {
        if let Some(r) = update_once(shared, t, who, body) {
            return r;
        }
    }
    conflict(t)
}

/// One try of [`update`]: `None` when the object changed meanwhile.
fn update_once(shared: &Shared, t: &Target, who: &Identity, body: &[u8]) -> Option<Response<Body>> {
    let obj = match parse_object(body) {
        Ok(o) => o,
        Err(r) => return Some(r),
    };
    let k = key(t, &t.name);
    let old = match shared.store.lock().get(&k).cloned() {
        Some(o) => o,
        None => return Some(not_found(t)),
    };
    let uid = obj.pointer("/metadata/uid").and_then(Value::as_str);
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    if let Err(r) = preconditions(t, &old, uid, rv) {
        return Some(r);
    }
    if let Err(r) = admit_write(shared, t, who, &old, &obj) {
        return Some(r);
    }
    let mut new = restrict(t, &old, obj);
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    if let Err(r) = pod_on_write(t, &mut new, false) {
        return Some(r);
    }
    finish_write(shared, t, k, new, &old)
}

pub(super) fn patch(
    shared: &Shared,
    t: &Target,
    who: &Identity,
    content_type: &str,
    body: &[u8],
) -> Response<Body> {
    for _ in 0..UPDATE_TRIES {
        if let Some(r) = patch_once(shared, t, who, content_type, body) {
            return r;
        }
    }
    conflict(t)
}

/// One try of [`patch`]: `None` when the object changed meanwhile.
fn patch_once(
    shared: &Shared,
    t: &Target,
    who: &Identity,
    content_type: &str,
    body: &[u8],
) -> Option<Response<Body>> {
    let k = key(t, &t.name);
    let old = match shared.store.lock().get(&k).cloned() {
        Some(o) => o,
        None => return Some(not_found(t)),
    };
    let patched = match crate::patch::apply(content_type, &old, body) {
        Ok(p) => p,
        Err(crate::patch::PatchError::UnsupportedMediaType) => {
            return Some(status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                &crate::patch::PatchError::UnsupportedMediaType.to_string(),
            ));
        }
        Err(e) => {
            return Some(status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &e.to_string(),
            ));
        }
    };
    let p: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let uid = p.pointer("/metadata/uid").and_then(Value::as_str);
    let rv = p
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    if let Err(r) = preconditions(t, &old, uid, rv) {
        return Some(r);
    }
    if let Err(r) = admit_write(shared, t, who, &old, &patched) {
        return Some(r);
    }
    let mut new = restrict(t, &old, patched);
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    if let Err(r) = pod_on_write(t, &mut new, true) {
        return Some(r);
    }
    finish_write(shared, t, k, new, &old)
}

pub(super) fn delete(
    shared: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Response<Body> {
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
        crate::controllers::reconcile(&mut store, &k, &shared.ca.cert_pem);
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
