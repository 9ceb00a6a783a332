//! The `serviceaccounts/token` subresource (upstream
//! `pkg/registry/core/serviceaccount/storage/token.go`, with the claims of
//! `pkg/serviceaccount/claims.go`, the ES256 JWT signer of
//! `pkg/serviceaccount/jwt.go`, the validation of
//! `pkg/apis/authentication/validation` and the NodeRestriction admission
//! check `admitServiceAccount`), and the authenticator for the tokens it
//! issued (used by bearer authentication and TokenReview).
//!
//! The double remembers every token it signed, so authenticating one is a
//! lookup plus the checks upstream's validator makes (expiry, audience, the
//! bound pod still existing with the same UID).

// Handlers return a ready HTTP response as their error, as the REST layer does.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{Response, StatusCode};
use parking_lot::RwLock;
use rcgen::{KeyPair, PublicKeyData, SigningKey};
use serde_json::{Value, json};
use sha2::Digest;

use crate::Shared;
use crate::auth::Identity;
use crate::field::FieldError;
use crate::rest::{Body, respond, status};
use crate::store::{Key, Store};

/// Upstream's minimum token lifetime (`MinTokenAgeSec`).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The default `spec.expirationSeconds` of the v1 TokenRequest.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The lifetime the kubelet asks for that upstream extends (upstream
/// `WarnOnlyBoundTokenExpirationSeconds`).
pub const WARN_ONLY_EXPIRATION_SECONDS: i64 = 3607;
/// What such tokens live instead (upstream `ExpirationExtensionSeconds`, a year).
pub const EXTENDED_EXPIRATION_SECONDS: i64 = 24 * 365 * 3600;

/// Errors signing a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The key could not sign.
    #[error("failed to generate token: {0}")]
    Sign(#[from] rcgen::Error),
    /// The signature was not the DER ECDSA signature expected.
    #[error("failed to generate token: malformed ECDSA signature")]
    Signature,
}

/// What a token issued by the double stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// Namespace of the service account.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
    /// Service account UID.
    pub service_account_uid: String,
    /// `aud`.
    pub audiences: Vec<String>,
    /// `exp`, seconds since the epoch.
    pub expires: i64,
    /// The bound pod's name and UID, if any.
    pub pod: Option<(String, String)>,
    /// The node the bound pod runs on (name and UID), if known.
    pub node: Option<(String, String)>,
    /// `jti`.
    pub id: String,
}

impl IssuedToken {
    /// `system:serviceaccount:<ns>:<name>` in its groups.
    pub fn identity(&self) -> Identity {
        Identity::new(
            &format!(
                "system:serviceaccount:{}:{}",
                self.namespace, self.service_account
            ),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{}", self.namespace),
                "system:authenticated",
            ],
        )
    }

    /// The `user.extra` a TokenReview reports.
    pub fn extra(&self) -> Value {
        let mut extra =
            json!({"authentication.kubernetes.io/credential-id": [format!("JTI={}", self.id)]});
        if let Some((name, uid)) = &self.pod {
            extra["authentication.kubernetes.io/pod-name"] = json!([name]);
            extra["authentication.kubernetes.io/pod-uid"] = json!([uid]);
        }
        if let Some((name, uid)) = &self.node {
            extra["authentication.kubernetes.io/node-name"] = json!([name]);
            extra["authentication.kubernetes.io/node-uid"] = json!([uid]);
        }
        extra
    }
}

/// The service account signing key and the tokens signed with it.
pub struct Signer {
    pub(crate) key: KeyPair,
    kid: String,
    issued: RwLock<HashMap<String, IssuedToken>>,
}

impl Signer {
    /// A fresh P-256 key.
    pub fn new() -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let kid = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(key.subject_public_key_info()));
        Ok(Self {
            key,
            kid,
            issued: RwLock::new(HashMap::new()),
        })
    }

    /// The public key (PEM), what `--service-account-key-file` would hold.
    pub fn public_key_pem(&self) -> String {
        self.key.public_key_pem()
    }

    /// The `kid` header of issued tokens (upstream: base64url of the
    /// SHA-256 of the public key's DER).
    pub fn key_id(&self) -> &str {
        &self.kid
    }

    pub(crate) fn sign(&self, claims: &Value) -> Result<String, TokenError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let der = self.key.sign(signing_input.as_bytes())?;
        let raw = ecdsa_der_to_raw(&der).ok_or(TokenError::Signature)?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(raw)))
    }

    /// The token's claims if the double issued it, it has not expired, its
    /// audience intersects `audiences` and its bound pod still exists.
    /// Returns the intersecting audiences too.
    pub fn authenticate(
        &self,
        token: &str,
        audiences: &[String],
        store: &Store,
    ) -> Option<(IssuedToken, Vec<String>)> {
        let t = self.issued.read().get(token).cloned()?;
        if t.expires <= jiff::Timestamp::now().as_second() {
            return None;
        }
        let common: Vec<String> = audiences
            .iter()
            .filter(|a| t.audiences.contains(a))
            .cloned()
            .collect();
        if common.is_empty() {
            return None;
        }
        let key = |resource: &str, name: &str| Key {
            resource: resource.into(),
            namespace: t.namespace.clone(),
            name: name.into(),
        };
        let uid = |v: &Value| {
            v.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let sa = store.get(&key("serviceaccounts", &t.service_account))?;
        if uid(sa).as_deref() != Some(t.service_account_uid.as_str()) {
            return None;
        }
        if let Some((pod, pod_uid)) = &t.pod {
            let p = store.get(&key("pods", pod))?;
            if uid(p).as_ref() != Some(pod_uid)
                || p.pointer("/metadata/deletionTimestamp").is_some()
            {
                return None;
            }
        }
        Some((t, common))
    }
}

/// A DER `ECDSA-Sig-Value` as the JWS `r || s` of 32 bytes each.
fn ecdsa_der_to_raw(der: &[u8]) -> Option<Vec<u8>> {
    let body = match der {
        [0x30, len, rest @ ..] if usize::from(*len) == rest.len() => rest,
        _ => return None,
    };
    let (r, rest) = der_integer(body)?;
    let (s, rest) = der_integer(rest)?;
    if !rest.is_empty() {
        return None;
    }
    let mut out = vec![0u8; 64];
    for (i, n) in [r, s].into_iter().enumerate() {
        let n = match n.iter().position(|b| *b != 0) {
            Some(p) => &n[p..],
            None => &[],
        };
        if n.len() > 32 {
            return None;
        }
        out[i * 32 + 32 - n.len()..(i + 1) * 32].copy_from_slice(n);
    }
    Some(out)
}

fn der_integer(b: &[u8]) -> Option<(&[u8], &[u8])> {
    match b {
        [0x02, len, rest @ ..] if rest.len() >= usize::from(*len) => {
            Some(rest.split_at(usize::from(*len)))
        }
        _ => None,
    }
}

fn invalid(name: &str, errs: &[FieldError]) -> Response<Body> {
    let code = StatusCode::UNPROCESSABLE_ENTITY;
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("TokenRequest.authentication.k8s.io \"{name}\" is invalid: {}", crate::field::aggregate(errs)),
            "reason": "Invalid",
            "details": {"name": name, "group": "authentication.k8s.io", "kind": "TokenRequest",
                "causes": crate::field::causes(errs)},
            "code": code.as_u16()}),
    )
}

fn forbidden(sa: &str, why: &str) -> Response<Body> {
    status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        &format!("serviceaccounts \"{sa}\" is forbidden: {why}"),
    )
}

fn not_found(resource: &str, name: &str) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{resource} \"{name}\" not found"),
    )
}

/// `POST .../namespaces/{namespace}/serviceaccounts/{name}/token`.
pub(crate) fn create(
    shared: &Shared,
    who: &Identity,
    namespace: &str,
    name: &str,
    body: &[u8],
) -> Response<Body> {
    let Some(mut req) = serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
    else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body must be a JSON object",
        );
    };
    match issue(shared, who, namespace, name, &mut req) {
        Ok(()) => respond(StatusCode::CREATED, &req),
        Err(r) => r,
    }
}

fn issue(
    shared: &Shared,
    who: &Identity,
    namespace: &str,
    name: &str,
    req: &mut Value,
) -> Result<(), Response<Body>> {
    let field = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for (f, want, what) in [
        ("name", name, "name"),
        ("namespace", namespace, "namespace"),
    ] {
        let given = field(req, &format!("/metadata/{f}"));
        if !given.is_empty() && given != want {
            return Err(invalid(
                name,
                &[FieldError::invalid(
                    &format!("metadata.{f}"),
                    given.as_str(),
                    format!("must match the service account {what} if specified"),
                )],
            ));
        }
    }
    let store = shared.store.lock();
    let get = |resource: &str, ns: &str, n: &str| {
        store
            .get(&Key {
                resource: resource.into(),
                namespace: ns.into(),
                name: n.into(),
            })
            .cloned()
    };
    let sa = get("serviceaccounts", namespace, name)
        .ok_or_else(|| not_found("serviceaccounts", name))?;
    // As the node sent them, for NodeRestriction (before defaulting).
    let requested: Vec<String> = req
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    // Defaults: the API audiences, one hour.
    let audiences: Vec<String> = match req.pointer("/spec/audiences").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => shared.options.api_audiences.clone(),
    };
    let expiration = match req.pointer("/spec/expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().unwrap_or(0),
    };
    req["spec"]["audiences"] = json!(audiences);
    req["spec"]["expirationSeconds"] = json!(expiration);
    req["metadata"]["name"] = json!(name);
    req["metadata"]["namespace"] = json!(namespace);
    let now = jiff::Timestamp::now();
    req["metadata"]["creationTimestamp"] = json!(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    req["kind"] = json!("TokenRequest");
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    let mut errs = Vec::new();
    if expiration < MIN_EXPIRATION_SECONDS {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            expiration,
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > 1 << 32 {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            expiration,
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    if !errs.is_empty() {
        return Err(invalid("", &errs));
    }
    let bound = req
        .pointer("/spec/boundObjectRef")
        .filter(|r| r.is_object())
        .cloned();
    let bound_field = |f: &str| {
        bound
            .as_ref()
            .map(|b| field(b, &format!("/{f}")))
            .unwrap_or_default()
    };
    // NodeRestriction: a node's tokens are bound to a pod on that node.
    if let Some(node) = who.node_name() {
        if bound.is_none()
            || bound_field("apiVersion") != "v1"
            || bound_field("kind") != "Pod"
            || bound_field("name").is_empty()
        {
            return Err(forbidden(name, "node requested token not bound to a pod"));
        }
        if bound_field("uid").is_empty() {
            return Err(forbidden(
                name,
                "node requested token with a pod binding without a uid",
            ));
        }
        let pod_name = bound_field("name");
        let pod = get("pods", namespace, &pod_name).ok_or_else(|| not_found("pods", &pod_name))?;
        if field(&pod, "/metadata/uid") != bound_field("uid") {
            return Err(forbidden(
                name,
                &format!(
                    "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                    bound_field("uid")
                ),
            ));
        }
        if field(&pod, "/spec/nodeName") != node {
            return Err(forbidden(
                name,
                "node requested token bound to a pod scheduled on a different node",
            ));
        }
        if shared.options.profile.at_least(33) {
            let rules = &shared.options.access_rules;
            let rbac_allows = |audience: &str| {
                crate::review::rbac_allows(
                    rules,
                    &who.user,
                    &who.groups,
                    "request-serviceaccounts-token-audience",
                    audience,
                    name,
                )
            };
            let r = crate::audience::NodeTokenRequest {
                audiences: &requested,
                pod: &pod,
                node,
                rbac_allows: &rbac_allows,
            };
            crate::audience::check(&r, &get).map_err(|why| forbidden(name, &why))?;
        }
    }
    let mut pod = None;
    let mut node = None;
    if bound.is_some() {
        let (api_version, kind, ref_name) = (
            bound_field("apiVersion"),
            bound_field("kind"),
            bound_field("name"),
        );
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        if !group.is_empty() || kind != "Pod" {
            let version = api_version.rsplit('/').next().unwrap_or("");
            return Err(status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("cannot bind token to object of type {group}/{version}, Kind={kind}"),
            ));
        }
        let p = get("pods", namespace, &ref_name).ok_or_else(|| not_found("pods", &ref_name))?;
        let pod_sa = field(&p, "/spec/serviceAccountName");
        let pod_sa = if pod_sa.is_empty() {
            "default".to_string()
        } else {
            pod_sa
        };
        if pod_sa != name {
            return Err(status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!(
                    "cannot bind token for serviceaccount \"{name}\" to pod running with serviceaccount \"{pod_sa}\""
                ),
            ));
        }
        let uid = field(&p, "/metadata/uid");
        let want = bound_field("uid");
        if !want.is_empty() && want != uid {
            return Err(status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on Pod \"{ref_name}\": the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        let node_name = field(&p, "/spec/nodeName");
        if !node_name.is_empty()
            && let Some(n) = get("nodes", "", &node_name)
        {
            node = Some((node_name, field(&n, "/metadata/uid")));
        }
        pod = Some((ref_name, uid));
    }
    drop(store);
    // Upstream `--service-account-extend-token-expiration` (on by default):
    // a pod-bound token for the API audiences asking for the kubelet's
    // 3607 seconds lives a year, with a `warnafter` at the requested time.
    let api = &shared.options.api_audiences;
    let extended = pod.is_some()
        && expiration == WARN_ONLY_EXPIRATION_SECONDS
        && audiences.iter().all(|a| api.contains(a));
    let lifetime = if extended {
        EXTENDED_EXPIRATION_SECONDS
    } else {
        expiration
    };
    let issued = IssuedToken {
        namespace: namespace.to_string(),
        service_account: name.to_string(),
        service_account_uid: field(&sa, "/metadata/uid"),
        audiences: audiences.clone(),
        expires: now.as_second() + lifetime,
        pod,
        node,
        id: crate::rest::new_uid(),
    };
    let mut k8s = json!({"namespace": namespace,
        "serviceaccount": {"name": name, "uid": issued.service_account_uid}});
    if let Some((n, u)) = &issued.pod {
        k8s["pod"] = json!({"name": n, "uid": u});
    }
    if let Some((n, u)) = &issued.node {
        k8s["node"] = json!({"name": n, "uid": u});
    }
    if extended {
        k8s["warnafter"] = json!(now.as_second() + expiration);
    }
    let claims = json!({
        "iss": shared.options.service_account_issuer,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "aud": audiences,
        "exp": issued.expires,
        "iat": now.as_second(),
        "nbf": now.as_second(),
        "jti": issued.id,
        "kubernetes.io": k8s,
    });
    let token = shared.signer.sign(&claims).map_err(|e| {
        status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            &format!("Internal error occurred: {e}"),
        )
    })?;
    // The status reports the requested lifetime, extended or not.
    let expires = jiff::Timestamp::from_second(now.as_second() + expiration).unwrap_or(now);
    shared.signer.issued.write().insert(token.clone(), issued);
    req["status"] = json!({"token": token,
        "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()});
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_signatures_become_fixed_width() {
        // r has a leading zero (high bit set), s is short.
        let mut der = vec![0x30, 0x00, 0x02, 33, 0x00];
        der.extend([0x80u8; 32]);
        der.extend([0x02, 2, 0x01, 0x02]);
        der[1] = u8::try_from(der.len() - 2).expect("short");
        let raw = ecdsa_der_to_raw(&der).expect("valid");
        assert_eq!(raw.len(), 64);
        assert_eq!(&raw[..32], &[0x80u8; 32]);
        assert_eq!(&raw[32..62], &[0u8; 30]);
        assert_eq!(&raw[62..], &[1, 2]);
        assert!(ecdsa_der_to_raw(&[0x30, 0x01, 0x02]).is_none());
    }
}
