//! One registered plugin (upstream `pluginProvider.provide`): images its
//! `matchImages` do not match get nothing; otherwise a cached answer (by
//! image, then registry, then global key) or a run of the plugin, one run
//! for concurrent asks of the same image (single flight), cached by the
//! response's `cacheKeyType` for its `cacheDuration`, the provider's
//! `defaultCacheDuration` when it names none, not at all for 0. In token
//! mode an answer whose password is the token sent is refused unless the
//! provider caches by token.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kubelet_runtime::credentialprovider::{
    DockerConfig, DockerConfigEntry, PullPod, urls_match_str,
};
use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::{debug, error};

use crate::Error;
use crate::api::{CacheKeyType, CredentialProviderResponse};
use crate::duration::{self, Nanos};
use crate::exec::Plugin;
use crate::serviceaccount::{ServiceAccountMode, TokenGrant, key_of};

/// The cache key of `cacheKeyType: Global`.
const GLOBAL_CACHE_KEY: &str = "global";
/// How often expired entries nobody asks for again are dropped.
const CACHE_PURGE_INTERVAL: Duration = Duration::from_secs(15 * 60);

type Flight = Arc<OnceCell<Result<Arc<CredentialProviderResponse>, Arc<Error>>>>;

struct Cache {
    entries: HashMap<String, (DockerConfig, Instant)>,
    last_purge: Instant,
}

/// A plugin with its matching, cache and single flight.
pub struct PluginProvider {
    name: String,
    match_images: Vec<String>,
    default_cache_duration: Nanos,
    plugin: Arc<dyn Plugin>,
    cache: Mutex<Cache>,
    flights: Mutex<HashMap<String, Flight>>,
    service_account: Option<ServiceAccountMode>,
}

impl std::fmt::Debug for PluginProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginProvider")
            .field("name", &self.name)
            .field("match_images", &self.match_images)
            .finish_non_exhaustive()
    }
}

/// The registry host (and port) of an image: its first path component.
pub fn parse_registry(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

impl PluginProvider {
    /// A provider named `name` answering through `plugin`.
    pub fn new(
        name: &str,
        match_images: Vec<String>,
        default_cache_duration: Nanos,
        plugin: Arc<dyn Plugin>,
        service_account: Option<ServiceAccountMode>,
    ) -> Self {
        Self {
            name: name.into(),
            match_images,
            default_cache_duration,
            plugin,
            cache: Mutex::new(Cache {
                entries: HashMap::new(),
                last_purge: Instant::now(),
            }),
            flights: Mutex::new(HashMap::new()),
            service_account,
        }
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `image` is one the plugin serves (upstream `isImageAllowed`).
    pub fn is_image_allowed(&self, image: &str) -> bool {
        self.match_images.iter().any(|m| urls_match_str(m, image))
    }

    /// The credentials for `image` pulled for `pod`: empty when the plugin
    /// does not serve it or failed (logged).
    pub async fn provide(&self, image: &str, pod: &PullPod) -> DockerConfig {
        if !self.is_image_allowed(image) {
            return DockerConfig::new();
        }
        let mut grant = TokenGrant::default();
        if let Some(sa) = &self.service_account {
            if pod.service_account_name.is_empty() {
                if sa.require_service_account() {
                    debug!(pod = %format!("{}/{}", pod.namespace, pod.name),
                        "Service account name is empty for pod");
                    return DockerConfig::new();
                }
            } else {
                match sa.grant(pod).await {
                    Ok(g) => grant = g,
                    Err(e @ Error::RequiredAnnotation(_)) => {
                        debug!(provider = %self.name, error = %e, "Failed to get service account data");
                        return DockerConfig::new();
                    }
                    Err(e) => {
                        error!(provider = %self.name, error = %e, "Credential provider plugin not run");
                        return DockerConfig::new();
                    }
                }
            }
        }
        if let Some(cached) = self.cached(image, &grant.cache_key) {
            return cached;
        }
        let flight_key = if grant.token.is_empty() && grant.annotations.is_empty() {
            image.to_string()
        } else {
            key_of([image, grant.flight_key.as_str()])
        };
        let response = match self.single_flight(&flight_key, image, &grant).await {
            Ok(r) => r,
            Err(e) => {
                error!(provider = %self.name, error = %e,
                    "Failed getting credential from external registry credential provider");
                return DockerConfig::new();
            }
        };
        // Only an answer cached per token may be the token itself (upstream
        // refuses an echoed token otherwise).
        let token_answers_allowed = self
            .service_account
            .as_ref()
            .is_some_and(ServiceAccountMode::caches_by_token);
        if !grant.token.is_empty()
            && !token_answers_allowed
            && response.auth.values().any(|a| a.password == grant.token)
        {
            error!(provider = %self.name,
                "Credential provider plugin returned the service account token as the password for image {image:?}, which is not allowed when service account cache type is not set to 'Token'");
            return DockerConfig::new();
        }
        let base = match &response.cache_key_type {
            Ok(CacheKeyType::Image) => image,
            Ok(CacheKeyType::Registry) => parse_registry(image),
            Ok(CacheKeyType::Global) => GLOBAL_CACHE_KEY,
            Err(other) => {
                error!(provider = %self.name, error = %Error::CacheKeyType(other.clone()),
                    "Credential provider plugin answer ignored");
                return DockerConfig::new();
            }
        };
        let config: DockerConfig = response
            .auth
            .iter()
            .map(|(loc, a)| {
                let entry = DockerConfigEntry {
                    username: a.username.clone(),
                    password: a.password.clone(),
                    ..DockerConfigEntry::default()
                };
                (loc.clone(), entry)
            })
            .collect();
        let ttl = response
            .cache_duration
            .unwrap_or(self.default_cache_duration);
        if ttl > 0 {
            let expires_at = Instant::now() + duration::to_std(ttl);
            let key = key_of([base, grant.cache_key.as_str()]);
            debug!(provider = %self.name, cache_key = base, ttl = %duration::format(ttl),
                "Caching credential provider answer");
            self.cache
                .lock()
                .entries
                .insert(key, (config.clone(), expires_at));
        }
        config
    }

    /// A cached answer for the image, its registry or all images
    /// (upstream `getCachedCredentials`); expired entries count as absent.
    fn cached(&self, image: &str, sa_key: &str) -> Option<DockerConfig> {
        let now = Instant::now();
        let mut cache = self.cache.lock();
        if now > cache.last_purge + CACHE_PURGE_INTERVAL {
            cache.entries.retain(|_, (_, exp)| now <= *exp);
            cache.last_purge = now;
        }
        for base in [image, parse_registry(image), GLOBAL_CACHE_KEY] {
            let key = key_of([base, sa_key]);
            match cache.entries.get(&key) {
                Some((c, exp)) if now <= *exp => return Some(c.clone()),
                Some(_) => {
                    cache.entries.remove(&key);
                }
                None => {}
            }
        }
        None
    }

    /// Runs the plugin once for all concurrent asks under `key`.
    async fn single_flight(
        &self,
        key: &str,
        image: &str,
        grant: &TokenGrant,
    ) -> Result<Arc<CredentialProviderResponse>, Arc<Error>> {
        let flight = self
            .flights
            .lock()
            .entry(key.to_string())
            .or_default()
            .clone();
        let annotations: &BTreeMap<String, String> = &grant.annotations;
        let result = flight
            .get_or_init(|| async {
                self.plugin
                    .exec_plugin(image, &grant.token, annotations)
                    .await
                    .map(Arc::new)
                    .map_err(Arc::new)
            })
            .await
            .clone();
        // The flight is over: later asks run the plugin again (or hit the cache).
        let mut flights = self.flights.lock();
        if flights.get(key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
            flights.remove(key);
        }
        result
    }
}

#[cfg(test)]
#[path = "provider_tests.rs"]
mod tests;
