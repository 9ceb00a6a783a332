//! Image credential provider plugins for kubelet-rs (upstream
//! `pkg/credentialprovider/plugin`, KEP-2133): the
//! `CredentialProviderConfig` that `--image-credential-provider-config`
//! names ([`config`]), the `CredentialProviderRequest`/`Response` exchanged
//! with a plugin ([`api`]), the exec of a plugin binary from
//! `--image-credential-provider-bin-dir` ([`exec`]), one provider's
//! matching, cache and single flight ([`provider`]), and all registered
//! providers as the pull path asks them ([`providers`]).

pub mod api;
pub mod config;
mod config_names;
pub mod duration;
pub mod exec;
pub mod provider;
pub mod providers;
pub mod serviceaccount;

pub use config::{CredentialProvider, CredentialProviderConfig, read_credential_provider_config};
pub use exec::PluginMetrics;
pub use providers::{
    PluginProviders, RegisterOptions, register_credential_provider_plugins, register_from_flags,
};
pub use serviceaccount::{ServiceAccountData, ServiceAccountTokens, TokenSourceError};

use std::path::PathBuf;

/// What fails in registering or running credential provider plugins; the
/// messages are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--image-credential-provider-config` is empty.
    #[error("credential provider config path is empty")]
    ConfigPathEmpty,
    /// The config path cannot be stat'ed.
    #[error("unable to access path {path:?}: {source}")]
    Access {
        /// The config path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config directory cannot be listed.
    #[error("unable to read directory {path:?}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config directory holds no `*.json`, `*.yaml` or `*.yml` file.
    #[error("no configuration files found in directory {0:?}")]
    NoConfigFiles(PathBuf),
    /// A config file cannot be read.
    #[error("unable to read file {path:?}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A config file is no `CredentialProviderConfig`.
    #[error("error decoding config {path:?}: {message}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The decoder's words.
        message: String,
    },
    /// Two files name the same provider.
    #[error("duplicate provider name {0:?} found in configuration file(s)")]
    DuplicateProvider(String),
    /// The merged config is invalid (upstream's field error aggregate).
    #[error("failed to validate credential provider config: {0}")]
    Validate(String),
    /// `--image-credential-provider-bin-dir` does not exist.
    #[error("plugin binary directory {0} did not exist")]
    BinDirMissing(String),
    /// `--image-credential-provider-bin-dir` cannot be stat'ed.
    #[error("error inspecting binary directory {path}: {source}")]
    BinDirInspect {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A provider's binary is not in the bin dir.
    #[error("plugin binary executable {0} did not exist")]
    BinMissing(String),
    /// A provider's binary cannot be stat'ed.
    #[error("error inspecting binary executable {path}: {source}")]
    BinInspect {
        /// The binary.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The request could not be encoded.
    #[error("failed to encode auth request: {0}")]
    Encode(#[source] serde_json::Error),
    /// The plugin could not be run, exited non-zero or ran past its
    /// deadline; its stderr follows.
    #[error("error execing credential provider plugin {name} for image {image}: {why}: {stderr}")]
    Exec {
        /// The provider.
        name: String,
        /// The image asked for.
        image: String,
        /// Why (`exit status 1`, `context deadline exceeded`, ...).
        why: String,
        /// What the plugin wrote on stderr.
        stderr: String,
    },
    /// The plugin's stdout names no apiVersion and kind.
    #[error("error reading GVK from response: {0}")]
    ResponseGvk(String),
    /// The plugin answered in another apiVersion than the provider's.
    #[error(
        "apiVersion from credential plugin response did not match expected apiVersion:{expected}, actual apiVersion:{actual}"
    )]
    ApiVersionMismatch {
        /// The provider's apiVersion.
        expected: String,
        /// The response's.
        actual: String,
    },
    /// The response does not decode (not wrapped: it may hold credentials).
    #[error("error decoding credential provider plugin response from stdout")]
    DecodeResponse,
    /// The response's `cacheKeyType` is none of Image, Registry, Global.
    #[error("credential provider plugin did not return a valid cacheKeyType: {0:?}")]
    CacheKeyType(String),
    /// The pod's service account could not be read.
    #[error("Failed to get service account {namespace}/{name}: {source}")]
    ServiceAccount {
        /// The pod's namespace.
        namespace: String,
        /// The service account.
        name: String,
        /// Why.
        #[source]
        source: TokenSourceError,
    },
    /// A required service account annotation is missing: the plugin is not
    /// run for this pod (workloads opt in with the annotation).
    #[error("required annotation {0} not found")]
    RequiredAnnotation(String),
    /// No service account token could be had.
    #[error("Error getting service account token {namespace}/{name}: {source}")]
    Token {
        /// The pod's namespace.
        namespace: String,
        /// The service account.
        name: String,
        /// Why.
        #[source]
        source: TokenSourceError,
    },
}
