//! Request authorization (upstream `cmd/kubelet/app/auth.go` `BuildAuthz`):
//! `AlwaysAllow`, or `Webhook`, a SubjectAccessReview
//! (`authorization.k8s.io/v1`) per distinct attributes, as upstream
//! `plugin/pkg/authorizer/webhook`: `status.allowed` allows,
//! `status.denied` denies, anything else is no opinion; allowed results are
//! cached for `cacheAuthorizedTTL`, the others for `cacheUnauthorizedTTL`,
//! keyed by the whole review spec. Failed reviews are not cached.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::cache::TtlCache;
use super::{Attributes, AuthError, review_call};

/// An authorizer's answer (upstream `authorizer.Decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Explicitly denied.
    Deny,
    /// Neither: not allowed.
    NoOpinion,
}

/// Reviews attributes (the SubjectAccessReview seam).
#[async_trait::async_trait]
pub trait AccessReviewer: Send + Sync + 'static {
    /// The decision for `spec`.
    async fn review(&self, spec: &SubjectAccessReviewSpec) -> Result<Decision, AuthError>;
}

/// SubjectAccessReview through the apiserver.
pub struct KubeAccessReviewer {
    api: Api<SubjectAccessReview>,
}

impl KubeAccessReviewer {
    /// Reviews through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }
}

#[async_trait::async_trait]
impl AccessReviewer for KubeAccessReviewer {
    async fn review(&self, spec: &SubjectAccessReviewSpec) -> Result<Decision, AuthError> {
        let sar = SubjectAccessReview {
            spec: spec.clone(),
            ..SubjectAccessReview::default()
        };
        let pp = PostParams::default();
        let out = review_call("SubjectAccessReview", || self.api.create(&pp, &sar)).await?;
        let status = out.status.unwrap_or_default();
        Ok(if status.allowed {
            Decision::Allow
        } else if status.denied.unwrap_or(false) {
            Decision::Deny
        } else {
            Decision::NoOpinion
        })
    }
}

/// The authorizer `authorization.mode` selects.
pub enum Authorizer {
    /// Every request is allowed.
    AlwaysAllow,
    /// SubjectAccessReview with caching.
    Webhook(WebhookAuthorizer),
}

/// The webhook authorizer and its cache.
pub struct WebhookAuthorizer {
    reviewer: Arc<dyn AccessReviewer>,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    cache: TtlCache<String, Decision>,
}

/// The review spec of one set of attributes (upstream webhook authorizer's
/// `Authorize`).
pub fn review_spec(a: &Attributes) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        user: Some(a.user.name.clone()),
        uid: (!a.user.uid.is_empty()).then(|| a.user.uid.clone()),
        groups: Some(a.user.groups.clone()),
        extra: (!a.user.extra.is_empty()).then(|| a.user.extra.clone().into_iter().collect()),
        resource_attributes: Some(ResourceAttributes {
            namespace: Some(String::new()),
            verb: Some(a.verb.clone()),
            group: Some(String::new()),
            version: Some(a.api_version.clone()),
            resource: Some(a.resource.clone()),
            subresource: Some(a.subresource.clone()),
            name: Some(a.name.clone()),
            ..ResourceAttributes::default()
        }),
        non_resource_attributes: None,
    }
}

impl Authorizer {
    /// A webhook authorizer over `reviewer`.
    pub fn webhook(
        reviewer: Arc<dyn AccessReviewer>,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> Self {
        Self::Webhook(WebhookAuthorizer {
            reviewer,
            authorized_ttl,
            unauthorized_ttl,
            cache: TtlCache::new(),
        })
    }

    /// The decision for `a`.
    pub async fn authorize(&self, a: &Attributes) -> Result<Decision, AuthError> {
        let w = match self {
            Self::AlwaysAllow => return Ok(Decision::Allow),
            Self::Webhook(w) => w,
        };
        let spec = review_spec(a);
        // Serialising a spec of strings cannot fail; an empty key would only
        // mean no caching.
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if !key.is_empty()
            && let Some(d) = w.cache.get(&key)
        {
            return Ok(d);
        }
        let d = w.reviewer.review(&spec).await?;
        if !key.is_empty() {
            let ttl = if d == Decision::Allow {
                w.authorized_ttl
            } else {
                w.unauthorized_ttl
            };
            w.cache.insert(key, d, ttl);
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{NodeAttributesGetter, UserInfo};
    use parking_lot::Mutex;

    struct Fake {
        calls: Mutex<Vec<SubjectAccessReviewSpec>>,
    }

    #[async_trait::async_trait]
    impl AccessReviewer for Fake {
        async fn review(&self, spec: &SubjectAccessReviewSpec) -> Result<Decision, AuthError> {
            self.calls.lock().push(spec.clone());
            let sub = spec
                .resource_attributes
                .as_ref()
                .and_then(|r| r.subresource.clone())
                .unwrap_or_default();
            Ok(if sub == "stats" {
                Decision::Allow
            } else {
                Decision::NoOpinion
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_are_cached_for_their_ttls() {
        let f = Arc::new(Fake {
            calls: Mutex::new(vec![]),
        });
        let z = Authorizer::webhook(f.clone(), Duration::from_secs(300), Duration::from_secs(30));
        let user = UserInfo {
            name: "alice".into(),
            groups: vec!["system:authenticated".into()],
            ..UserInfo::default()
        };
        let g = NodeAttributesGetter::new("n1", false);
        let stats = &g.get(&user, &http::Method::GET, "/stats/summary")[0];
        let exec = &g.get(&user, &http::Method::POST, "/exec/ns/p/c")[0];
        assert_eq!(z.authorize(stats).await.expect("ok"), Decision::Allow);
        assert_eq!(z.authorize(exec).await.expect("ok"), Decision::NoOpinion);
        assert_eq!(z.authorize(stats).await.expect("ok"), Decision::Allow);
        assert_eq!(z.authorize(exec).await.expect("ok"), Decision::NoOpinion);
        assert_eq!(f.calls.lock().len(), 2);
        let ra = f.calls.lock()[1]
            .resource_attributes
            .clone()
            .expect("resource");
        assert_eq!(
            (
                ra.verb.as_deref(),
                ra.resource.as_deref(),
                ra.subresource.as_deref(),
                ra.name.as_deref()
            ),
            (Some("create"), Some("nodes"), Some("proxy"), Some("n1"))
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        z.authorize(stats).await.expect("ok");
        z.authorize(exec).await.expect("ok");
        assert_eq!(f.calls.lock().len(), 3, "only the denial expired");
        tokio::time::advance(Duration::from_secs(270)).await;
        z.authorize(stats).await.expect("ok");
        assert_eq!(f.calls.lock().len(), 4);
    }
}
