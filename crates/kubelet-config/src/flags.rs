//! Command-line flags with upstream names (`cmd/kubelet/app/options`).
//!
//! Every flag is optional here so that [`super::resolve`] can tell an explicit
//! flag from an unset one: explicit flags win over the `--config` file, which
//! wins over defaults (upstream `kubeletConfigFlagPrecedence`). Flags kubeadm
//! nodes still pass but that mean nothing with a CRI runtime are accepted and
//! warned about, never a startup failure.

use std::path::PathBuf;

use clap::Parser;

/// kubelet-rs command line.
#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "kubelet-rs",
    about = "kubelet-rs: a Kubernetes node agent. Runs pods from static manifests, a manifest URL and (in cluster mode) the apiserver on a CRI runtime such as containerd.",
    disable_version_flag = true
)]
pub struct Flags {
    /// Print the Kubernetes version this kubelet implements (kubeadm parses it) and exit.
    #[arg(long)]
    pub version: bool,

    /// Path to a KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Path to a kubeconfig for the apiserver (cluster mode).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Path to a bootstrap kubeconfig used to get a client certificate.
    #[arg(long)]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// CRI runtime endpoint, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// CRI image service endpoint (defaults to the runtime endpoint).
    #[arg(long)]
    pub image_service_endpoint: Option<String>,
    /// Node name to use instead of the hostname.
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// IP address(es) of the node (comma-separated).
    #[arg(long)]
    pub node_ip: Option<String>,
    /// Labels to add when registering the node (key=value,...).
    #[arg(long)]
    pub node_labels: Option<String>,
    /// Taints to add when registering the node (key=value:Effect,...).
    #[arg(long)]
    pub register_with_taints: Option<String>,
    /// Directory for kubelet files (volumes, plugins, pod data).
    #[arg(long)]
    pub root_dir: Option<PathBuf>,
    /// Directory for TLS certificates.
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// Directory of static pod manifests (staticPodPath).
    #[arg(long)]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL serving static pod manifests (staticPodURL).
    #[arg(long)]
    pub manifest_url: Option<String>,
    /// HTTP header for --manifest-url, as 'key:value'; may be repeated or comma-separated.
    #[arg(long, action = clap::ArgAction::Append)]
    pub manifest_url_header: Vec<String>,
    /// Pause image; with a CRI runtime the runtime's own setting wins (kept for image GC pinning).
    #[arg(long)]
    pub pod_infra_container_image: Option<String>,
    /// cgroup driver: cgroupfs or systemd (must match the runtime's).
    #[arg(long)]
    pub cgroup_driver: Option<String>,
    /// Deadline for every CRI call except long-running ones (e.g. 2m0s).
    #[arg(long)]
    pub runtime_request_timeout: Option<String>,
    /// Maximum pods on this node.
    #[arg(long)]
    pub max_pods: Option<i32>,
    /// Log verbosity (klog levels: 0-10).
    #[arg(long = "v", short = 'v')]
    pub verbosity: Option<u8>,
    /// Feature gates as key=bool pairs.
    #[arg(long)]
    pub feature_gates: Option<String>,
    /// Cluster DNS server IPs (comma-separated).
    #[arg(long)]
    pub cluster_dns: Option<String>,
    /// Cluster domain, e.g. cluster.local.
    #[arg(long)]
    pub cluster_domain: Option<String>,
    /// resolv.conf used as the base for pod DNS ("" disables).
    #[arg(long)]
    pub resolv_conf: Option<String>,
    /// Root cgroup for pods.
    #[arg(long)]
    pub cgroup_root: Option<String>,
    /// Address of the healthz endpoint.
    #[arg(long)]
    pub healthz_bind_address: Option<String>,
    /// Port of the healthz endpoint (0 disables).
    #[arg(long)]
    pub healthz_port: Option<i32>,
    /// How often static manifests are re-read (e.g. 20s).
    #[arg(long)]
    pub file_check_frequency: Option<String>,
    /// How often the manifest URL is polled (e.g. 20s).
    #[arg(long)]
    pub http_check_frequency: Option<String>,
    /// How often running pods are re-synced (e.g. 1m).
    #[arg(long)]
    pub sync_frequency: Option<String>,

    // === accepted for compatibility with kubeadm and older nodes ===
    /// Deprecated: the runtime is always remote (CRI).
    #[arg(long, hide = true)]
    pub container_runtime: Option<String>,
    /// Deprecated: CNI is the runtime's job with containerd.
    #[arg(long, hide = true)]
    pub network_plugin: Option<String>,
    /// Deprecated: CNI is the runtime's job.
    #[arg(long, hide = true)]
    pub cni_bin_dir: Option<String>,
    /// Deprecated: CNI is the runtime's job.
    #[arg(long, hide = true)]
    pub cni_conf_dir: Option<String>,
    /// Cloud provider: "" or "external" (a cloud-controller-manager initializes the node).
    #[arg(long)]
    pub cloud_provider: Option<String>,
    /// Provider ID for the Node object.
    #[arg(long)]
    pub provider_id: Option<String>,
    /// Whether to register the node.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub register_node: Option<bool>,
    /// Fail if swap is on.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub fail_swap_on: Option<bool>,
    /// Rotate the client certificate.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub rotate_certificates: Option<bool>,
    /// Request a serving certificate from the apiserver.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub rotate_server_certificates: Option<bool>,
    /// Resources reserved for Kubernetes daemons.
    #[arg(long)]
    pub kube_reserved: Option<String>,
    /// Resources reserved for the OS.
    #[arg(long)]
    pub system_reserved: Option<String>,
    /// Hard eviction thresholds.
    #[arg(long)]
    pub eviction_hard: Option<String>,
    /// Read-only port (0 disables).
    #[arg(long)]
    pub read_only_port: Option<i32>,
    /// Anonymous requests to the kubelet API.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,
    /// Authorization mode of the kubelet API.
    #[arg(long)]
    pub authorization_mode: Option<String>,
    /// CA bundle for client certificates.
    #[arg(long)]
    pub client_ca_file: Option<String>,
    /// Serving certificate.
    #[arg(long)]
    pub tls_cert_file: Option<String>,
    /// Serving key.
    #[arg(long)]
    pub tls_private_key_file: Option<String>,
    /// How often the node status is computed (nodeStatusUpdateFrequency, e.g. 10s).
    #[arg(long)]
    pub node_status_update_frequency: Option<String>,
    /// Requests per second to the apiserver (kubeAPIQPS).
    #[arg(long)]
    pub kube_api_qps: Option<f64>,
    /// Burst of requests to the apiserver (kubeAPIBurst).
    #[arg(long)]
    pub kube_api_burst: Option<i32>,
    /// Events per second (eventRecordQPS).
    #[arg(long)]
    pub event_qps: Option<f64>,
    /// Burst of events (eventBurst).
    #[arg(long)]
    pub event_burst: Option<i32>,
    /// Port of the kubelet API, reported in the Node's daemonEndpoints.
    #[arg(long)]
    pub port: Option<i32>,
    /// cgroups of the container runtime.
    #[arg(long, hide = true)]
    pub runtime_cgroups: Option<String>,
}

/// Flags that exist only for compatibility: (flag, value given) pairs to warn about.
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
