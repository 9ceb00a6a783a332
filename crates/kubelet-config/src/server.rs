//! Settings of the kubelet's node API (upstream `KubeletConfiguration`'s
//! `address`, `port`, `readOnlyPort`, `tls*`, `serverTLSBootstrap`,
//! `authentication`, `authorization`, `enableServer`,
//! `enableDebuggingHandlers`), resolved flag over file over default.
//!
//! Defaults follow upstream exactly, including its two sets: with a
//! `--config` file the v1beta1 defaults apply (anonymous off, webhook
//! authentication on, `Webhook` authorization, no read-only port); with flags
//! alone upstream's `applyLegacyDefaults` keeps the old command-line ones
//! (anonymous on, webhook authentication off, `AlwaysAllow`, read-only port
//! 10255). With flags alone and none of `--anonymous-auth`,
//! `--authorization-mode` and `--address` given, kubelet-rs binds loopback
//! instead ([`exposure`]).

mod exposure;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::settings::SettingValue;
use crate::{ConfigError, invalid};

pub use exposure::Exposure;

/// `authorization.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// A SubjectAccessReview decides.
    Webhook,
}

impl AuthorizationMode {
    /// Upstream's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlwaysAllow => "AlwaysAllow",
            Self::Webhook => "Webhook",
        }
    }
}

/// `authentication`.
#[derive(Clone, Debug, PartialEq)]
pub struct Authentication {
    /// `x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
    /// `webhook.enabled`: bearer tokens through TokenReview.
    pub webhook_enabled: bool,
    /// `webhook.cacheTTL` (2m).
    pub webhook_cache_ttl: Duration,
    /// `anonymous.enabled`.
    pub anonymous_enabled: bool,
}

/// `authorization`.
#[derive(Clone, Debug, PartialEq)]
pub struct Authorization {
    /// `mode`.
    pub mode: AuthorizationMode,
    /// `webhook.cacheAuthorizedTTL` (5m).
    pub cache_authorized_ttl: Duration,
    /// `webhook.cacheUnauthorizedTTL` (30s).
    pub cache_unauthorized_ttl: Duration,
}

/// The node API's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// `enableServer`: serve the node API at all.
    pub enable_server: bool,
    /// `address` (0.0.0.0; loopback when [`Exposure::LoopbackOnly`]).
    pub address: IpAddr,
    /// How open the node API is to anonymous clients, and why.
    pub exposure: Exposure,
    /// `port` (10250).
    pub port: u16,
    /// `readOnlyPort` (0 = off).
    pub read_only_port: u16,
    /// `tlsCertFile`.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`.
    pub tls_private_key_file: Option<PathBuf>,
    /// `tlsCipherSuites` (Go names); empty means the TLS library's defaults.
    pub tls_cipher_suites: Vec<String>,
    /// `tlsMinVersion` (`VersionTLS12`, ...); `None` means the default.
    pub tls_min_version: Option<String>,
    /// `serverTLSBootstrap` (`--rotate-server-certificates`).
    pub server_tls_bootstrap: bool,
    /// `enableDebuggingHandlers`: logs, exec, attach, port-forward, run.
    pub enable_debugging_handlers: bool,
    /// `enableDebugFlagsHandler`: `/debug/flags/v`.
    pub enable_debug_flags_handler: bool,
    /// `streamingConnectionIdleTimeout` (4h).
    pub streaming_connection_idle_timeout: Duration,
    /// Authentication.
    pub authentication: Authentication,
    /// Authorization.
    pub authorization: Authorization,
}

fn bool_of(settings: &BTreeMap<&'static str, SettingValue>, key: &str, default: bool) -> bool {
    match settings.get(key) {
        Some(SettingValue::Bool(b)) => *b,
        _ => default,
    }
}

fn string_of(settings: &BTreeMap<&'static str, SettingValue>, key: &str) -> Option<String> {
    match settings.get(key) {
        Some(SettingValue::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn duration_of(
    settings: &BTreeMap<&'static str, SettingValue>,
    key: &'static str,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match settings.get(key) {
        Some(SettingValue::Duration(d)) => d
            .to_std()
            .ok_or_else(|| invalid(key, d.to_string(), "a duration >= 0")),
        _ => Ok(default),
    }
}

/// Resolves the node API's settings from the resolved `settings` map (and
/// the part of it given as flags), the kubelet `port`, whether a config file
/// was given (which set of defaults applies) and the file's
/// `enableDebugFlagsHandler`, a field with no flag.
pub fn resolve(
    settings: &BTreeMap<&'static str, SettingValue>,
    from_flags: &BTreeMap<&'static str, SettingValue>,
    port: u16,
    config_file: bool,
    enable_debug_flags_handler: Option<bool>,
) -> Result<ServerConfig, ConfigError> {
    let address = string_of(settings, "address").unwrap_or_else(|| "0.0.0.0".into());
    let address: IpAddr = address
        .parse()
        .map_err(|_| invalid("address", &address, "an IP address"))?;
    let legacy_read_only = if config_file { 0 } else { 10255 };
    let read_only_port = match settings.get("readOnlyPort") {
        Some(SettingValue::Int(p)) => *p,
        _ => legacy_read_only,
    };
    let read_only_port = u16::try_from(read_only_port)
        .map_err(|_| invalid("readOnlyPort", read_only_port.to_string(), "0 to 65535"))?;
    let mode = match string_of(settings, "authorization.mode").as_deref() {
        None if config_file => AuthorizationMode::Webhook,
        None => AuthorizationMode::AlwaysAllow,
        Some("AlwaysAllow") => AuthorizationMode::AlwaysAllow,
        Some("Webhook") => AuthorizationMode::Webhook,
        Some(other) => {
            return Err(invalid(
                "authorization.mode",
                other,
                "AlwaysAllow or Webhook",
            ));
        }
    };
    let anonymous_enabled = bool_of(settings, "authentication.anonymous.enabled", !config_file);
    let (exposure, address) = exposure::decide(
        settings,
        from_flags,
        config_file,
        anonymous_enabled,
        mode == AuthorizationMode::AlwaysAllow,
        address,
    );
    let tls_cipher_suites = match settings.get("tlsCipherSuites") {
        Some(SettingValue::List(l)) => l.clone(),
        _ => vec![],
    };
    Ok(ServerConfig {
        enable_server: bool_of(settings, "enableServer", true),
        address,
        exposure,
        port,
        read_only_port,
        tls_cert_file: string_of(settings, "tlsCertFile").map(PathBuf::from),
        tls_private_key_file: string_of(settings, "tlsPrivateKeyFile").map(PathBuf::from),
        tls_cipher_suites,
        tls_min_version: string_of(settings, "tlsMinVersion"),
        server_tls_bootstrap: bool_of(settings, "serverTLSBootstrap", false),
        enable_debugging_handlers: bool_of(settings, "enableDebuggingHandlers", true),
        enable_debug_flags_handler: enable_debug_flags_handler.unwrap_or(true),
        streaming_connection_idle_timeout: duration_of(
            settings,
            "streamingConnectionIdleTimeout",
            Duration::from_secs(4 * 3600),
        )?,
        authentication: Authentication {
            client_ca_file: string_of(settings, "authentication.x509.clientCAFile")
                .map(PathBuf::from),
            webhook_enabled: bool_of(settings, "authentication.webhook.enabled", config_file),
            webhook_cache_ttl: duration_of(
                settings,
                "authentication.webhook.cacheTTL",
                Duration::from_secs(120),
            )?,
            anonymous_enabled,
        },
        authorization: Authorization {
            mode,
            cache_authorized_ttl: duration_of(
                settings,
                "authorization.webhook.cacheAuthorizedTTL",
                Duration::from_secs(300),
            )?,
            cache_unauthorized_ttl: duration_of(
                settings,
                "authorization.webhook.cacheUnauthorizedTTL",
                Duration::from_secs(30),
            )?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Flags, KubeletConfig};

    fn resolve_args(args: &[&str], file: Option<&str>) -> ServerConfig {
        let mut v = vec!["kubelet-rs"];
        v.extend_from_slice(args);
        let flags = Flags::parse_args(v).expect("flags");
        let file = file.map(|y| serde_saphyr::from_str(y).expect("yaml"));
        KubeletConfig::resolve(&flags, file.as_ref(), "node")
            .expect("resolves")
            .server
    }

    #[test]
    fn flags_alone_keep_upstreams_legacy_command_line_defaults() {
        let s = resolve_args(&[], None);
        assert_eq!(s.port, 10250);
        assert_eq!(s.read_only_port, 10255);
        assert!(s.authentication.anonymous_enabled);
        assert!(!s.authentication.webhook_enabled);
        assert_eq!(s.authorization.mode, AuthorizationMode::AlwaysAllow);
        // kubelet-rs binds loopback then (exposure.rs), not upstream's 0.0.0.0.
        assert_eq!(s.address.to_string(), "127.0.0.1");
        assert!(s.enable_server && s.enable_debugging_handlers);
    }

    #[test]
    fn a_config_file_brings_the_v1beta1_defaults() {
        let s = resolve_args(
            &[],
            Some("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"),
        );
        assert_eq!(s.read_only_port, 0);
        assert!(!s.authentication.anonymous_enabled);
        assert!(s.authentication.webhook_enabled);
        assert_eq!(s.authentication.webhook_cache_ttl, Duration::from_secs(120));
        assert_eq!(s.authorization.mode, AuthorizationMode::Webhook);
        assert_eq!(
            s.authorization.cache_authorized_ttl,
            Duration::from_secs(300)
        );
        assert_eq!(
            s.authorization.cache_unauthorized_ttl,
            Duration::from_secs(30)
        );
    }

    #[test]
    fn flags_win_over_the_file_and_tls_settings_are_read() {
        let s = resolve_args(
            &[
                "--authorization-mode=AlwaysAllow",
                "--read-only-port=10266",
                "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "--tls-min-version=VersionTLS13",
                "--address=127.0.0.1",
            ],
            Some(
                "kind: KubeletConfiguration\nauthorization: {mode: Webhook}\n\
                 authentication: {x509: {clientCAFile: /ca.crt}, webhook: {cacheTTL: 10s}}\n\
                 tlsCertFile: /a.crt\ntlsPrivateKeyFile: /a.key\nserverTLSBootstrap: true\n",
            ),
        );
        assert_eq!(s.authorization.mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(s.read_only_port, 10266);
        assert_eq!(
            s.tls_cipher_suites,
            vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()]
        );
        assert_eq!(s.tls_min_version.as_deref(), Some("VersionTLS13"));
        assert_eq!(s.address.to_string(), "127.0.0.1");
        assert_eq!(
            s.authentication.client_ca_file,
            Some(PathBuf::from("/ca.crt"))
        );
        assert_eq!(s.authentication.webhook_cache_ttl, Duration::from_secs(10));
        assert_eq!(s.tls_cert_file, Some(PathBuf::from("/a.crt")));
        assert!(s.server_tls_bootstrap);
    }

    #[test]
    fn bad_values_are_refused() {
        let flags = Flags::parse_args(["kubelet-rs", "--authorization-mode=RBAC"]).expect("flags");
        let err =
            KubeletConfig::resolve(&flags, None, "n").expect_err("RBAC is not a kubelet mode");
        assert!(err.to_string().contains("AlwaysAllow or Webhook"), "{err}");
        let file = serde_saphyr::from_str("kind: KubeletConfiguration\naddress: localhost\n")
            .expect("yaml");
        let flags = Flags::parse_args(["kubelet-rs"]).expect("flags");
        let err = KubeletConfig::resolve(&flags, Some(&file), "n").expect_err("not an IP");
        assert!(err.to_string().contains("address"), "{err}");
    }
}
