//! Authentication and authorization of the node API (upstream
//! `pkg/kubelet/server/auth.go` `KubeletAuth`, `cmd/kubelet/app/auth.go`
//! `BuildAuth`, and `Server.InstallAuthFilter` in `server.go`).
//!
//! Every request on 10250 is authenticated ([`authn`]: x509 client
//! certificate, then bearer token through TokenReview, then anonymous when
//! enabled), mapped to `nodes/<subresource>` attributes ([`attributes`]) and
//! authorized ([`authz`]: AlwaysAllow or SubjectAccessReview). Failures answer
//! as upstream: `401 Unauthorized`, `403 Forbidden (user=..., verb=...,
//! resource=..., subresource(s)=[...])`, `500 Authorization error (...)`.

pub mod attributes;
pub mod authn;
pub mod authz;
mod cache;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use tokio_util::sync::CancellationToken;

pub use attributes::{Attributes, NodeAttributesGetter};
pub use authn::{Authenticator, ClientCa, KubeTokenReviewer, TokenReviewer};
pub use authz::{AccessReviewer, Authorizer, Decision, KubeAccessReviewer};

/// Deadline of one TokenReview or SubjectAccessReview call (upstream's
/// delegating authenticator and authorizer use 10 s).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts of one review when the apiserver fails transiently (upstream
/// `DefaultAuthWebhookRetryBackoff`: 5 steps from 500 ms, factor 1.5).
const REVIEW_ATTEMPTS: u32 = 5;
const REVIEW_BACKOFF: Duration = Duration::from_millis(500);

/// Whether a failed review is worth repeating (upstream webhook
/// `DefaultShouldRetry`): connection failures, 500 InternalError, 504
/// Timeout and 429 TooManyRequests.
fn should_retry(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 429 | 500 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs one review call with a deadline per attempt, repeating transient
/// failures with backoff. A timed-out attempt is not repeated, so a hung
/// apiserver costs one [`REVIEW_TIMEOUT`].
pub(crate) async fn review_call<T, F, Fut>(
    review: &'static str,
    mut call: F,
) -> Result<T, AuthError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut delay = REVIEW_BACKOFF;
    let mut attempt = 1;
    loop {
        match tokio::time::timeout(REVIEW_TIMEOUT, call()).await {
            Err(_) => return Err(AuthError::ReviewTimeout(review)),
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if attempt < REVIEW_ATTEMPTS && should_retry(&e) => {
                tracing::debug!(review, attempt, error = %e, "review failed; retrying");
                tokio::time::sleep(delay).await;
                delay = delay.mul_f64(1.5);
                attempt += 1;
            }
            Ok(Err(source)) => return Err(AuthError::Review { review, source }),
        }
    }
}

/// An authenticated user (upstream `user.Info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    /// User name.
    pub name: String,
    /// UID, if the authenticator knows one.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (from TokenReview).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Errors of building or running authentication and authorization.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// `clientCAFile` cannot be read or holds no usable certificate.
    #[error("client CA file {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Webhook authentication or authorization without an API client.
    #[error("no client provided, cannot use webhook {0}")]
    NoClient(&'static str),
    /// `authorization.mode` is empty.
    #[error("no authorization mode specified")]
    NoMode,
    /// `authorization.mode` is neither AlwaysAllow nor Webhook.
    #[error("unknown authorization mode {0}")]
    UnknownMode(String),
    /// A review call failed.
    #[error("{review} failed: {source}")]
    Review {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A review call did not answer within [`REVIEW_TIMEOUT`].
    #[error("{0} timed out")]
    ReviewTimeout(&'static str),
    /// The presented client certificate does not verify against the CA.
    #[error("verifying client certificate failed: {0}")]
    Certificate(String),
    /// The token was rejected (upstream `invalid bearer token`).
    #[error("invalid bearer token{}", .0.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    InvalidToken(Option<String>),
}

/// `authentication.x509` of KubeletConfiguration.
#[derive(Debug, Clone, Default)]
pub struct X509Settings {
    /// `clientCAFile`; `None` disables client certificate authentication.
    pub client_ca_file: Option<PathBuf>,
}

/// `authentication.webhook` of KubeletConfiguration.
#[derive(Debug, Clone)]
pub struct WebhookAuthnSettings {
    /// `enabled` (v1beta1 default true).
    pub enabled: bool,
    /// `cacheTTL` (default 2m).
    pub cache_ttl: Duration,
}

impl Default for WebhookAuthnSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_ttl: Duration::from_secs(120),
        }
    }
}

/// `authentication.anonymous` of KubeletConfiguration.
#[derive(Debug, Clone, Default)]
pub struct AnonymousSettings {
    /// `enabled` (v1beta1 default false).
    pub enabled: bool,
}

/// KubeletConfiguration `authentication` (defaults as v1beta1's).
#[derive(Debug, Clone, Default)]
pub struct AuthenticationSettings {
    /// Client certificates.
    pub x509: X509Settings,
    /// Bearer tokens through TokenReview.
    pub webhook: WebhookAuthnSettings,
    /// Anonymous requests.
    pub anonymous: AnonymousSettings,
}

/// `authorization.webhook` of KubeletConfiguration.
#[derive(Debug, Clone)]
pub struct WebhookAuthzSettings {
    /// `cacheAuthorizedTTL` (default 5m).
    pub cache_authorized_ttl: Duration,
    /// `cacheUnauthorizedTTL` (default 30s).
    pub cache_unauthorized_ttl: Duration,
}

impl Default for WebhookAuthzSettings {
    fn default() -> Self {
        Self {
            cache_authorized_ttl: Duration::from_secs(300),
            cache_unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

/// KubeletConfiguration `authorization` (defaults as v1beta1's).
#[derive(Debug, Clone)]
pub struct AuthorizationSettings {
    /// `mode`: `AlwaysAllow` or `Webhook` (default).
    pub mode: String,
    /// Webhook caching.
    pub webhook: WebhookAuthzSettings,
}

impl Default for AuthorizationSettings {
    fn default() -> Self {
        Self {
            mode: "Webhook".into(),
            webhook: WebhookAuthzSettings::default(),
        }
    }
}

/// The node API's request authentication, attributes and authorization
/// (upstream `KubeletAuth`).
pub struct KubeletAuth {
    authenticator: Authenticator,
    attributes: NodeAttributesGetter,
    authorizer: Authorizer,
}

impl KubeletAuth {
    /// Assembles the three parts.
    pub fn new(
        authenticator: Authenticator,
        attributes: NodeAttributesGetter,
        authorizer: Authorizer,
    ) -> Self {
        Self {
            authenticator,
            attributes,
            authorizer,
        }
    }

    /// Upstream `BuildAuth`: the authenticator and authorizer the settings
    /// describe, reviewing through `client` (the kubelet's API client; `None`
    /// in standalone mode, where webhook modes are errors as upstream).
    /// `fine_grained` is the `KubeletFineGrainedAuthz` gate (beta, on by
    /// default in 1.33). Reads `clientCAFile` once; call
    /// [`KubeletAuth::run_ca_reload`] to follow changes.
    pub async fn build(
        node_name: &str,
        client: Option<kube::Client>,
        authn: &AuthenticationSettings,
        authz: &AuthorizationSettings,
        fine_grained: bool,
    ) -> Result<Self, AuthError> {
        let client_ca = match &authn.x509.client_ca_file {
            Some(path) => Some(Arc::new(ClientCa::load(path.clone()).await?)),
            None => None,
        };
        let token: Option<Arc<dyn TokenReviewer>> = if authn.webhook.enabled {
            let c = client
                .clone()
                .ok_or(AuthError::NoClient("authentication"))?;
            Some(Arc::new(KubeTokenReviewer::new(c)))
        } else {
            None
        };
        let authenticator = Authenticator::new(
            client_ca,
            token,
            authn.webhook.cache_ttl,
            authn.anonymous.enabled,
        );
        let authorizer = match authz.mode.as_str() {
            "AlwaysAllow" => Authorizer::AlwaysAllow,
            "Webhook" => {
                let c = client.ok_or(AuthError::NoClient("authorization"))?;
                Authorizer::webhook(
                    Arc::new(KubeAccessReviewer::new(c)),
                    authz.webhook.cache_authorized_ttl,
                    authz.webhook.cache_unauthorized_ttl,
                )
            }
            "" => return Err(AuthError::NoMode),
            other => return Err(AuthError::UnknownMode(other.to_string())),
        };
        Ok(Self::new(
            authenticator,
            NodeAttributesGetter::new(node_name, fine_grained),
            authorizer,
        ))
    }

    /// Follows `clientCAFile` until `stop` fires (upstream's dynamic CA
    /// content); returns at once without one.
    pub async fn run_ca_reload(&self, stop: CancellationToken) {
        if let Some(ca) = self.authenticator.client_ca() {
            ca.run_reload(stop).await;
        }
    }

    /// Authenticates and authorizes one request (upstream's auth filter);
    /// `Err` is the response to send instead of serving it.
    pub async fn check(&self, req: &mut Request) -> Result<UserInfo, Response> {
        let user = match self.authenticator.authenticate(req).await {
            Ok(Some(u)) => u,
            Ok(None) => return Err(plain(StatusCode::UNAUTHORIZED, "Unauthorized".into())),
            Err(e) => {
                tracing::error!(error = %e, "Unable to authenticate the request due to an error");
                return Err(plain(StatusCode::UNAUTHORIZED, "Unauthorized".into()));
            }
        };
        let attrs = self.attributes.get(&user, req.method(), req.uri().path());
        let mut subresources = Vec::with_capacity(attrs.len());
        for a in &attrs {
            subresources.push(a.subresource.clone());
            match self.authorizer.authorize(a).await {
                Ok(Decision::Allow) => return Ok(user),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, user = %a.user.name, verb = %a.verb,
                        resource = %a.resource, subresource = %a.subresource, "Authorization error");
                    return Err(plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!(
                            "Authorization error (user={}, verb={}, resource={}, subresource={})",
                            a.user.name, a.verb, a.resource, a.subresource
                        ),
                    ));
                }
            }
        }
        let Some(first) = attrs.first() else {
            return Err(plain(
                StatusCode::FORBIDDEN,
                "Authorization error: could not determine attributes for request".into(),
            ));
        };
        tracing::debug!(user = %first.user.name, verb = %first.verb, resource = %first.resource,
            subresources = ?subresources, "Forbidden");
        Err(plain(
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden (user={}, verb={}, resource={}, subresource(s)=[{}])\n",
                first.user.name,
                first.verb,
                first.resource,
                subresources.join(" ")
            ),
        ))
    }
}

/// A plain-text error body, as go-restful's `WriteErrorString` sends.
fn plain(code: StatusCode, body: String) -> Response {
    (
        code,
        [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The auth filter as an axum middleware (use with
/// `axum::middleware::from_fn_with_state(auth, middleware)`); the
/// authenticated [`UserInfo`] is put in the request's extensions.
pub async fn middleware(
    State(auth): State<Arc<KubeletAuth>>,
    mut req: Request,
    next: Next,
) -> Response {
    match auth.check(&mut req).await {
        Ok(user) => {
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        Err(resp) => resp,
    }
}

/// Puts `auth` in front of every route of `router`.
pub fn layer(router: Router, auth: Arc<KubeletAuth>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(auth, middleware))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn build_refuses_what_upstream_refuses() {
        let authn = AuthenticationSettings::default();
        let allow = AuthorizationSettings {
            mode: "AlwaysAllow".into(),
            ..AuthorizationSettings::default()
        };
        // Standalone (no API client) with webhook modes, as upstream.
        assert!(matches!(
            KubeletAuth::build("n1", None, &authn, &allow, true).await,
            Err(AuthError::NoClient("authentication"))
        ));
        let no_webhook = AuthenticationSettings {
            webhook: WebhookAuthnSettings {
                enabled: false,
                ..WebhookAuthnSettings::default()
            },
            ..AuthenticationSettings::default()
        };
        assert!(matches!(
            KubeletAuth::build(
                "n1",
                None,
                &no_webhook,
                &AuthorizationSettings::default(),
                true
            )
            .await,
            Err(AuthError::NoClient("authorization"))
        ));
        for (mode, want) in [
            ("", "no authorization mode specified"),
            ("RBAC", "unknown authorization mode RBAC"),
        ] {
            let z = AuthorizationSettings {
                mode: mode.into(),
                ..AuthorizationSettings::default()
            };
            let err = KubeletAuth::build("n1", None, &no_webhook, &z, true)
                .await
                .err()
                .map(|e| e.to_string());
            assert_eq!(err.as_deref(), Some(want));
        }
        assert!(
            KubeletAuth::build("n1", None, &no_webhook, &allow, true)
                .await
                .is_ok()
        );
    }

    #[test]
    fn defaults_are_v1beta1s() {
        let a = AuthenticationSettings::default();
        assert!(!a.anonymous.enabled && a.webhook.enabled && a.x509.client_ca_file.is_none());
        assert_eq!(a.webhook.cache_ttl, Duration::from_secs(120));
        let z = AuthorizationSettings::default();
        assert_eq!(z.mode, "Webhook");
        assert_eq!(z.webhook.cache_authorized_ttl, Duration::from_secs(300));
        assert_eq!(z.webhook.cache_unauthorized_ttl, Duration::from_secs(30));
    }
}
