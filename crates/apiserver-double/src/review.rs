//! The review APIs a kubelet delegates to: `authentication.k8s.io/v1`
//! `tokenreviews` (upstream `pkg/registry/authentication/tokenreview`) and
//! `authorization.k8s.io/v1` `subjectaccessreviews` (upstream
//! `pkg/registry/authorization/subjectaccessreview`), create-only resources
//! that store nothing and answer with the posted object plus its `status`.
//!
//! Tokens come from the double's token table ([`crate::Options::tokens`] and
//! the bootstrap token) and the service account tokens it issued
//! ([`crate::token`]). Access is decided like the apiserver's authorizer
//! chain with RBAC: `system:masters` may do anything, otherwise an
//! [`AccessRule`] (a ClusterRoleBinding of a ClusterRole, folded into one
//! value) must match; no match is "no opinion", i.e. `allowed: false`.
//! Every review is a request in [`crate::ApiServer::requests`], so tests can
//! count them.

// Reviews return a ready HTTP response as their error, as the REST layer does.
#![allow(clippy::result_large_err)]

use serde_json::{Value, json};

use crate::Shared;
use crate::rest::{Body, Kind, status};
use http::{Response, StatusCode};

/// Whom a rule binds (an RBAC subject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A user by name.
    User(String),
    /// Every member of a group.
    Group(String),
}

/// One grant: a ClusterRole rule bound to a subject by a ClusterRoleBinding.
#[derive(Debug, Clone)]
pub struct AccessRule {
    /// The binding's name (shown in the allow reason).
    pub name: String,
    /// Who is granted.
    pub subject: Subject,
    /// Verbs (`get`, `create`, ...; `*` for all).
    pub verbs: Vec<String>,
    /// Resources as RBAC writes them: `nodes/proxy`, `nodes/stats`, `nodes`
    /// (no subresource), `nodes/*`, `*`.
    pub resources: Vec<String>,
    /// `resourceNames`; empty means any name.
    pub resource_names: Vec<String>,
}

impl AccessRule {
    /// A rule for `subject` with `verbs` on `resources`, any name.
    pub fn new(subject: Subject, verbs: &[&str], resources: &[&str]) -> Self {
        let name = match &subject {
            Subject::User(u) => format!("rule-user-{u}"),
            Subject::Group(g) => format!("rule-group-{g}"),
        };
        Self {
            name,
            subject,
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            resources: resources.iter().map(|r| r.to_string()).collect(),
            resource_names: Vec::new(),
        }
    }

    fn binds(&self, user: &str, groups: &[String]) -> bool {
        match &self.subject {
            Subject::User(u) => u == user,
            Subject::Group(g) => groups.iter().any(|x| x == g),
        }
    }

    fn covers(&self, verb: &str, resource: &str, subresource: &str, name: &str) -> bool {
        let verb_ok = self.verbs.iter().any(|v| v == "*" || v == verb);
        let combined = if subresource.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{subresource}")
        };
        let resource_ok = self.resources.iter().any(|r| {
            r == "*" || *r == combined || (!subresource.is_empty() && *r == format!("{resource}/*"))
        });
        let name_ok = self.resource_names.is_empty()
            || (!name.is_empty() && self.resource_names.iter().any(|n| n == name));
        verb_ok && resource_ok && name_ok
    }
}

/// Whether `rules` grant `user` (in `groups`) `verb` on the core-group
/// `resource` named `name` (RBAC as the double models it).
pub(crate) fn rbac_allows(
    rules: &[AccessRule],
    user: &str,
    groups: &[String],
    verb: &str,
    resource: &str,
    name: &str,
) -> bool {
    rules
        .iter()
        .any(|r| r.binds(user, groups) && r.covers(verb, resource, "", name))
}

/// Whether `resource` is one of the review resources served here.
pub(crate) fn is_review(resource: &str) -> bool {
    matches!(resource, "tokenreviews" | "subjectaccessreviews")
}

/// Serves a request to a review resource: `create` only, as upstream
/// (the resources implement `rest.Creater` alone).
pub(crate) fn serve(shared: &Shared, kind: Kind, verb: &str, body: &[u8]) -> Response<Body> {
    if verb != "create" {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        );
    }
    let Some(mut obj) = serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
    else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body must be a JSON object",
        );
    };
    let result = match kind.resource {
        "tokenreviews" => token_review(shared, &obj),
        _ => access_review(shared, &obj),
    };
    match result {
        Ok(st) => {
            obj["status"] = st;
            obj["kind"] = json!(kind.kind);
            obj["apiVersion"] = json!(kind.api_version);
            if obj.get("metadata").is_none_or(|m| !m.is_object()) {
                obj["metadata"] = json!({});
            }
            let mut r = Response::new(http_body_util::BodyExt::boxed(http_body_util::Full::new(
                bytes::Bytes::from(obj.to_string()),
            )));
            *r.status_mut() = StatusCode::CREATED;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(r) => r,
    }
}

fn token_review(shared: &Shared, obj: &Value) -> Result<Value, Response<Body>> {
    let token = obj
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("");
    if token.is_empty() {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "token is required for TokenReview in authentication",
        ));
    }
    let requested: Vec<String> = obj
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if let Some(u) = shared.tokens.read().get(token) {
        return Ok(json!({
            "authenticated": true,
            "user": {"username": u.user, "uid": format!("uid-{}", u.user), "groups": u.groups},
            "audiences": requested,
        }));
    }
    // Service account tokens must be for the requested audiences, or for
    // the API audiences when none are requested.
    let wanted = if requested.is_empty() {
        &shared.options.api_audiences
    } else {
        &requested
    };
    let store = shared.store.lock();
    Ok(match shared.signer.authenticate(token, wanted, &store) {
        Some((t, audiences)) => {
            let who = t.identity();
            json!({
                "authenticated": true,
                "user": {"username": who.user, "uid": t.service_account_uid,
                    "groups": who.groups, "extra": t.extra()},
                "audiences": audiences,
            })
        }
        None => json!({"authenticated": false, "user": {}}),
    })
}

fn invalid_sar(msg: &str) -> Response<Body> {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {msg}"),
    )
}

fn access_review(shared: &Shared, obj: &Value) -> Result<Value, Response<Body>> {
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    // Upstream ValidateSubjectAccessReviewSpec.
    match (resource, non_resource) {
        (Some(_), Some(_)) => {
            return Err(invalid_sar(
                "spec.nonResourceAttributes: Invalid value: \"\": cannot be specified in combination with resourceAttributes",
            ));
        }
        (None, None) => {
            return Err(invalid_sar(
                "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
        _ => {}
    }
    if user.is_empty() && groups.is_empty() {
        return Err(invalid_sar(
            "spec.user: Invalid value: \"\": at least one of user or group must be specified",
        ));
    }
    if groups.iter().any(|g| g == "system:masters") {
        return Ok(json!({"allowed": true}));
    }
    let Some(attrs) = resource else {
        return Ok(json!({"allowed": false}));
    };
    let field = |k: &str| attrs.get(k).and_then(Value::as_str).unwrap_or("");
    if !field("group").is_empty() {
        // The double's rules grant core-group resources only.
        return Ok(json!({"allowed": false}));
    }
    let rules = &shared.options.access_rules;
    let hit = rules.iter().find(|r| {
        r.binds(user, &groups)
            && r.covers(
                field("verb"),
                field("resource"),
                field("subresource"),
                field("name"),
            )
    });
    Ok(match hit {
        Some(r) => json!({
            "allowed": true,
            "reason": format!(
                "RBAC: allowed by ClusterRoleBinding \"{}\" of ClusterRole \"{}\" to {}",
                r.name,
                r.name,
                match &r.subject {
                    Subject::User(u) => format!("User \"{u}\""),
                    Subject::Group(g) => format!("Group \"{g}\""),
                }
            ),
        }),
        None => json!({"allowed": false}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_like_rbac() {
        let mut r = AccessRule::new(
            Subject::Group("readers".into()),
            &["get"],
            &["nodes/stats", "nodes/metrics"],
        );
        let g = vec!["readers".to_string()];
        assert!(r.binds("alice", &g));
        assert!(!r.binds("alice", &[]));
        assert!(r.covers("get", "nodes", "stats", "n1"));
        assert!(!r.covers("create", "nodes", "stats", "n1"));
        assert!(!r.covers("get", "nodes", "proxy", "n1"));
        assert!(!r.covers("get", "nodes", "", "n1"));
        r.resource_names = vec!["n2".into()];
        assert!(!r.covers("get", "nodes", "stats", "n1"));
        assert!(r.covers("get", "nodes", "stats", "n2"));
        let all = AccessRule::new(Subject::User("bob".into()), &["*"], &["nodes/*"]);
        assert!(all.covers("delete", "nodes", "proxy", "x"));
        assert!(!all.covers("get", "nodes", "", "x"));
    }

    async fn answer(shared: &Shared, resource: &str, verb: &str, body: Value) -> (u16, Value) {
        let kind = crate::rest::kind(resource).expect("kind");
        let r = serve(shared, kind, verb, body.to_string().as_bytes());
        let code = r.status().as_u16();
        let bytes = http_body_util::BodyExt::collect(r.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn reviews_answer_as_the_apiserver_does() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = crate::ApiServer::start(crate::Options {
            tokens: std::collections::HashMap::from([(
                "t1".to_string(),
                crate::Identity::new("alice", &["devs"]),
            )]),
            access_rules: vec![AccessRule::new(
                Subject::Group("devs".into()),
                &["get"],
                &["nodes/stats"],
            )],
            ..crate::Options::default()
        })
        .await
        .expect("double");
        let shared = api.shared.as_ref();
        let (code, v) = answer(shared, "tokenreviews", "create",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "t1"}})).await;
        assert_eq!(code, 201);
        assert_eq!(v["status"]["authenticated"], json!(true));
        assert_eq!(v["status"]["user"]["username"], json!("alice"));
        assert_eq!(
            v["status"]["user"]["groups"],
            json!(["devs", "system:authenticated"])
        );
        assert_eq!(v["spec"]["token"], json!("t1"));
        let (_, v) = answer(
            shared,
            "tokenreviews",
            "create",
            json!({"spec": {"token": "nope"}}),
        )
        .await;
        assert_eq!(v["status"]["authenticated"], json!(false));
        let (code, v) = answer(shared, "tokenreviews", "create", json!({"spec": {}})).await;
        assert_eq!((code, v["reason"].clone()), (400, json!("BadRequest")));
        let (code, _) = answer(shared, "tokenreviews", "list", json!({})).await;
        assert_eq!(code, 405);

        let sar = |user: &str, groups: Value, sub: &str| {
            json!({"spec": {"user": user, "groups": groups, "resourceAttributes":
                {"verb": "get", "resource": "nodes", "subresource": sub, "name": "n1", "version": "v1"}}})
        };
        let (code, v) = answer(
            shared,
            "subjectaccessreviews",
            "create",
            sar("alice", json!(["devs"]), "stats"),
        )
        .await;
        assert_eq!(code, 201);
        assert_eq!(v["kind"], json!("SubjectAccessReview"));
        assert_eq!(v["status"]["allowed"], json!(true));
        let (_, v) = answer(
            shared,
            "subjectaccessreviews",
            "create",
            sar("alice", json!(["devs"]), "proxy"),
        )
        .await;
        assert_eq!(v["status"]["allowed"], json!(false));
        let (_, v) = answer(
            shared,
            "subjectaccessreviews",
            "create",
            sar("root", json!(["system:masters"]), "proxy"),
        )
        .await;
        assert_eq!(v["status"]["allowed"], json!(true));
        let (code, _) = answer(
            shared,
            "subjectaccessreviews",
            "create",
            sar("", json!([]), "stats"),
        )
        .await;
        assert_eq!(code, 422);
        let (code, _) = answer(
            shared,
            "subjectaccessreviews",
            "create",
            json!({"spec": {"user": "a"}}),
        )
        .await;
        assert_eq!(code, 422);
    }
}
