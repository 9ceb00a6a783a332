//! `CredentialProviderConfig` (upstream `pkg/credentialprovider/plugin/config.go`
//! and `kubelet.config.k8s.io` v1, v1beta1, v1alpha1): read from a file, or
//! from every `*.json`, `*.yaml` and `*.yml` file of a directory in name
//! order, merged; decoded strictly (unknown and duplicate fields are
//! errors, `tokenAttributes` exists only in v1); then validated with
//! upstream's field errors.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::Error;
use crate::duration::{self, Nanos};

/// The config group.
pub const GROUP: &str = "kubelet.config.k8s.io";
/// The config versions a file may be written in.
pub const CONFIG_VERSIONS: [&str; 3] = ["v1", "v1alpha1", "v1beta1"];
/// The plugin API versions a provider may speak, sorted as upstream lists them.
pub const PLUGIN_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];
/// The plugin API version that knows service account tokens.
pub const PLUGIN_API_V1: &str = "credentialprovider.kubelet.k8s.io/v1";
/// `tokenAttributes.cacheType` values.
pub const CACHE_TYPES: [&str; 2] = ["ServiceAccount", "Token"];

/// The providers of all config files, in file then list order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialProviderConfig {
    /// The providers.
    pub providers: Vec<CredentialProvider>,
}

/// One plugin and when to run it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialProvider {
    /// The plugin binary's name in the bin dir.
    pub name: String,
    /// Images the plugin serves (`URLsMatchStr` globs).
    pub match_images: Vec<String>,
    /// How long answers are kept when the plugin names no duration;
    /// `None` when the field is missing (a validation error).
    pub default_cache_duration: Option<Nanos>,
    /// The plugin API version of its request and response.
    pub api_version: String,
    /// Arguments the plugin is run with.
    pub args: Vec<String>,
    /// Environment added to the kubelet's for the plugin.
    pub env: Vec<ExecEnvVar>,
    /// Service-account token mode (v1 only).
    pub token_attributes: Option<TokenAttributes>,
}

/// One environment variable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecEnvVar {
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its value.
    #[serde(default)]
    pub value: String,
}

/// What a plugin in service-account token mode is sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenAttributes {
    /// The audience of the token.
    #[serde(default)]
    pub service_account_token_audience: String,
    /// `ServiceAccount` or `Token`: what the answers are cached by.
    #[serde(default)]
    pub cache_type: String,
    /// Whether a pod without a service account gets no credentials.
    #[serde(default)]
    pub require_service_account: Option<bool>,
    /// Annotations of the service account the plugin needs; without any of
    /// them the plugin is not run.
    #[serde(default)]
    pub required_service_account_annotation_keys: Vec<String>,
    /// Annotations passed when present.
    #[serde(default)]
    pub optional_service_account_annotation_keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireConfig {
    #[serde(default)]
    #[allow(dead_code)]
    api_version: String,
    #[serde(default)]
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    providers: Vec<WireProvider>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireProvider {
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    #[serde(default)]
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<ExecEnvVar>,
    #[serde(default)]
    token_attributes: Option<TokenAttributes>,
}

/// Reads the config at `path`: a file, or a directory of them (upstream
/// `readCredentialProviderConfig`).
pub async fn read_credential_provider_config(
    path: &Path,
) -> Result<CredentialProviderConfig, Error> {
    if path.as_os_str().is_empty() {
        return Err(Error::ConfigPathEmpty);
    }
    let meta = tokio::fs::metadata(path)
        .await
        .map_err(|source| Error::Access {
            path: path.into(),
            source,
        })?;
    let mut files: Vec<PathBuf> = Vec::new();
    if meta.is_dir() {
        let read_dir = |source| Error::ReadDir {
            path: path.into(),
            source,
        };
        let mut dir = tokio::fs::read_dir(path).await.map_err(read_dir)?;
        while let Some(e) = dir.next_entry().await.map_err(read_dir)? {
            let p = e.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            let is_dir = e.file_type().await.is_ok_and(|t| t.is_dir());
            if !is_dir && matches!(ext, "json" | "yaml" | "yml") {
                files.push(p);
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(Error::NoConfigFiles(path.into()));
        }
    } else {
        files.push(path.into());
    }
    let mut merged = CredentialProviderConfig::default();
    let mut names = HashSet::new();
    for f in files {
        let data = tokio::fs::read(&f)
            .await
            .map_err(|source| Error::ReadFile {
                path: f.clone(),
                source,
            })?;
        let cfg = decode(&data).map_err(|message| Error::Decode {
            path: f.clone(),
            message,
        })?;
        for p in cfg.providers {
            if !names.insert(p.name.clone()) {
                return Err(Error::DuplicateProvider(p.name));
            }
            merged.providers.push(p);
        }
    }
    Ok(merged)
}

/// YAML as upstream's decoder reads it: aliases may replay 10,000 events (a
/// config written with anchors needs a handful), where the parser's default
/// (a million) let a 222-byte alias bomb take 0.1-0.4 s of CPU (found by the
/// `credential_provider` fuzz target; the manifest decoder has the same
/// bound). Upstream refuses such documents ("excessive aliasing").
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 10_000,
        },
    }
}

/// Decodes one document, YAML or JSON (upstream `decode`).
pub fn decode(data: &[u8]) -> Result<CredentialProviderConfig, String> {
    let text = std::str::from_utf8(data).map_err(|e| e.to_string())?;
    let doc: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| e.to_string())?
    };
    let field = |name: &str| {
        doc.get(name)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if kind.is_empty() {
        return Err("Object 'Kind' is missing in the config".into());
    }
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or(("", api_version.as_str()));
    if group != GROUP {
        return Err(format!(
            "failed to decode CredentialProviderConfig, unexpected Group: {group}"
        ));
    }
    if !CONFIG_VERSIONS.contains(&version) {
        return Err(format!(
            "no kind {kind:?} is registered for version {api_version:?}"
        ));
    }
    if kind != "CredentialProviderConfig" {
        return Err(format!("failed to decode {kind:?} (wrong Kind)"));
    }
    let wire: WireConfig =
        serde_json::from_value(doc).map_err(|e| format!("strict decoding error: {e}"))?;
    let mut providers = Vec::with_capacity(wire.providers.len());
    for (i, p) in wire.providers.into_iter().enumerate() {
        if version != "v1" && p.token_attributes.is_some() {
            return Err(format!(
                "strict decoding error: unknown field \"providers[{i}].tokenAttributes\""
            ));
        }
        let default_cache_duration = match p.default_cache_duration.as_deref() {
            None => None,
            Some(d) => Some(duration::parse(d)?),
        };
        providers.push(CredentialProvider {
            name: p.name,
            match_images: p.match_images,
            default_cache_duration,
            api_version: p.api_version,
            args: p.args,
            env: p.env,
            token_attributes: p.token_attributes,
        });
    }
    Ok(CredentialProviderConfig { providers })
}

/// One of upstream's `field.Error`s, formatted as `field.Error.Error()`.
fn required(field: &str, detail: &str) -> String {
    if detail.is_empty() {
        format!("{field}: Required value")
    } else {
        format!("{field}: Required value: {detail}")
    }
}

fn invalid(field: &str, value: &str, detail: &str) -> String {
    format!("{field}: Invalid value: {value}: {detail}")
}

fn quoted_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Upstream's error aggregate: one message alone, several as `[a, b]`.
pub fn aggregate(errs: &[String]) -> String {
    match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Validates the merged config (upstream `validateCredentialProviderConfig`);
/// `sa_tokens` is the `KubeletServiceAccountTokenForCredentialProviders` gate.
pub fn validate(config: &CredentialProviderConfig, sa_tokens: bool) -> Vec<String> {
    let mut errs = Vec::new();
    if config.providers.is_empty() {
        errs.push(required(
            "providers",
            "at least 1 item in plugins is required",
        ));
    }
    let mut seen = HashSet::new();
    for p in &config.providers {
        let name = format!("{:?}", p.name);
        for (bad, why) in [
            (p.name.contains('/'), "provider name cannot contain '/'"),
            (p.name.contains(' '), "provider name cannot contain spaces"),
            (p.name == ".", "provider name cannot be '.'"),
            (p.name == "..", "provider name cannot be '..'"),
        ] {
            if bad {
                errs.push(invalid("providers.name", &name, why));
            }
        }
        if !seen.insert(p.name.as_str()) {
            errs.push(format!("providers.name: Duplicate value: {name}"));
        }
        if p.api_version.is_empty() {
            errs.push(required("providers.apiVersion", ""));
        } else if !PLUGIN_API_VERSIONS.contains(&p.api_version.as_str()) {
            errs.push(format!(
                "providers.apiVersion: Unsupported value: {:?}: supported values: {}",
                p.api_version,
                quoted_list(&PLUGIN_API_VERSIONS)
            ));
        }
        if p.match_images.is_empty() {
            errs.push(required(
                "providers.matchImages",
                "at least 1 item in matchImages is required",
            ));
        }
        for m in &p.match_images {
            if let Some(e) = kubelet_runtime::credentialprovider::schemeless_url_error(m) {
                errs.push(invalid(
                    "providers.matchImages",
                    &format!("{m:?}"),
                    &format!("match image is invalid: {e}"),
                ));
            }
        }
        match p.default_cache_duration {
            None => errs.push(required("providers.defaultCacheDuration", "")),
            Some(d) if d < 0 => errs.push(invalid(
                "providers.defaultCacheDuration",
                &format!("{:?}", duration::format(d)),
                "defaultCacheDuration must be greater than or equal to 0",
            )),
            Some(_) => {}
        }
        if let Some(t) = &p.token_attributes {
            validate_token_attributes(p, t, sa_tokens, &mut errs);
        }
    }
    errs
}

fn validate_token_attributes(
    p: &CredentialProvider,
    t: &TokenAttributes,
    sa_tokens: bool,
    errs: &mut Vec<String>,
) {
    const F: &str = "providers.tokenAttributes";
    if !sa_tokens {
        errs.push(format!(
            "{F}: Forbidden: tokenAttributes is not supported when KubeletServiceAccountTokenForCredentialProviders feature gate is disabled"
        ));
    }
    if t.service_account_token_audience.is_empty() {
        errs.push(required(&format!("{F}.serviceAccountTokenAudience"), ""));
    }
    if t.require_service_account.is_none() {
        errs.push(required(&format!("{F}.requireServiceAccount"), ""));
    }
    if p.api_version != PLUGIN_API_V1 {
        errs.push(format!(
            "{F}: Forbidden: tokenAttributes is only supported for {PLUGIN_API_V1} API version"
        ));
    }
    if t.require_service_account == Some(false)
        && !t.required_service_account_annotation_keys.is_empty()
    {
        errs.push(format!(
            "{F}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"
        ));
    }
    for (field, keys) in [
        (
            "requiredServiceAccountAnnotationKeys",
            &t.required_service_account_annotation_keys,
        ),
        (
            "optionalServiceAccountAnnotationKeys",
            &t.optional_service_account_annotation_keys,
        ),
    ] {
        let field = format!("{F}.{field}");
        let mut seen = HashSet::new();
        for k in keys {
            for msg in crate::config_names::qualified_name_errors(&k.to_lowercase()) {
                errs.push(invalid(&field, &format!("{k:?}"), &msg));
            }
            if !seen.insert(k) {
                errs.push(format!("{field}: Duplicate value: {k:?}"));
            }
        }
    }
    let mut both: Vec<&str> = t
        .required_service_account_annotation_keys
        .iter()
        .filter(|k| t.optional_service_account_annotation_keys.contains(k))
        .map(String::as_str)
        .collect();
    both.sort_unstable();
    both.dedup();
    if !both.is_empty() {
        errs.push(invalid(
            F,
            &format!("[{}]", quoted_list(&both)),
            "annotation keys cannot be both required and optional",
        ));
    }
    if t.cache_type.is_empty() {
        errs.push(required(
            &format!("{F}.cacheType"),
            &format!(
                "cacheType is required to be set when tokenAttributes is specified. Supported values are: {}",
                CACHE_TYPES.join(", ")
            ),
        ));
    } else if !CACHE_TYPES.contains(&t.cache_type.as_str()) {
        errs.push(format!(
            "{F}.cacheType: Unsupported value: {:?}: supported values: {}",
            t.cache_type,
            quoted_list(&CACHE_TYPES)
        ));
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
