//! Command-line flags with upstream names (`cmd/kubelet/app/options`).
//!
//! Every flag is optional here so that [`super::resolve`] can tell an explicit
//! flag from an unset one: explicit flags win over the `--config` file, which
//! wins over defaults (upstream `kubeletConfigFlagPrecedence`). The flags
//! kubelet-rs acts on are typed fields; every other flag an upstream kubelet
//! 1.19..1.34 accepts ([`crate::flag_table`]) lands, checked against its Go
//! value syntax, in [`Flags::extra`] and is warned about, never a startup
//! failure. As with pflag, `--flag=value` and `--flag value` both work, a
//! value may start with `-`, and `_` in a flag name means `-`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command, Parser};

use crate::flag_table::{FLAGS, FlagKind, UpstreamFlag};
use crate::values::{parse_go_bool, parse_go_float, parse_go_int};

fn go_bool(v: &str) -> Result<bool, String> {
    parse_go_bool(v)
}

/// pflag `int32`: `strconv.ParseInt(v, 0, 32)` (so `0x20` and `-1` work).
fn go_i32(v: &str) -> Result<i32, String> {
    parse_go_int(v, 32).and_then(|n| i32::try_from(n).map_err(|e| e.to_string()))
}

/// A number flag upstream declares int32 and kubelet-rs keeps as f64.
fn go_f64(v: &str) -> Result<f64, String> {
    match parse_go_int(v, 64) {
        // Exact for any rate a kubelet is given (below 2^53).
        Ok(n) => Ok(n as f64),
        Err(_) => parse_go_float(v),
    }
}

/// `--version`'s value (component-base `verflag`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VersionArg {
    /// Not given, or false.
    #[default]
    Off,
    /// `--version`, `--version=true`, `--version=raw`: print it and exit.
    Print,
    /// `--version=vX.Y.Z` ("sets the reported version"): the kubelet runs
    /// and its Node reports this version (`kubelet_types::version`).
    Report(String),
}

impl VersionArg {
    /// Whether to print the version and exit.
    pub fn prints(&self) -> bool {
        *self == Self::Print
    }
}

/// verflag: `--version` and `--version=raw` print the version; a bool turns it
/// on or off; `--version=vX.Y.Z` sets the version the Node reports.
fn version_flag(v: &str) -> Result<VersionArg, String> {
    match v {
        "raw" => Ok(VersionArg::Print),
        _ if v.starts_with('v') => Ok(VersionArg::Report(v.to_string())),
        _ => parse_go_bool(v).map(|b| {
            if b {
                VersionArg::Print
            } else {
                VersionArg::Off
            }
        }),
    }
}

/// kubelet-rs command line.
#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "kubelet-rs",
    about = "kubelet-rs: a Kubernetes node agent. Runs pods from static manifests, a manifest URL and (in cluster mode) the apiserver on a CRI runtime such as containerd.",
    disable_version_flag = true,
    // pflag: a scalar flag given twice takes the last value.
    args_override_self = true
)]
pub struct Flags {
    /// Print the Kubernetes version this kubelet implements (kubeadm parses
    /// it) and exit; `--version=vX.Y.Z` instead sets the version the Node reports.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = version_flag, action = ArgAction::Set)]
    pub version: VersionArg,

    /// Path to a KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON).
    #[arg(long, allow_hyphen_values = true)]
    pub config: Option<PathBuf>,
    /// Path to a kubeconfig for the apiserver (cluster mode).
    #[arg(long, allow_hyphen_values = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Path to a bootstrap kubeconfig used to get a client certificate.
    #[arg(long, allow_hyphen_values = true)]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// CRI runtime endpoint, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long, allow_hyphen_values = true)]
    pub container_runtime_endpoint: Option<String>,
    /// CRI image service endpoint (defaults to the runtime endpoint).
    #[arg(long, allow_hyphen_values = true)]
    pub image_service_endpoint: Option<String>,
    /// Node name to use instead of the hostname.
    #[arg(long, allow_hyphen_values = true)]
    pub hostname_override: Option<String>,
    /// IP address(es) of the node (comma-separated).
    #[arg(long, allow_hyphen_values = true)]
    pub node_ip: Option<String>,
    /// Labels to add when registering the node (key=value,...).
    #[arg(long, allow_hyphen_values = true)]
    pub node_labels: Option<String>,
    /// Taints to add when registering the node (key=value:Effect,...).
    #[arg(long, allow_hyphen_values = true)]
    pub register_with_taints: Option<String>,
    /// Directory for kubelet files (volumes, plugins, pod data).
    #[arg(long, allow_hyphen_values = true)]
    pub root_dir: Option<PathBuf>,
    /// Directory for TLS certificates.
    #[arg(long, allow_hyphen_values = true)]
    pub cert_dir: Option<PathBuf>,
    /// Directory of static pod manifests (staticPodPath).
    #[arg(long, allow_hyphen_values = true)]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL serving static pod manifests (staticPodURL).
    #[arg(long, allow_hyphen_values = true)]
    pub manifest_url: Option<String>,
    /// HTTP header for --manifest-url, as 'key:value'; may be repeated or comma-separated.
    #[arg(long, action = ArgAction::Append, allow_hyphen_values = true)]
    pub manifest_url_header: Vec<String>,
    /// Pause image; with a CRI runtime the runtime's own setting wins (kept for image GC pinning).
    #[arg(long, allow_hyphen_values = true)]
    pub pod_infra_container_image: Option<String>,
    /// cgroup driver: cgroupfs or systemd (must match the runtime's).
    #[arg(long, allow_hyphen_values = true)]
    pub cgroup_driver: Option<String>,
    /// Deadline for every CRI call except long-running ones (e.g. 2m0s).
    #[arg(long, allow_hyphen_values = true)]
    pub runtime_request_timeout: Option<String>,
    /// Maximum pods on this node.
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub max_pods: Option<i32>,
    /// Log verbosity (klog levels: 0-10).
    #[arg(long = "v", short = 'v')]
    pub verbosity: Option<u8>,
    /// Feature gates as key=bool pairs.
    #[arg(long, allow_hyphen_values = true)]
    pub feature_gates: Option<String>,
    /// Cluster DNS server IPs (comma-separated).
    #[arg(long, allow_hyphen_values = true)]
    pub cluster_dns: Option<String>,
    /// Cluster domain, e.g. cluster.local.
    #[arg(long, allow_hyphen_values = true)]
    pub cluster_domain: Option<String>,
    /// resolv.conf used as the base for pod DNS ("" disables).
    #[arg(long, allow_hyphen_values = true)]
    pub resolv_conf: Option<String>,
    /// Root cgroup for pods.
    #[arg(long, allow_hyphen_values = true)]
    pub cgroup_root: Option<String>,
    /// Address of the healthz endpoint.
    #[arg(long, allow_hyphen_values = true)]
    pub healthz_bind_address: Option<String>,
    /// Port of the healthz endpoint (0 disables).
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub healthz_port: Option<i32>,
    /// How often static manifests are re-read (e.g. 20s).
    #[arg(long, allow_hyphen_values = true)]
    pub file_check_frequency: Option<String>,
    /// How often the manifest URL is polled (e.g. 20s).
    #[arg(long, allow_hyphen_values = true)]
    pub http_check_frequency: Option<String>,
    /// How often running pods are re-synced (e.g. 1m).
    #[arg(long, allow_hyphen_values = true)]
    pub sync_frequency: Option<String>,

    // === accepted for compatibility with kubeadm and older nodes ===
    /// Deprecated: the runtime is always remote (CRI).
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub container_runtime: Option<String>,
    /// Deprecated: CNI is the runtime's job with containerd.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub network_plugin: Option<String>,
    /// Deprecated: CNI is the runtime's job.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub cni_bin_dir: Option<String>,
    /// Deprecated: CNI is the runtime's job.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub cni_conf_dir: Option<String>,
    /// Cloud provider: "" or "external" (a cloud-controller-manager initializes the node).
    #[arg(long, allow_hyphen_values = true)]
    pub cloud_provider: Option<String>,
    /// Provider ID for the Node object.
    #[arg(long, allow_hyphen_values = true)]
    pub provider_id: Option<String>,
    /// Whether to register the node.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub register_node: Option<bool>,
    /// Fail if swap is on.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub fail_swap_on: Option<bool>,
    /// Rotate the client certificate.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub rotate_certificates: Option<bool>,
    /// Request a serving certificate from the apiserver.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub rotate_server_certificates: Option<bool>,
    /// Resources reserved for Kubernetes daemons.
    #[arg(long, allow_hyphen_values = true)]
    pub kube_reserved: Option<String>,
    /// Resources reserved for the OS.
    #[arg(long, allow_hyphen_values = true)]
    pub system_reserved: Option<String>,
    /// Hard eviction thresholds.
    #[arg(long, allow_hyphen_values = true)]
    pub eviction_hard: Option<String>,
    /// Minimum age of a dead container before container GC may remove it
    /// (deprecated upstream, still honoured).
    #[arg(long, allow_hyphen_values = true)]
    pub minimum_container_ttl_duration: Option<String>,
    /// Dead instances kept per container by container GC (deprecated upstream).
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub maximum_dead_containers_per_container: Option<i32>,
    /// Dead containers kept on the node by container GC, -1 for no limit
    /// (deprecated upstream).
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub maximum_dead_containers: Option<i32>,
    /// Credential provider plugin configuration (upstream
    /// `CredentialProviderConfig`), read at start.
    #[arg(long, allow_hyphen_values = true)]
    pub image_credential_provider_config: Option<PathBuf>,
    /// Directory holding the credential provider plugin binaries.
    #[arg(long, allow_hyphen_values = true)]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// Read-only port (0 disables).
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub read_only_port: Option<i32>,
    /// Anonymous requests to the kubelet API.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub anonymous_auth: Option<bool>,
    /// Authorization mode of the kubelet API.
    #[arg(long, allow_hyphen_values = true)]
    pub authorization_mode: Option<String>,
    /// CA bundle for client certificates.
    #[arg(long, allow_hyphen_values = true)]
    pub client_ca_file: Option<String>,
    /// Serving certificate.
    #[arg(long, allow_hyphen_values = true)]
    pub tls_cert_file: Option<String>,
    /// Serving key.
    #[arg(long, allow_hyphen_values = true)]
    pub tls_private_key_file: Option<String>,
    /// How often the node status is computed (nodeStatusUpdateFrequency, e.g. 10s).
    #[arg(long, allow_hyphen_values = true)]
    pub node_status_update_frequency: Option<String>,
    /// Requests per second to the apiserver (kubeAPIQPS).
    #[arg(long, allow_hyphen_values = true, value_parser = go_f64)]
    pub kube_api_qps: Option<f64>,
    /// Burst of requests to the apiserver (kubeAPIBurst).
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub kube_api_burst: Option<i32>,
    /// Events per second (eventRecordQPS).
    #[arg(long, allow_hyphen_values = true, value_parser = go_f64)]
    pub event_qps: Option<f64>,
    /// Burst of events (eventBurst).
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub event_burst: Option<i32>,
    /// Port of the kubelet API, reported in the Node's daemonEndpoints.
    #[arg(long, allow_hyphen_values = true, value_parser = go_i32)]
    pub port: Option<i32>,
    /// cgroups of the container runtime.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub runtime_cgroups: Option<String>,
    /// Path of a file the kubelet holds an exclusive flock on while it runs.
    #[arg(long, allow_hyphen_values = true)]
    pub lock_file: Option<PathBuf>,
    /// Exit when another process opens the --lock-file (bootstrap hand-over).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = go_bool)]
    pub exit_on_lock_contention: Option<bool>,

    /// Every other upstream flag (must stay the last field: it skips names
    /// the fields above define).
    #[command(flatten)]
    pub extra: ExtraFlags,
}

impl Flags {
    /// Parses a command line (program name first) the way the upstream
    /// kubelet's pflag set does: `_` in flag names means `-`.
    pub fn parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        Self::try_parse_from(normalize_args(args))
    }
}

/// Applies upstream's `WordSepNormalizeFunc` to long flag names
/// (`--iptables_drop_bit=1` is `--iptables-drop-bit=1`); values, the program
/// name and everything after `--` are left alone.
pub fn normalize_args<I, T>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut done = false;
    args.into_iter()
        .map(Into::into)
        .enumerate()
        .map(|(i, arg)| {
            if i == 0 || done {
                return arg;
            }
            match arg.to_str() {
                Some("--") => {
                    done = true;
                    arg
                }
                Some(text) if text.len() > 2 && text.starts_with("--") => {
                    let (name, value) = text.split_at(text.find('=').unwrap_or(text.len()));
                    OsString::from(format!("{}{value}", name.replace('_', "-")))
                }
                _ => arg,
            }
        })
        .collect()
}

/// The upstream flags kubelet-rs has no typed field for, as given: name ->
/// raw values in command-line order (each already checked against its Go
/// value syntax by the parser).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraFlags {
    values: BTreeMap<&'static str, Vec<String>>,
}

impl ExtraFlags {
    /// The raw values given for a flag, in order.
    pub fn get(&self, name: &str) -> Option<&[String]> {
        self.values.get(name).map(Vec::as_slice)
    }

    /// Every given flag with its table entry.
    pub fn iter(&self) -> impl Iterator<Item = (&'static UpstreamFlag, &[String])> {
        FLAGS
            .iter()
            .filter_map(|f| self.values.get(f.name).map(|v| (f, v.as_slice())))
    }

    /// Adds a value as `--name=value` would (for callers that build flags in
    /// code). The name must be in the upstream table and the value valid.
    pub fn push(&mut self, name: &str, value: &str) -> Result<(), String> {
        let f = crate::flag_table::lookup(name).ok_or_else(|| format!("unknown flag --{name}"))?;
        f.value.check(value)?;
        self.values
            .entry(f.name)
            .or_default()
            .push(value.to_string());
        Ok(())
    }

    /// Forgets every value given for a flag, as if it had not been given.
    pub fn remove(&mut self, name: &str) {
        self.values.remove(name);
    }
}

fn help_for(f: &UpstreamFlag) -> String {
    match (f.kind, f.field) {
        (FlagKind::Config, Some(field)) if f.acted_on => format!("KubeletConfiguration {field}"),
        (FlagKind::Config, Some(field)) => {
            format!("KubeletConfiguration {field}: accepted, not implemented by kubelet-rs")
        }
        (FlagKind::Removed(v), _) => format!("Removed upstream in {v}; no effect"),
        _ => "Upstream kubelet flag: accepted, not implemented by kubelet-rs".into(),
    }
}

fn arg_for(f: &'static UpstreamFlag) -> Arg {
    let kind = f.value;
    let arg = Arg::new(f.name)
        .long(f.name)
        .action(ArgAction::Append)
        .value_parser(move |v: &str| kind.check(v).map(|()| v.to_string()))
        .hide(matches!(f.kind, FlagKind::Removed(_)))
        .help(help_for(f));
    if kind.is_bool() {
        arg.num_args(0..=1).default_missing_value("true")
    } else {
        arg.num_args(1).allow_hyphen_values(true)
    }
}

impl clap::FromArgMatches for ExtraFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut out = Self::default();
        out.update_from_arg_matches(m)?;
        Ok(out)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for f in FLAGS {
            // Names that a typed field defines are not arguments of ours.
            if let Ok(Some(values)) = m.try_get_many::<String>(f.name) {
                self.values.insert(f.name, values.cloned().collect());
            }
        }
        Ok(())
    }
}

impl clap::Args for ExtraFlags {
    fn augment_args(mut cmd: Command) -> Command {
        for f in FLAGS {
            let taken =
                f.name == "help" || cmd.get_arguments().any(|a| a.get_long() == Some(f.name));
            if !taken {
                cmd = cmd.arg(arg_for(f));
            }
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// Flags that exist only for compatibility: (flag, value given) pairs to warn about.
///
/// Kept for callers of the earlier API; [`crate::flag_warnings`] covers every
/// upstream flag (these included) with one categorised warning each.
pub fn deprecated_in_use(f: &Flags) -> Vec<(&'static str, String)> {
    let mut out = vec![];
    let mut note = |name: &'static str, v: &Option<String>| {
        if let Some(v) = v {
            out.push((name, v.clone()));
        }
    };
    note("--container-runtime", &f.container_runtime);
    note("--network-plugin", &f.network_plugin);
    note("--cni-bin-dir", &f.cni_bin_dir);
    note("--cni-conf-dir", &f.cni_conf_dir);
    note("--pod-infra-container-image", &f.pod_infra_container_image);
    // "external" is meaningful (a cloud-controller-manager owns addresses); other values are not.
    let cloud = f
        .cloud_provider
        .clone()
        .filter(|c| !c.is_empty() && c != "external");
    note("--cloud-provider", &cloud);
    note("--runtime-cgroups", &f.runtime_cgroups);
    out
}
