//! The ServiceAccount admission plugin as each release runs it
//! (`plugin/pkg/admission/serviceaccount/admission.go`,
//! `docs/apiserver-versions.md` §5).
//!
//! - 1.35: the projected `kube-api-access-<suffix>` volume
//!   ([`crate::admission`]).
//! - 1.19 (v1.19.10, `BoundServiceAccountTokenVolume` alpha and off): a
//!   secret volume of the service account's token Secret, named after the
//!   Secret, mounted at the same path. The Secret is what
//!   kube-controller-manager's token controller
//!   (`pkg/controller/serviceaccount/tokens_controller.go`) creates for
//!   every service account: `<sa>-token-<5 chars>`, type
//!   `kubernetes.io/service-account-token`, with `token`, `ca.crt` and
//!   `namespace`, listed in the account's `secrets`. The double runs that
//!   controller when a pod first needs the token, so the Secret exists
//!   before the pod, as it would on a cluster at rest.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::Shared;
use crate::admission::API_ACCESS_VOLUME;
use crate::auth::Identity;
use crate::store::{Key, Store};

/// The Secret type of legacy service account tokens.
pub const TOKEN_SECRET_TYPE: &str = "kubernetes.io/service-account-token";
const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
const SA_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

fn key(resource: &str, namespace: &str, name: &str) -> Key {
    Key {
        resource: resource.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn volume_names(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// Admits `pod` being created in `namespace` as `shared`'s release does;
/// the error is the reason of a 403.
pub(crate) fn admit_pod(
    shared: &Shared,
    store: &mut Store,
    namespace: &str,
    pod: &mut Value,
) -> Result<(), String> {
    if shared.options.profile.at_least(21) {
        // BoundServiceAccountTokenVolume beta (on) from 1.21.
        return crate::admission::admit_pod(store, namespace, pod);
    }
    let before = volume_names(pod);
    let sa_name = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    let mirror = pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    let token_secret = if mirror {
        None
    } else {
        ensure_token_secret(shared, store, namespace, &sa_name)
    };
    crate::admission::admit_pod(store, namespace, pod)?;
    let prefix = format!("{API_ACCESS_VOLUME}-");
    let added = volume_names(pod)
        .into_iter()
        .find(|n| n.starts_with(&prefix) && !before.contains(n));
    let (Some(added), Some(secret)) = (added, token_secret) else {
        return Ok(());
    };
    for v in pod["spec"]["volumes"].as_array_mut().into_iter().flatten() {
        if v.get("name").and_then(Value::as_str) == Some(added.as_str()) {
            *v = json!({"name": secret, "secret": {"secretName": secret}});
        }
    }
    for list in ["initContainers", "containers"] {
        let containers = pod["spec"].get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            let mounts = c.get_mut("volumeMounts").and_then(Value::as_array_mut);
            for m in mounts.into_iter().flatten() {
                if m.get("name").and_then(Value::as_str) == Some(added.as_str()) {
                    m["name"] = json!(secret);
                }
            }
        }
    }
    Ok(())
}

/// The name of the service account's token Secret, created (with its
/// token) when the account has none; `None` when the account is missing.
fn ensure_token_secret(
    shared: &Shared,
    store: &mut Store,
    namespace: &str,
    sa_name: &str,
) -> Option<String> {
    let sa_key = key("serviceaccounts", namespace, sa_name);
    let mut sa = store.get(&sa_key)?.clone();
    let sa_uid = sa
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let existing = store
        .list("secrets", Some(namespace))
        .into_iter()
        .find(|s| {
            let ann = |k: &str| s.pointer("/metadata/annotations").and_then(|a| a.get(k));
            s.get("type").and_then(Value::as_str) == Some(TOKEN_SECRET_TYPE)
                && ann(SA_NAME_ANNOTATION).and_then(Value::as_str) == Some(sa_name)
                && ann(SA_UID_ANNOTATION).and_then(Value::as_str) == Some(sa_uid.as_str())
        })
        .and_then(|s| {
            s.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    if existing.is_some() {
        return existing;
    }
    let suffix: String = (0..5)
        .map(|_| char::from(b"bcdfghjklmnpqrstvwxz2456789"[rand::random_range(0..27)]))
        .collect();
    let name = format!("{sa_name}-token-{suffix}");
    // Legacy token claims (`pkg/serviceaccount/legacy.go`).
    let claims = json!({
        "iss": "kubernetes/serviceaccount",
        "kubernetes.io/serviceaccount/namespace": namespace,
        "kubernetes.io/serviceaccount/secret.name": name,
        "kubernetes.io/serviceaccount/service-account.name": sa_name,
        "kubernetes.io/serviceaccount/service-account.uid": sa_uid,
        "sub": format!("system:serviceaccount:{namespace}:{sa_name}"),
    });
    let token = match shared.signer.sign(&claims) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "apiserver double cannot sign a legacy token");
            return None;
        }
    };
    shared.tokens.write().insert(
        token.clone(),
        Identity::new(
            &format!("system:serviceaccount:{namespace}:{sa_name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
            ],
        ),
    );
    let secret = json!({
        "metadata": {"name": name, "namespace": namespace, "uid": crate::rest::new_uid(),
            "creationTimestamp": crate::rest::now(),
            "annotations": {SA_NAME_ANNOTATION: sa_name, SA_UID_ANNOTATION: sa_uid}},
        "type": TOKEN_SECRET_TYPE,
        "data": {
            "token": STANDARD.encode(token),
            "ca.crt": STANDARD.encode(&shared.ca.cert_pem),
            "namespace": STANDARD.encode(namespace),
        },
    });
    store.put(key("secrets", namespace, &name), secret);
    let mut refs = sa
        .get("secrets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    refs.push(json!({"name": name}));
    sa["secrets"] = Value::Array(refs);
    store.put(sa_key, sa);
    Some(name)
}
