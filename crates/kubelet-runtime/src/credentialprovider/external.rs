//! The seam to image credential provider plugins (upstream
//! `pkg/credentialprovider/plugin` `NewExternalCredentialProviderDockerKeyring`):
//! the kubelet registers the plugins its `--image-credential-provider-config`
//! names, and a pull asks each of them, in registration order, for the
//! credentials of the repository being pulled. What they answer joins the
//! node's keyring, after the pod's image pull secrets.

use std::sync::{Arc, OnceLock};

use super::config::DockerConfig;
use super::keyring::{AuthConfig, BasicDockerKeyring, DockerKeyring};

/// The pod an image is pulled for: plugins in service-account token mode
/// get a token for its service account, bound to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// `spec.serviceAccountName` ("" when unset).
    pub service_account_name: String,
}

/// The registered credential provider plugins.
#[async_trait::async_trait]
pub trait ExternalCredentialProviders: Send + Sync + std::fmt::Debug {
    /// Each provider's credentials for `image` (a repository without tag or
    /// digest, as [`super::repo_to_pull`] gives), in registration order. A
    /// provider whose `matchImages` does not match, or that failed, gives
    /// an empty config; failures are logged by the provider, and the pull
    /// goes on with the other credentials, as upstream.
    async fn provide(&self, image: &str, pod: &PullPod) -> Vec<DockerConfig>;
}

/// A keyring filled once, after it joined a union: the providers are asked
/// only once the pod's pull secrets have parsed, as upstream asks them
/// lazily on lookup.
#[derive(Debug, Default)]
pub struct LateKeyring(OnceLock<BasicDockerKeyring>);

impl LateKeyring {
    /// A keyring with no credentials until [`LateKeyring::fill`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Adds every config, in order, into one keyring (upstream's external
    /// keyring adds each provider's answer to one `BasicDockerKeyring`, so
    /// the most specific location comes first across providers). Only the
    /// first call counts.
    pub fn fill(&self, configs: &[DockerConfig]) {
        let mut k = BasicDockerKeyring::default();
        for c in configs {
            k.add(c);
        }
        let _ = self.0.set(k);
    }
}

impl DockerKeyring for LateKeyring {
    fn lookup(&self, image: &str) -> Vec<AuthConfig> {
        self.0.get().map(|k| k.lookup(image)).unwrap_or_default()
    }
}
