//! The `--config` file: `KubeletConfiguration` in `kubelet.config.k8s.io/v1beta1`
//! (upstream `staging/src/k8s.io/kubelet/config/v1beta1/types.go`), the fields
//! kubelet-rs reads. Unknown fields are reported and ignored, as upstream's
//! lenient decoding does; zero values mean "use the default".

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// The fields of a KubeletConfiguration file that kubelet-rs understands.
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub static_pod_path: Option<String>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    pub sync_frequency: Option<String>,
    pub file_check_frequency: Option<String>,
    pub http_check_frequency: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub healthz_port: Option<i32>,
    pub cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub runtime_request_timeout: Option<String>,
    pub max_pods: Option<i32>,
    pub resolv_conf: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    pub pod_logs_dir: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub register_with_taints: Option<Vec<serde_json::Value>>,
    pub logging: Option<Logging>,
    pub register_node: Option<bool>,
    pub rotate_certificates: Option<bool>,
    pub node_status_update_frequency: Option<String>,
    pub node_status_report_frequency: Option<String>,
    pub node_lease_duration_seconds: Option<i32>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<f64>,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i32>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: Option<f64>,
    pub event_burst: Option<i32>,
    pub kube_reserved: Option<BTreeMap<String, String>>,
    pub system_reserved: Option<BTreeMap<String, String>>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub port: Option<i32>,
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    /// Everything else: accepted, reported, ignored.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// `logging` section.
#[derive(Debug, Default, Deserialize, Clone, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Logging {
    /// klog verbosity.
    pub verbosity: Option<u8>,
    /// The rest (format, flushFrequency, vmodule, options), kept raw.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Fields kubelet-rs knows from upstream but does not act on yet (no warning for these).
const KNOWN_UNUSED: &[&str] = &[
    "address",
    "readOnlyPort",
    "authentication",
    "authorization",
    "serverTLSBootstrap",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "failSwapOn",
    "memorySwap",
    "volumeStatsAggPeriod",
    "cpuManagerPolicy",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "streamingConnectionIdleTimeout",
    "enableServer",
    "enableDebuggingHandlers",
    "enableProfilingHandler",
    "enableContentionProfiling",
    "serializeImagePulls",
    "registryPullQPS",
    "registryBurst",
    "cgroupsPerQOS",
    "enforceNodeAllocatable",
    "hairpinMode",
    "podPidsLimit",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "oomScoreAdj",
    "podCIDR",
    "kernelMemcgNotification",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "healthzBindAddress",
    "seccompDefault",
    "containerRuntimeEndpoint",
];

/// Config-file-only fields (no flag spelling) a subsystem reads through
/// [`crate::housekeeping`]: known, so not reported as ignored.
const READ_BY_SUBSYSTEMS: &[&str] = &[
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "imageMaximumGCAge",
    "shutdownGracePeriodByPodPriority",
    // Read into settings (no flag spells it upstream).
    "singleProcessOOMKill",
    // kubelet-rs only: where the node shutdown manager finds logind (the
    // system bus by default) and writes its logind drop-in.
    "shutdownSystemBusAddress",
    "shutdownLogindConfigDirectory",
];

/// Errors reading the config file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Unreadable file.
    #[error("failed to read kubelet config file {path:?}: {source}")]
    Read {
        /// File.
        path: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not YAML/JSON of the right shape.
    #[error("failed to decode kubelet config file {path:?}: {message}")]
    Decode {
        /// File.
        path: String,
        /// Parser message.
        message: String,
    },
}

impl KubeletConfiguration {
    /// Reads and checks a config file. Returns the configuration and the
    /// names of fields it ignored.
    pub fn load(path: &Path) -> Result<(Self, Vec<String>), FileError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: p.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|message| FileError::Decode { path: p, message })
    }

    /// Parses YAML or JSON text (JSON is YAML).
    pub fn parse(text: &str) -> Result<(Self, Vec<String>), String> {
        let cfg: Self = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        match cfg.kind.as_deref() {
            Some("KubeletConfiguration") => {}
            other => {
                return Err(format!(
                    "kind: expected \"KubeletConfiguration\", got {other:?}"
                ));
            }
        }
        match cfg.api_version.as_deref() {
            Some("kubelet.config.k8s.io/v1beta1" | "kubelet.config.k8s.io/v1") => {}
            other => {
                return Err(format!(
                    "apiVersion: expected \"kubelet.config.k8s.io/v1beta1\", got {other:?}"
                ));
            }
        }
        // Fields that an upstream flag sets are resolved into `settings`, not ignored.
        let backs_a_flag = |k: &str| {
            crate::flag_table::FLAGS
                .iter()
                .filter_map(|f| f.field)
                .any(|f| f.split('.').next() == Some(k))
        };
        let ignored = cfg
            .other
            .keys()
            .filter(|k| {
                !KNOWN_UNUSED.contains(&k.as_str())
                    && !READ_BY_SUBSYSTEMS.contains(&k.as_str())
                    && !backs_a_flag(k)
            })
            .cloned()
            .collect();
        Ok((cfg, ignored))
    }
}
