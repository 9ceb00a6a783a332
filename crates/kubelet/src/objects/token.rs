//! Service-account tokens for pods (upstream `pkg/kubelet/token/token_manager.go`):
//! tokens from the TokenRequest API (`POST
//! /api/v1/namespaces/{ns}/serviceaccounts/{sa}/token`), bound to the pod,
//! cached by request and reused until they need a refresh: past 80% of their
//! lifetime or 24 hours after issue (minus up to 10 s of jitter), or when the
//! clock says they were issued in the future. A failed refresh keeps serving
//! the old token while it is valid. Expired tokens are dropped every minute;
//! a removed pod's tokens at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest as ApiTokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};
use kubelet_client::clock::Clock;
use kubelet_volume::host::TokenRequest;
use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error};

use super::{ObjectError, object_error, with_deadline};

/// Tokens are refreshed at the latest this long after issue (upstream `maxTTL`).
const MAX_TTL: SignedDuration = SignedDuration::from_hours(24);
/// How often expired tokens are dropped (upstream `gcPeriod`).
const GC_PERIOD: Duration = Duration::from_secs(60);
/// Refreshes start up to this much early, at random (upstream `maxJitter`).
const MAX_JITTER_SECONDS: f64 = 10.0;

/// Where tokens come from: the TokenRequest API, or a fake in tests.
#[async_trait::async_trait]
pub trait TokenSource: Send + Sync + 'static {
    /// Creates a token for `service_account` in `namespace` (upstream
    /// `CreateToken`), returning the answered TokenRequest.
    async fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        req: &ApiTokenRequest,
    ) -> Result<ApiTokenRequest, ObjectError>;
}

/// The TokenRequest API of the apiserver.
pub struct ApiTokenSource {
    client: Client,
    /// Whether the apiserver serves `serviceaccounts/token` (asked once, on
    /// the first 404).
    supported: OnceCell<bool>,
}

impl ApiTokenSource {
    /// Requests tokens through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            supported: OnceCell::new(),
        }
    }

    /// Whether `v1` discovery lists `serviceaccounts/token`; a failed
    /// discovery is not remembered.
    async fn token_requests_supported(&self) -> bool {
        let ask = || async {
            let list = with_deadline("discover /api/v1", async {
                self.client
                    .list_core_api_resources("v1")
                    .await
                    .map_err(|e| ObjectError::Other(e.to_string()))
            })
            .await?;
            Ok::<_, ObjectError>(
                list.resources
                    .iter()
                    .any(|r| r.name == "serviceaccounts/token"),
            )
        };
        match self.supported.get_or_try_init(ask).await {
            Ok(s) => *s,
            Err(e) => {
                debug!(error = %e, "Cannot tell whether the apiserver serves TokenRequest");
                false
            }
        }
    }
}

#[async_trait::async_trait]
impl TokenSource for ApiTokenSource {
    async fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        req: &ApiTokenRequest,
    ) -> Result<ApiTokenRequest, ObjectError> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("create token for serviceaccount {namespace}/{service_account}");
        let r = with_deadline(what, async {
            api.create_subresource("token", service_account, &PostParams::default(), req)
                .await
                .map_err(|e| object_error("serviceaccounts", service_account, e))
        })
        .await;
        match r {
            Err(e) if e.is_not_found() && !self.token_requests_supported().await => {
                Err(ObjectError::Other(
                    "the API server does not have TokenRequest endpoints enabled".into(),
                ))
            }
            r => r,
        }
    }
}

/// No apiserver: every request fails (upstream's nil client).
struct Standalone;

#[async_trait::async_trait]
impl TokenSource for Standalone {
    async fn create_token(
        &self,
        _: &str,
        _: &str,
        _: &ApiTokenRequest,
    ) -> Result<ApiTokenRequest, ObjectError> {
        Err(ObjectError::Other(
            "cannot use TokenManager when kubelet is in standalone mode".into(),
        ))
    }
}

/// A token the apiserver issued.
#[derive(Clone)]
struct Cached {
    token: String,
    expiration: Timestamp,
    /// `spec.expirationSeconds` of the answer (the apiserver may change it).
    expiration_seconds: Option<i64>,
    pod_uid: String,
}

impl Cached {
    fn from_answer(req: &TokenRequest, answer: ApiTokenRequest) -> Result<Self, ObjectError> {
        let status = answer.status.ok_or_else(|| {
            ObjectError::Other("the TokenRequest answer has no status".to_string())
        })?;
        Ok(Self {
            token: status.token,
            expiration: status.expiration_timestamp.0,
            expiration_seconds: answer.spec.expiration_seconds,
            pod_uid: req.pod_uid.clone(),
        })
    }
}

struct Inner {
    source: Arc<dyn TokenSource>,
    clock: Arc<dyn Clock>,
    cache: Mutex<HashMap<TokenRequest, Cached>>,
}

/// Service-account tokens of the node's pods (upstream `token.Manager`).
/// Cheap to clone.
#[derive(Clone)]
pub struct TokenManager {
    inner: Arc<Inner>,
}

impl TokenManager {
    /// Tokens through `client` (`None`: standalone, every request fails);
    /// expired tokens are dropped every minute on `tasks` until `stop`.
    pub fn new(
        client: Option<Client>,
        clock: Arc<dyn Clock>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> Self {
        let source: Arc<dyn TokenSource> = match client {
            Some(c) => Arc::new(ApiTokenSource::new(c)),
            None => Arc::new(Standalone),
        };
        Self::with_source(source, clock, tasks, stop)
    }

    /// Tokens from `source`.
    pub fn with_source(
        source: Arc<dyn TokenSource>,
        clock: Arc<dyn Clock>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> Self {
        let inner = Arc::new(Inner {
            source,
            clock,
            cache: Mutex::new(HashMap::new()),
        });
        let gc = inner.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + GC_PERIOD, GC_PERIOD);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => gc.cleanup(),
                }
            }
        });
        Self { inner }
    }

    /// A token for `req` (upstream `GetServiceAccountToken`): the cached one
    /// unless it needs a refresh; else a new one; if that fails, the cached
    /// one while it has not expired.
    pub async fn get_service_account_token(
        &self,
        req: &TokenRequest,
    ) -> Result<String, ObjectError> {
        let cached = self.inner.cache.lock().get(req).cloned();
        if let Some(c) = &cached
            && !self.inner.requires_refresh(req, c)
        {
            return Ok(c.token.clone());
        }
        let what = format!(
            "create token for serviceaccount {}/{}",
            req.namespace, req.service_account
        );
        let fetched = with_deadline(
            what,
            self.inner
                .source
                .create_token(&req.namespace, &req.service_account, &api_request(req)),
        )
        .await
        .and_then(|answer| Cached::from_answer(req, answer));
        match (fetched, cached) {
            (Ok(new), _) => {
                let token = new.token.clone();
                self.inner.cache.lock().insert(req.clone(), new);
                Ok(token)
            }
            (Err(e), None) => Err(ObjectError::Other(format!("failed to fetch token: {e}"))),
            (Err(e), Some(old)) if self.inner.expired(&old) => Err(ObjectError::Other(format!(
                "token {} expired and refresh failed: {e}",
                cache_key(req)
            ))),
            (Err(e), Some(old)) => {
                error!(error = %e, cache_key = %cache_key(req), "Couldn't update token");
                Ok(old.token)
            }
        }
    }

    /// Forgets every token bound to the pod `pod_uid` (upstream
    /// `DeleteServiceAccountToken`, when the pod is removed).
    pub fn delete_service_account_token(&self, pod_uid: &str) {
        self.inner.cache.lock().retain(|_, c| c.pod_uid != pod_uid);
    }

    /// Number of cached tokens.
    pub fn len(&self) -> usize {
        self.inner.cache.lock().len()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn cleanup(&self) {
        let now = self.clock.now();
        self.cache.lock().retain(|_, c| now <= c.expiration);
    }

    fn expired(&self, c: &Cached) -> bool {
        self.clock.now() > c.expiration
    }

    /// Upstream `requiresRefresh`: older than 24 h, within 20% of its
    /// lifetime of expiring (both minus jitter), or issued in the future.
    fn requires_refresh(&self, req: &TokenRequest, c: &Cached) -> bool {
        let Some(seconds) = c.expiration_seconds else {
            error!(cache_key = %cache_key(req), "Expiration seconds was nil for token request");
            return false;
        };
        let now = self.clock.now();
        let ttl = SignedDuration::from_secs(seconds);
        let Ok(iat) = c.expiration.checked_sub(ttl) else {
            return true;
        };
        // Whole seconds, as upstream.
        let jitter = SignedDuration::from_secs((rand::random::<f64>() * MAX_JITTER_SECONDS) as i64);
        let after = |t: Result<Timestamp, jiff::Error>| t.is_ok_and(|t| now > t);
        if after(iat.checked_add(MAX_TTL - jitter)) {
            return true;
        }
        let margin = SignedDuration::from_secs(seconds * 20 / 100);
        if after(c.expiration.checked_sub(margin + jitter)) {
            return true;
        }
        now < iat
    }
}

/// The TokenRequest the kubelet sends for `req` (audiences, expiration, bound
/// to the pod).
fn api_request(req: &TokenRequest) -> ApiTokenRequest {
    ApiTokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences(req),
            expiration_seconds: Some(req.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(req.pod_name.clone()),
                uid: Some(req.pod_uid.clone()),
            }),
        },
        ..Default::default()
    }
}

fn audiences(req: &TokenRequest) -> Vec<String> {
    if req.audience.is_empty() {
        vec![]
    } else {
        vec![req.audience.clone()]
    }
}

/// Upstream's cache key as it logs it (nonconfidential).
fn cache_key(req: &TokenRequest) -> String {
    let auds = if req.audience.is_empty() {
        "[]string(nil)".to_string()
    } else {
        format!("[]string{{{:?}}}", req.audience)
    };
    format!(
        "{:?}/{:?}/{auds}/{}/v1.BoundObjectReference{{Kind:\"Pod\", APIVersion:\"v1\", Name:{:?}, UID:{:?}}}",
        req.service_account, req.namespace, req.expiration_seconds, req.pod_name, req.pod_uid
    )
}

#[cfg(test)]
#[path = "token_tests.rs"]
mod tests;
