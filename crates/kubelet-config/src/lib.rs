//! Kubelet configuration (upstream `cmd/kubelet/app/options` and
//! `pkg/kubelet/apis/config`): flags and the `--config` file resolved into one
//! typed [`KubeletConfig`] with upstream precedence (explicit flags > file >
//! defaults, a zero value in the file meaning "default"), then validated.
//! Every flag an upstream kubelet 1.19..1.34 accepts is accepted
//! ([`flag_table`]); those kubelet-rs does not act on are kept in
//! [`KubeletConfig::settings`] / [`KubeletConfig::ignored_flags`] and warned
//! about ([`flag_warnings`]). [`logs`] maps klog's `--v` onto tracing
//! (upstream `component-base/logs`); [`lockfile`] is `--lock-file`
//! (upstream `pkg/util/flock`).

pub mod cluster;
pub mod configz;
mod duration;
mod file;
pub mod flag_table;
mod flags;
pub mod housekeeping;
pub mod lockfile;
pub mod logs;
pub mod server;
mod settings;
mod values;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use cluster::ClusterConfig;
pub use duration::{GoDuration, parse_go_duration};
pub use file::{FileError, KubeletConfiguration, Logging};
pub use flags::{ExtraFlags, Flags, VersionArg, deprecated_in_use, normalize_args};
pub use settings::{
    FlagWarning, SettingValue, WarningCategory, flag_warnings, from_file, from_flag,
};
pub use values::ValueKind;

/// Default CRI endpoint (containerd).
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// A node taint from `--register-with-taints`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    pub value: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// The resolved kubelet configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeletConfig {
    /// Node name (`--hostname-override` or the hostname, lowercased).
    pub node_name: String,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// CRI runtime endpoint.
    pub container_runtime_endpoint: String,
    /// CRI image endpoint, when different.
    pub image_service_endpoint: Option<String>,
    /// Deadline of CRI calls.
    pub runtime_request_timeout: Duration,
    /// `staticPodPath`.
    pub static_pod_path: Option<PathBuf>,
    /// `staticPodURL`.
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`, flattened.
    pub static_pod_url_header: Vec<(String, String)>,
    /// `syncFrequency`.
    pub sync_frequency: Duration,
    /// `fileCheckFrequency`.
    pub file_check_frequency: Duration,
    /// `httpCheckFrequency`.
    pub http_check_frequency: Duration,
    /// `healthzBindAddress`.
    pub healthz_bind_address: IpAddr,
    /// `healthzPort` (0 = off).
    pub healthz_port: u16,
    /// `clusterDNS`.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain`.
    pub cluster_domain: String,
    /// `resolvConf`.
    pub resolv_conf: String,
    /// `cgroupDriver`.
    pub cgroup_driver: kubelet_types::CgroupDriver,
    /// `cgroupRoot`.
    pub cgroup_root: String,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// `--image-credential-provider-config` (flag only, as upstream).
    pub image_credential_provider_config: Option<PathBuf>,
    /// `--image-credential-provider-bin-dir` (flag only, as upstream).
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// `maxPods`.
    pub max_pods: u32,
    /// `--node-ip`.
    pub node_ips: Vec<IpAddr>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints` / `registerWithTaints`.
    pub register_with_taints: Vec<Taint>,
    /// `--provider-id`.
    pub provider_id: Option<String>,
    /// `--pod-infra-container-image`.
    pub pod_infra_container_image: Option<String>,
    /// `featureGates`.
    pub feature_gates: BTreeMap<String, bool>,
    /// klog verbosity.
    pub verbosity: u8,
    /// `--logging-format` / `logging.format`: klog text or JSON lines.
    pub logging_format: logs::LogFormat,
    /// Cluster-mode settings.
    pub cluster: ClusterConfig,
    /// `--lock-file`: held with an exclusive flock while the kubelet runs.
    pub lock_file: Option<PathBuf>,
    /// `--exit-on-lock-contention`: exit when another process opens the lock file.
    pub exit_on_lock_contention: bool,
    /// KubeletConfiguration fields kubelet-rs accepts but does not act on
    /// yet, resolved flag over file: field path (`imageGCHighThresholdPercent`,
    /// `authentication.webhook.enabled`) -> value. Absent means upstream's default.
    pub settings: BTreeMap<&'static str, SettingValue>,
    /// The node API's settings (10250 and the read-only port).
    pub server: server::ServerConfig,
    /// Garbage collection, log rotation, eviction and node shutdown.
    pub housekeeping: housekeeping::Housekeeping,
    /// Command-line-only upstream flags kubelet-rs ignores (not implemented,
    /// or removed upstream), as given: flag name -> value.
    pub ignored_flags: BTreeMap<&'static str, SettingValue>,
}

/// A configuration value that is not allowed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read or decoded.
    #[error(transparent)]
    File(#[from] FileError),
    /// One field has a value that is not allowed.
    #[error("invalid value for {field}: {value:?}: {allowed}")]
    Invalid {
        /// Flag or field name.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

fn invalid(
    field: &'static str,
    value: impl Into<String>,
    allowed: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.into(),
        allowed: allowed.into(),
    }
}

fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// Flag over file over default, where an empty/zero file value means "unset".
fn pick<T>(flag: Option<T>, file: Option<T>, default: T) -> T {
    flag.or(file).unwrap_or(default)
}

fn duration_field(
    field: &'static str,
    flag: Option<String>,
    file: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let from_flag = flag.is_some();
    let Some(text) = flag.or(file) else {
        return Ok(default);
    };
    let d = parse_go_duration(&text).map_err(|e| {
        invalid(
            field,
            &text,
            format!("a Go duration such as 20s or 1m0s ({e})"),
        )
    })?;
    if d.is_zero() {
        if from_flag {
            return Err(invalid(field, text, "a duration greater than 0"));
        }
        return Ok(default);
    }
    Ok(d)
}

fn parse_kv_list(field: &'static str, s: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| invalid(field, item, "key=value pairs separated by commas"))?;
        if k.is_empty() {
            return Err(invalid(field, item, "a non-empty key"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

fn parse_taint(field: &'static str, s: &str) -> Result<Taint, ConfigError> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| invalid(field, s, "key=value:Effect or key:Effect"))?;
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    if key.is_empty() {
        return Err(invalid(field, s, "a non-empty taint key"));
    }
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(invalid(
            field,
            s,
            "effect NoSchedule, PreferNoSchedule or NoExecute",
        ));
    }
    Ok(Taint {
        key: key.into(),
        value: value.into(),
        effect: effect.into(),
    })
}

fn parse_gates(s: &str) -> Result<BTreeMap<String, bool>, ConfigError> {
    let mut out = BTreeMap::new();
    for (k, v) in parse_kv_list("--feature-gates", s)? {
        let b = values::parse_go_bool(&v).map_err(|_| {
            invalid(
                "--feature-gates",
                format!("{k}={v}"),
                "Name=true or Name=false",
            )
        })?;
        out.insert(k, b);
    }
    Ok(out)
}

fn parse_headers(items: &[String]) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = vec![];
    for item in items
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (k, v) = item.split_once(':').ok_or_else(|| {
            invalid(
                "--manifest-url-header",
                item,
                "key:value, repeated or separated by commas",
            )
        })?;
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

impl KubeletConfig {
    /// Resolves flags and an optional config file against the defaults.
    /// `hostname` is the machine's hostname (the default node name).
    pub fn resolve(
        flags: &Flags,
        file: Option<&KubeletConfiguration>,
        hostname: &str,
    ) -> Result<Self, ConfigError> {
        let empty = KubeletConfiguration::default();
        let f = file.unwrap_or(&empty);
        let node_name = nonempty(flags.hostname_override.clone())
            .unwrap_or_else(|| hostname.to_string())
            .trim()
            .to_lowercase();
        if node_name.is_empty() {
            return Err(invalid(
                "--hostname-override",
                "",
                "a node name (the hostname is empty)",
            ));
        }
        let root_dir = flags
            .root_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet"));
        let cert_dir = flags
            .cert_dir
            .clone()
            .unwrap_or_else(|| root_dir.join("pki"));

        let healthz_port = pick(
            flags.healthz_port,
            f.healthz_port.filter(|p| *p != 0),
            10248,
        );
        let healthz_port = u16::try_from(healthz_port)
            .map_err(|_| invalid("healthzPort", healthz_port.to_string(), "0 to 65535"))?;
        let healthz_addr = pick(
            flags.healthz_bind_address.clone(),
            nonempty(f.healthz_bind_address.clone()),
            "127.0.0.1".to_string(),
        );
        let healthz_bind_address = healthz_addr
            .parse()
            .map_err(|_| invalid("healthzBindAddress", &healthz_addr, "an IP address"))?;

        let max_pods = pick(flags.max_pods, f.max_pods.filter(|m| *m != 0), 110);
        let max_pods = u32::try_from(max_pods)
            .map_err(|_| invalid("maxPods", max_pods.to_string(), "a number >= 0"))?;

        let cgroup_driver = pick(
            flags.cgroup_driver.clone(),
            nonempty(f.cgroup_driver.clone()),
            "cgroupfs".into(),
        );
        let cgroup_driver: kubelet_types::CgroupDriver = match cgroup_driver.parse() {
            Ok(d) => d,
            Err(_) => {
                return Err(invalid(
                    "cgroupDriver",
                    cgroup_driver,
                    "cgroupfs or systemd",
                ));
            }
        };

        let cluster_dns = match &flags.cluster_dns {
            Some(s) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            None => f.cluster_dns.clone().unwrap_or_default(),
        };
        for ip in &cluster_dns {
            ip.parse::<IpAddr>()
                .map_err(|_| invalid("clusterDNS", ip, "IP addresses"))?;
        }

        let node_ips = match &flags.node_ip {
            Some(s) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|ip| {
                    ip.parse()
                        .map_err(|_| invalid("--node-ip", ip, "IP addresses separated by commas"))
                })
                .collect::<Result<Vec<IpAddr>, _>>()?,
            None => vec![],
        };

        let node_labels = match &flags.node_labels {
            Some(s) => parse_kv_list("--node-labels", s)?,
            None => BTreeMap::new(),
        };

        let register_with_taints = match (&flags.register_with_taints, &f.register_with_taints) {
            (Some(s), _) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|t| parse_taint("--register-with-taints", t))
                .collect::<Result<_, _>>()?,
            (None, Some(list)) => list
                .iter()
                .map(|v| {
                    let get = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
                    let text = format!("{}={}:{}", get("key"), get("value"), get("effect"));
                    parse_taint("registerWithTaints", &text)
                })
                .collect::<Result<_, _>>()?,
            (None, None) => vec![],
        };

        let mut feature_gates = f.feature_gates.clone().unwrap_or_default();
        if let Some(s) = &flags.feature_gates {
            feature_gates.extend(parse_gates(s)?);
        }

        let static_pod_url = flags
            .manifest_url
            .clone()
            .or_else(|| f.static_pod_url.clone())
            .filter(|s| !s.is_empty());
        let static_pod_url_header = if flags.manifest_url_header.is_empty() {
            f.static_pod_url_header
                .iter()
                .flatten()
                .flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v.clone())))
                .collect()
        } else {
            parse_headers(&flags.manifest_url_header)?
        };
        if let Some(u) = &static_pod_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err(invalid("staticPodURL", u, "an http:// or https:// URL"));
        }

        let verbosity = pick(
            flags.verbosity,
            f.logging.as_ref().and_then(|l| l.verbosity),
            0,
        );
        if verbosity > 10 {
            return Err(invalid("--v", verbosity.to_string(), "0 to 10"));
        }
        let logging_format = logs::resolve_format(flags, f)?;

        let lock_file = flags
            .lock_file
            .clone()
            .filter(|p| !p.as_os_str().is_empty());
        let exit_on_lock_contention = flags.exit_on_lock_contention.unwrap_or(false);
        if exit_on_lock_contention && lock_file.is_none() {
            return Err(invalid(
                "--exit-on-lock-contention",
                "true",
                "a --lock-file (cannot exit on lock file contention: no lock file specified)",
            ));
        }

        let mut settings = settings::resolve_settings(flags, f)?;
        // v1beta1 defaults failCgroupV1 to true since 1.35; flags alone keep
        // the legacy default, false (upstream `applyLegacyDefaults`).
        if file.is_some() {
            settings
                .entry("failCgroupV1")
                .or_insert(SettingValue::Bool(true));
        }
        if let Some(b) = f
            .other
            .get("singleProcessOOMKill")
            .and_then(|v| v.as_bool())
        {
            settings.insert("singleProcessOOMKill", SettingValue::Bool(b));
        }
        let cluster = cluster::resolve(flags, f)?;
        let from_flags = settings::resolve_settings(flags, &empty)?;
        let server = server::resolve(
            &settings,
            &from_flags,
            cluster.port,
            file.is_some(),
            f.other
                .get("enableDebugFlagsHandler")
                .and_then(serde_json::Value::as_bool),
        )?;
        let housekeeping = housekeeping::resolve(&housekeeping::Inputs {
            flags,
            file: f,
            settings: &settings,
        })?;
        let cfg = Self {
            node_name,
            root_dir,
            cert_dir,
            kubeconfig: flags.kubeconfig.clone(),
            bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
            container_runtime_endpoint: pick(
                nonempty(flags.container_runtime_endpoint.clone()),
                nonempty(f.container_runtime_endpoint.clone()),
                DEFAULT_RUNTIME_ENDPOINT.into(),
            ),
            image_service_endpoint: nonempty(flags.image_service_endpoint.clone())
                .or_else(|| nonempty(f.image_service_endpoint.clone())),
            runtime_request_timeout: duration_field(
                "runtimeRequestTimeout",
                flags.runtime_request_timeout.clone(),
                f.runtime_request_timeout.clone(),
                Duration::from_secs(120),
            )?,
            static_pod_path: pick(
                flags.pod_manifest_path.clone().map(Some),
                nonempty(f.static_pod_path.clone()).map(|p| Some(PathBuf::from(p))),
                None,
            ),
            static_pod_url,
            static_pod_url_header,
            sync_frequency: duration_field(
                "syncFrequency",
                flags.sync_frequency.clone(),
                f.sync_frequency.clone(),
                Duration::from_secs(60),
            )?,
            file_check_frequency: duration_field(
                "fileCheckFrequency",
                flags.file_check_frequency.clone(),
                f.file_check_frequency.clone(),
                Duration::from_secs(20),
            )?,
            http_check_frequency: duration_field(
                "httpCheckFrequency",
                flags.http_check_frequency.clone(),
                f.http_check_frequency.clone(),
                Duration::from_secs(20),
            )?,
            healthz_bind_address,
            healthz_port,
            cluster_dns,
            cluster_domain: pick(
                flags.cluster_domain.clone(),
                f.cluster_domain.clone(),
                String::new(),
            ),
            resolv_conf: pick(
                flags.resolv_conf.clone(),
                nonempty(f.resolv_conf.clone()),
                "/etc/resolv.conf".into(),
            ),
            cgroup_driver,
            cgroup_root: pick(
                flags.cgroup_root.clone(),
                nonempty(f.cgroup_root.clone()),
                "/".into(),
            ),
            image_credential_provider_config: flags.image_credential_provider_config.clone(),
            image_credential_provider_bin_dir: flags.image_credential_provider_bin_dir.clone(),
            pod_logs_dir: PathBuf::from(pick(
                None,
                nonempty(f.pod_logs_dir.clone()),
                "/var/log/pods".into(),
            )),
            max_pods,
            node_ips,
            node_labels,
            register_with_taints,
            provider_id: nonempty(flags.provider_id.clone())
                .or_else(|| nonempty(f.provider_id.clone())),
            pod_infra_container_image: nonempty(flags.pod_infra_container_image.clone()),
            feature_gates,
            verbosity,
            logging_format,
            cluster,
            lock_file,
            exit_on_lock_contention,
            server,
            housekeeping,
            settings,
            ignored_flags: settings::ignored_flags(flags)?,
        };
        cri::endpoint_path(&cfg.container_runtime_endpoint).map_err(|e| {
            invalid(
                "containerRuntimeEndpoint",
                &cfg.container_runtime_endpoint,
                e.to_string(),
            )
        })?;
        if !cfg.pod_logs_dir.is_absolute() {
            return Err(invalid(
                "podLogsDir",
                cfg.pod_logs_dir.display().to_string(),
                "an absolute path",
            ));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags(args: &[&str]) -> Flags {
        let mut v = vec!["kubelet-rs"];
        v.extend_from_slice(args);
        Flags::try_parse_from(v).expect("flags parse")
    }

    const KUBEADM_FILE: &str = r#"
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {cacheTTL: 0s, enabled: true}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: systemd
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
staticPodPath: /etc/kubernetes/manifests
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"#;

    #[test]
    fn kubeadm_zero_values_mean_defaults() {
        let (file, ignored) = KubeletConfiguration::parse(KUBEADM_FILE).expect("parse");
        assert!(ignored.is_empty(), "{ignored:?}");
        let c = KubeletConfig::resolve(&flags(&[]), Some(&file), "Node-A").expect("resolve");
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.sync_frequency, Duration::from_secs(60));
        assert_eq!(c.file_check_frequency, Duration::from_secs(20));
        assert_eq!(c.http_check_frequency, Duration::from_secs(20));
        assert_eq!(c.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(c.cgroup_driver, kubelet_types::CgroupDriver::Systemd);
        assert_eq!(c.cluster_dns, vec!["10.96.0.10"]);
        assert_eq!(
            c.static_pod_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert_eq!(c.healthz_port, 10248);
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.container_runtime_endpoint, DEFAULT_RUNTIME_ENDPOINT);
    }

    #[test]
    fn explicit_flags_beat_the_file() {
        let (file, _) = KubeletConfiguration::parse(KUBEADM_FILE).expect("parse");
        let f = flags(&[
            "--cgroup-driver=cgroupfs",
            "--pod-manifest-path",
            "/srv/manifests",
            "--sync-frequency=30s",
            "--healthz-port=0",
            "--hostname-override=Worker-1",
            "--v=4",
        ]);
        let c = KubeletConfig::resolve(&f, Some(&file), "h").expect("resolve");
        assert_eq!(c.cgroup_driver, kubelet_types::CgroupDriver::Cgroupfs);
        assert_eq!(c.static_pod_path, Some(PathBuf::from("/srv/manifests")));
        assert_eq!(c.sync_frequency, Duration::from_secs(30));
        assert_eq!(c.healthz_port, 0);
        assert_eq!(c.node_name, "worker-1");
        assert_eq!(c.verbosity, 4);
        // Not given on the command line: the file's value stays.
        assert_eq!(c.cluster_domain, "cluster.local");
    }

    #[test]
    fn defaults_without_file() {
        let c = KubeletConfig::resolve(&flags(&[]), None, "h").expect("resolve");
        assert_eq!(c.root_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(c.cert_dir, PathBuf::from("/var/lib/kubelet/pki"));
        assert_eq!(c.pod_logs_dir, PathBuf::from("/var/log/pods"));
        assert_eq!(c.static_pod_path, None);
        assert_eq!(c.healthz_bind_address.to_string(), "127.0.0.1");
    }

    #[test]
    fn kubeadm_flags_env_is_accepted() {
        let f = flags(&[
            "--container-runtime=remote",
            "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
            "--network-plugin=cni",
            "--pod-infra-container-image=registry.k8s.io/pause:3.9",
            "--register-with-taints=node-role.kubernetes.io/control-plane:NoSchedule,dedicated=infra:NoExecute",
            "--node-labels=a=b,topology.kubernetes.io/zone=z1",
            "--node-ip=10.0.0.5",
            "--fail-swap-on=false",
            "--manifest-url-header=Authorization:Bearer x",
            "--manifest-url-header=X-A:1,X-B:2",
        ]);
        let c = KubeletConfig::resolve(&f, None, "h").expect("resolve");
        assert_eq!(c.register_with_taints.len(), 2);
        assert_eq!(c.register_with_taints[1].value, "infra");
        assert_eq!(
            c.node_labels
                .get("topology.kubernetes.io/zone")
                .map(String::as_str),
            Some("z1")
        );
        assert_eq!(c.static_pod_url_header.len(), 3);
        assert_eq!(deprecated_in_use(&f).len(), 3);
    }

    #[test]
    fn invalid_values_name_field_value_and_allowed() {
        let cases: &[(&[&str], &str)] = &[
            (&["--cgroup-driver=foo"], "cgroupDriver"),
            (&["--sync-frequency=soon"], "syncFrequency"),
            (&["--sync-frequency=0s"], "syncFrequency"),
            (
                &["--register-with-taints=a=b:Sometimes"],
                "--register-with-taints",
            ),
            (&["--node-ip=not-an-ip"], "--node-ip"),
            (&["--feature-gates=A=yes"], "--feature-gates"),
            (
                &["--container-runtime-endpoint=tcp://1.2.3.4:1"],
                "containerRuntimeEndpoint",
            ),
            (&["--healthz-port=70000"], "healthzPort"),
            (&["--manifest-url=ftp://x"], "staticPodURL"),
        ];
        for (args, field) in cases {
            let err = KubeletConfig::resolve(&flags(args), None, "h").expect_err("invalid");
            let text = err.to_string();
            assert!(text.contains(field), "{args:?}: {text}");
        }
        assert!(Flags::try_parse_from(["kubelet-rs", "--no-such-flag"]).is_err());
    }

    #[test]
    fn config_file_kind_and_unknown_fields() {
        assert!(KubeletConfiguration::parse("apiVersion: v1\nkind: Pod\n").is_err());
        let (_, ignored) = KubeletConfiguration::parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmadeUpField: 1\n",
        )
        .expect("lenient");
        assert_eq!(ignored, vec!["madeUpField"]);
        let json = r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","maxPods":30,"syncFrequency":"10s"}"#;
        let (f, _) = KubeletConfiguration::parse(json).expect("json");
        let c = KubeletConfig::resolve(&Flags::default(), Some(&f), "h").expect("resolve");
        assert_eq!(
            (c.max_pods, c.sync_frequency),
            (30, Duration::from_secs(10))
        );
    }
}
