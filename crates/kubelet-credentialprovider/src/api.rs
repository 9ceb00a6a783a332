//! The plugin exchange (upstream `k8s.io/kubelet/pkg/apis/credentialprovider`
//! v1, v1beta1, v1alpha1): a `CredentialProviderRequest` on the plugin's
//! stdin, a `CredentialProviderResponse` on its stdout, both JSON in the
//! provider's apiVersion. Only v1 requests carry a service account token
//! and annotations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::PLUGIN_API_V1;
use crate::duration::{self, Nanos};

/// The request's kind.
pub const REQUEST_KIND: &str = "CredentialProviderRequest";
/// The response's kind.
pub const RESPONSE_KIND: &str = "CredentialProviderResponse";
/// The plugin API group.
pub const GROUP: &str = "credentialprovider.kubelet.k8s.io";

/// What the plugin is asked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialProviderRequest {
    /// The provider's apiVersion.
    pub api_version: String,
    /// Always [`REQUEST_KIND`].
    pub kind: String,
    /// The repository being pulled (no tag or digest).
    pub image: String,
    /// A token for the pod's service account (v1, token mode).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub service_account_token: String,
    /// The service account's annotations the config names (v1, token mode).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub service_account_annotations: BTreeMap<String, String>,
}

impl CredentialProviderRequest {
    /// The request for `image` in `api_version`; the token and annotations
    /// are dropped for versions before v1, as upstream's conversion does.
    pub fn new(
        api_version: &str,
        image: &str,
        token: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Self {
        let v1 = api_version == PLUGIN_API_V1;
        Self {
            api_version: api_version.into(),
            kind: REQUEST_KIND.into(),
            image: image.into(),
            service_account_token: if v1 { token.into() } else { String::new() },
            service_account_annotations: if v1 {
                annotations.clone()
            } else {
                BTreeMap::new()
            },
        }
    }
}

/// What a cached answer is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKeyType {
    /// The image asked for.
    Image,
    /// The image's registry host (and port).
    Registry,
    /// Every image the provider matches.
    Global,
}

/// The plugin's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialProviderResponse {
    /// What the answer is cached by; `Err` holds an invalid value.
    pub cache_key_type: Result<CacheKeyType, String>,
    /// How long to cache it: `None` for the provider's default, `Some(0)`
    /// for not at all.
    pub cache_duration: Option<Nanos>,
    /// Credentials per registry location (globs allowed, as `matchImages`).
    pub auth: BTreeMap<String, AuthConfig>,
}

/// One location's credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct AuthConfig {
    /// User name.
    #[serde(default)]
    pub username: String,
    /// Password.
    #[serde(default)]
    pub password: String,
}

/// A response as a plugin writes it; fields this kubelet does not know are
/// ignored, as upstream's (non-strict) decoder ignores them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    #[serde(default)]
    #[allow(dead_code)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default)]
    cache_duration: Option<String>,
    #[serde(default)]
    auth: Option<BTreeMap<String, AuthConfig>>,
}

/// The apiVersion and kind of a JSON document (upstream
/// `DefaultMetaFactory.Interpret`).
pub fn interpret(data: &[u8]) -> Result<(String, String), String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TypeMeta {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
    }
    let t: TypeMeta = serde_json::from_slice(data).map_err(|e| e.to_string())?;
    Ok((t.api_version, t.kind))
}

/// Decodes a response as upstream's decoder does (unknown fields ignored,
/// known ones typed); `None` when it is no valid response (the reason is
/// not given: the document may hold credentials).
pub fn decode_response(data: &[u8]) -> Option<CredentialProviderResponse> {
    let w: WireResponse = serde_json::from_slice(data).ok()?;
    if w.kind != RESPONSE_KIND {
        return None;
    }
    let cache_duration = match w.cache_duration {
        None => None,
        Some(d) => Some(duration::parse(&d).ok()?),
    };
    let cache_key_type = match w.cache_key_type.as_str() {
        "Image" => Ok(CacheKeyType::Image),
        "Registry" => Ok(CacheKeyType::Registry),
        "Global" => Ok(CacheKeyType::Global),
        other => Err(other.to_string()),
    };
    Some(CredentialProviderResponse {
        cache_key_type,
        cache_duration,
        auth: w.auth.unwrap_or_default(),
    })
}
