//! The registered plugins (upstream `RegisterCredentialProviderPlugins` and
//! `externalCredentialProviderKeyring`): the bin dir and each provider's
//! binary must exist and the config be valid, or the kubelet does not
//! start; a pull then asks every provider, in config order.

use std::path::Path;
use std::sync::Arc;

use kubelet_runtime::credentialprovider::{DockerConfig, ExternalCredentialProviders, PullPod};
use tracing::{info, warn};

use crate::Error;
use crate::config::{aggregate, read_credential_provider_config, validate};
use crate::exec::{ExecPlugin, PluginMetrics};
use crate::provider::PluginProvider;
use crate::serviceaccount::{ServiceAccountMode, ServiceAccountTokens};

/// What registration needs besides the two paths.
#[derive(Clone)]
pub struct RegisterOptions {
    /// The `KubeletServiceAccountTokenForCredentialProviders` gate.
    pub service_account_tokens_gate: bool,
    /// Service accounts and tokens for providers in token mode; without it
    /// such providers are not run for pods with a service account (an
    /// error is logged on each pull).
    pub tokens: Option<Arc<dyn ServiceAccountTokens>>,
    /// How long a plugin may run (upstream: one minute).
    pub exec_timeout: std::time::Duration,
    /// Where plugin runs are recorded.
    pub metrics: Option<Arc<dyn PluginMetrics>>,
}

impl Default for RegisterOptions {
    fn default() -> Self {
        Self {
            // Beta and on by default since 1.34.
            service_account_tokens_gate: true,
            tokens: None,
            exec_timeout: crate::exec::EXEC_TIMEOUT,
            metrics: None,
        }
    }
}

/// All registered providers, in config order.
#[derive(Debug, Default)]
pub struct PluginProviders {
    providers: Vec<PluginProvider>,
}

impl PluginProviders {
    /// Providers as given (tests, tools).
    pub fn new(providers: Vec<PluginProvider>) -> Self {
        Self { providers }
    }

    /// The providers' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.providers.iter().map(PluginProvider::name).collect()
    }
}

#[async_trait::async_trait]
impl ExternalCredentialProviders for PluginProviders {
    async fn provide(&self, image: &str, pod: &PullPod) -> Vec<DockerConfig> {
        let mut out = Vec::with_capacity(self.providers.len());
        for p in &self.providers {
            out.push(p.provide(image, pod).await);
        }
        out
    }
}

fn stat_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
}

/// Registers the providers of `config` with binaries in `bin_dir`
/// (upstream `RegisterCredentialProviderPlugins`).
pub async fn register_credential_provider_plugins(
    config: &Path,
    bin_dir: &Path,
    opts: RegisterOptions,
) -> Result<PluginProviders, Error> {
    let dir = bin_dir.display().to_string();
    if let Err(source) = tokio::fs::metadata(bin_dir).await {
        return Err(if stat_error(&source) {
            Error::BinDirMissing(dir)
        } else {
            Error::BinDirInspect { path: dir, source }
        });
    }
    let cfg = read_credential_provider_config(config).await?;
    let errs = validate(&cfg, opts.service_account_tokens_gate);
    if !errs.is_empty() {
        return Err(Error::Validate(aggregate(&errs)));
    }
    let mut providers = Vec::with_capacity(cfg.providers.len());
    for p in &cfg.providers {
        let bin = bin_dir.join(&p.name);
        let shown = bin.display().to_string();
        match tokio::fs::metadata(&bin).await {
            Err(source) if stat_error(&source) => return Err(Error::BinMissing(shown)),
            Err(source) => {
                return Err(Error::BinInspect {
                    path: shown,
                    source,
                });
            }
            Ok(m) if m.is_dir() => return Err(Error::BinMissing(shown)),
            Ok(_) => {}
        }
        let mut plugin = ExecPlugin::new(bin_dir, p);
        plugin.timeout = opts.exec_timeout;
        plugin.metrics = opts.metrics.clone();
        let sa = ServiceAccountMode::new(
            p.token_attributes.as_ref(),
            opts.service_account_tokens_gate,
            opts.tokens.clone(),
        );
        if sa.as_ref().is_some_and(|s| !s.has_token_source()) {
            warn!(provider = %p.name,
                "Credential provider asks for service account tokens, which this kubelet cannot supply; it runs only for pods without a service account");
        }
        providers.push(PluginProvider::new(
            &p.name,
            p.match_images.clone(),
            p.default_cache_duration.unwrap_or(0),
            Arc::new(plugin),
            sa,
        ));
        info!(provider = %p.name, match_images = ?p.match_images, api_version = %p.api_version,
            "Registered credential provider");
    }
    Ok(PluginProviders { providers })
}

/// What the kubelet does with `--image-credential-provider-config` and
/// `--image-credential-provider-bin-dir`: nothing when both are unset,
/// otherwise registration (an error stops the kubelet, as upstream's
/// "Failed to register CRI auth plugins").
pub async fn register_from_flags(
    config: Option<&Path>,
    bin_dir: Option<&Path>,
    opts: RegisterOptions,
) -> Result<Option<Arc<PluginProviders>>, Error> {
    if config.is_none() && bin_dir.is_none() {
        return Ok(None);
    }
    let empty = Path::new("");
    let providers = register_credential_provider_plugins(
        config.unwrap_or(empty),
        bin_dir.unwrap_or(empty),
        opts,
    )
    .await?;
    Ok(Some(Arc::new(providers)))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const CONFIG: &str = r#"{"apiVersion":"kubelet.config.k8s.io/v1","kind":"CredentialProviderConfig",
        "providers":[{"name":"NAME","matchImages":["127.0.0.1:5001"],"defaultCacheDuration":"1m",
        "apiVersion":"credentialprovider.kubelet.k8s.io/v1"}]}"#;

    #[tokio::test]
    async fn registration_needs_the_bin_dir_each_binary_and_a_valid_config() {
        let dir = tempfile::tempdir().expect("tmp");
        let config = dir.path().join("config.json");
        std::fs::write(&config, CONFIG.replace("NAME", "creds")).expect("write");
        let bin = dir.path().join("bin");
        let opts = RegisterOptions::default;
        let e = register_credential_provider_plugins(&config, &bin, opts())
            .await
            .expect_err("no bin dir");
        assert_eq!(
            e.to_string(),
            format!("plugin binary directory {} did not exist", bin.display())
        );
        std::fs::create_dir(&bin).expect("mkdir");
        let e = register_credential_provider_plugins(&config, &bin, opts())
            .await
            .expect_err("no binary");
        assert_eq!(
            e.to_string(),
            format!(
                "plugin binary executable {} did not exist",
                bin.join("creds").display()
            )
        );
        let plugin = bin.join("creds");
        std::fs::write(&plugin, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let providers = register_credential_provider_plugins(&config, &bin, opts())
            .await
            .expect("registered");
        assert_eq!(providers.names(), ["creds"]);

        std::fs::write(&config, CONFIG.replace("NAME", "../creds")).expect("write");
        let e = register_credential_provider_plugins(&config, &bin, opts())
            .await
            .expect_err("invalid");
        assert_eq!(
            e.to_string(),
            "failed to validate credential provider config: providers.name: Invalid value: \"../creds\": provider name cannot contain '/'"
        );
    }

    #[tokio::test]
    async fn flags_unset_register_nothing_and_one_flag_alone_fails() {
        let none = register_from_flags(None, None, RegisterOptions::default())
            .await
            .expect("nothing to do");
        assert!(none.is_none());
        let dir = tempfile::tempdir().expect("tmp");
        let e = register_from_flags(None, Some(dir.path()), RegisterOptions::default())
            .await
            .expect_err("config missing");
        assert_eq!(e.to_string(), "credential provider config path is empty");
    }
}
