//! Service-account token mode (upstream `serviceAccountProvider`, KEP-4412,
//! gate `KubeletServiceAccountTokenForCredentialProviders`): a provider
//! whose `tokenAttributes` name an audience is sent a token for the pod's
//! service account, bound to the pod, and the annotations of that service
//! account the config names. The kubelet supplies service accounts and
//! tokens through [`ServiceAccountTokens`].

use std::collections::BTreeMap;
use std::sync::Arc;

use kubelet_runtime::credentialprovider::PullPod;
use sha2::{Digest, Sha256};

use crate::Error;
use crate::config::TokenAttributes;

/// Why the kubelet could not supply a service account or token.
pub type TokenSourceError = Box<dyn std::error::Error + Send + Sync>;

/// What the plugin needs of a service account.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceAccountData {
    /// Its UID.
    pub uid: String,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Service accounts and their tokens, from the kubelet (its token manager).
#[async_trait::async_trait]
pub trait ServiceAccountTokens: Send + Sync {
    /// The service account `namespace/name`.
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ServiceAccountData, TokenSourceError>;

    /// A token for `namespace/service_account` with `audience`, bound to the
    /// pod (`TokenRequest` with a `Pod` bound object reference, the default
    /// expiry).
    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<String, TokenSourceError>;
}

/// How long the kubelet may take for a service account or a token.
pub const TOKEN_SOURCE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The kubelet did not answer within [`TOKEN_SOURCE_DEADLINE`].
#[derive(Debug, thiserror::Error)]
#[error("timed out after {0:?}")]
pub struct TokenSourceTimeout(std::time::Duration);

async fn within<T>(
    f: impl std::future::Future<Output = Result<T, TokenSourceError>>,
) -> Result<T, TokenSourceError> {
    tokio::time::timeout(TOKEN_SOURCE_DEADLINE, f)
        .await
        .unwrap_or_else(|_| Err(Box::new(TokenSourceTimeout(TOKEN_SOURCE_DEADLINE))))
}

/// No token source is wired into the kubelet.
#[derive(Debug, thiserror::Error)]
#[error("no service account token source is configured in this kubelet")]
pub struct NoTokenSource;

/// A provider's token mode.
pub struct ServiceAccountMode {
    attrs: TokenAttributes,
    tokens: Option<Arc<dyn ServiceAccountTokens>>,
}

/// What a pull in token mode sends and caches by.
#[derive(Debug, Default)]
pub struct TokenGrant {
    /// The token.
    pub token: String,
    /// The annotations passed to the plugin.
    pub annotations: BTreeMap<String, String>,
    /// What the cache key gets besides the image, registry or global key.
    pub cache_key: String,
    /// What the single flight key gets besides the image.
    pub flight_key: String,
}

/// Length-prefixed parts, so that no two part lists make the same key.
pub fn key_of<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    parts
        .into_iter()
        .map(|p| format!("{}:{p}", p.len()))
        .collect::<Vec<_>>()
        .join("|")
}

fn sha256_hex(data: &str) -> String {
    if data.is_empty() {
        return String::new();
    }
    let d = Sha256::digest(data.as_bytes());
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl ServiceAccountMode {
    /// Token mode for `attrs` when it names an audience and the gate is on.
    pub fn new(
        attrs: Option<&TokenAttributes>,
        gate: bool,
        tokens: Option<Arc<dyn ServiceAccountTokens>>,
    ) -> Option<Self> {
        let attrs = attrs.filter(|a| gate && !a.service_account_token_audience.is_empty())?;
        Some(Self {
            attrs: attrs.clone(),
            tokens,
        })
    }

    /// Whether a pod without a service account gets no credentials.
    pub fn require_service_account(&self) -> bool {
        self.attrs.require_service_account.unwrap_or(false)
    }

    /// Whether answers are cached per token (`cacheType: Token`), the only
    /// mode in which a plugin may answer with the token as the password.
    pub fn caches_by_token(&self) -> bool {
        self.attrs.cache_type == "Token"
    }

    /// Whether the kubelet can supply tokens.
    pub fn has_token_source(&self) -> bool {
        self.tokens.is_some()
    }

    /// The token, annotations and keys for `pod`'s service account (upstream
    /// `getServiceAccountData`, `getServiceAccountToken`).
    pub async fn grant(&self, pod: &PullPod) -> Result<TokenGrant, Error> {
        let (ns, sa) = (&pod.namespace, &pod.service_account_name);
        let Some(tokens) = &self.tokens else {
            return Err(Error::Token {
                namespace: ns.clone(),
                name: sa.clone(),
                source: Box::new(NoTokenSource),
            });
        };
        let data = within(tokens.service_account(ns, sa))
            .await
            .map_err(|source| Error::ServiceAccount {
                namespace: ns.clone(),
                name: sa.clone(),
                source,
            })?;
        let mut annotations = BTreeMap::new();
        for k in &self.attrs.required_service_account_annotation_keys {
            let v = data
                .annotations
                .get(k)
                .ok_or_else(|| Error::RequiredAnnotation(k.clone()))?;
            annotations.insert(k.clone(), v.clone());
        }
        for k in &self.attrs.optional_service_account_annotation_keys {
            if let Some(v) = data.annotations.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let audience = &self.attrs.service_account_token_audience;
        let token = within(tokens.token(ns, sa, audience, &pod.name, &pod.uid))
            .await
            .map_err(|source| Error::Token {
                namespace: ns.clone(),
                name: sa.clone(),
                source,
            })?;
        let token_hash = sha256_hex(&token);
        let annotation_parts = annotations
            .iter()
            .flat_map(|(k, v)| [k.as_str(), v.as_str()]);
        let mut cache_parts: Vec<&str> = vec![ns, sa, &data.uid];
        cache_parts.extend(annotation_parts.clone());
        // The `Token` cache type keeps an answer only for the token it was
        // given; `ServiceAccount` for the service account as a whole.
        if self.caches_by_token() {
            cache_parts.push(&token_hash);
        }
        let cache_key = key_of(cache_parts);
        let mut flight_parts: Vec<&str> = vec![&token_hash];
        flight_parts.extend(annotation_parts);
        let flight_key = key_of(flight_parts);
        Ok(TokenGrant {
            token,
            annotations,
            cache_key,
            flight_key,
        })
    }
}
