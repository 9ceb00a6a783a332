//! Settings that matter only with an apiserver: registration, node status and
//! lease periods, client and event rate limits, reserved resources (upstream
//! `KubeletConfiguration` fields and their v1beta1 defaults).

use std::collections::BTreeMap;
use std::time::Duration;

use super::file::KubeletConfiguration;
use super::flags::Flags;
use super::{ConfigError, duration_field, invalid};

/// Cluster-mode settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// `registerNode` (default true).
    pub register_node: bool,
    /// `rotateCertificates` (default false; kubeadm sets true).
    pub rotate_certificates: bool,
    /// `nodeStatusUpdateFrequency` (10s).
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency` (5m).
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds` (40).
    pub node_lease_duration_seconds: i32,
    /// `kubeAPIQPS` (50).
    pub kube_api_qps: f64,
    /// `kubeAPIBurst` (100).
    pub kube_api_burst: u32,
    /// `eventRecordQPS` (50).
    pub event_record_qps: f64,
    /// `eventBurst` (100).
    pub event_burst: u32,
    /// `kubeReserved`.
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved`.
    pub system_reserved: BTreeMap<String, String>,
    /// `evictionHard` (signal -> threshold such as `100Mi` or `10%`).
    pub eviction_hard: BTreeMap<String, String>,
    /// `port` of the kubelet API (10250).
    pub port: u16,
    /// `--cloud-provider=external`: register with the uninitialized taint and
    /// leave addresses a cloud-controller-manager set alone.
    pub external_cloud_provider: bool,
    /// The version the Node reports (`--version=vX.Y.Z`, else the control
    /// plane's when older than kubelet-rs's own).
    pub reported_version: kubelet_types::version::ReportedVersion,
}

/// Upstream's default hard eviction thresholds (Linux).
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn resource_list(field: &'static str, s: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            invalid(
                field,
                item,
                "resource=quantity pairs such as cpu=100m,memory=1Gi",
            )
        })?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

fn eviction_list(s: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item.split_once('<').ok_or_else(|| {
            invalid(
                "--eviction-hard",
                item,
                "signal<threshold such as memory.available<100Mi",
            )
        })?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

fn positive_f64(field: &'static str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    match v {
        None => Ok(default),
        Some(0.0) => Ok(default),
        Some(q) if q > 0.0 && q.is_finite() => Ok(q),
        Some(q) => Err(invalid(field, q.to_string(), "a number greater than 0")),
    }
}

fn positive_u32(field: &'static str, v: Option<i32>, default: u32) -> Result<u32, ConfigError> {
    match v {
        None | Some(0) => Ok(default),
        Some(n) => {
            u32::try_from(n).map_err(|_| invalid(field, n.to_string(), "a number greater than 0"))
        }
    }
}

/// Resolves the cluster settings: flag over file over default.
pub fn resolve(flags: &Flags, f: &KubeletConfiguration) -> Result<ClusterConfig, ConfigError> {
    let eviction_hard = match (&flags.eviction_hard, &f.eviction_hard) {
        (Some(s), _) => eviction_list(s)?,
        (None, Some(m)) => m.clone(),
        (None, None) => default_eviction_hard(),
    };
    let kube_reserved = match (&flags.kube_reserved, &f.kube_reserved) {
        (Some(s), _) => resource_list("--kube-reserved", s)?,
        (None, m) => m.clone().unwrap_or_default(),
    };
    let system_reserved = match (&flags.system_reserved, &f.system_reserved) {
        (Some(s), _) => resource_list("--system-reserved", s)?,
        (None, m) => m.clone().unwrap_or_default(),
    };
    let port = flags.port.or(f.port).filter(|p| *p != 0).unwrap_or(10250);
    let port = u16::try_from(port).map_err(|_| invalid("port", port.to_string(), "1 to 65535"))?;
    let lease = f
        .node_lease_duration_seconds
        .filter(|s| *s != 0)
        .unwrap_or(40);
    if lease < 0 {
        return Err(invalid(
            "nodeLeaseDurationSeconds",
            lease.to_string(),
            "a number greater than 0",
        ));
    }
    Ok(ClusterConfig {
        register_node: flags.register_node.or(f.register_node).unwrap_or(true),
        rotate_certificates: flags
            .rotate_certificates
            .or(f.rotate_certificates)
            .unwrap_or(false),
        node_status_update_frequency: duration_field(
            "nodeStatusUpdateFrequency",
            flags.node_status_update_frequency.clone(),
            f.node_status_update_frequency.clone(),
            Duration::from_secs(10),
        )?,
        node_status_report_frequency: duration_field(
            "nodeStatusReportFrequency",
            None,
            f.node_status_report_frequency.clone(),
            Duration::from_secs(300),
        )?,
        node_lease_duration_seconds: lease,
        kube_api_qps: positive_f64("kubeAPIQPS", flags.kube_api_qps.or(f.kube_api_qps), 50.0)?,
        kube_api_burst: positive_u32(
            "kubeAPIBurst",
            flags.kube_api_burst.or(f.kube_api_burst),
            100,
        )?,
        event_record_qps: positive_f64(
            "eventRecordQPS",
            flags.event_qps.or(f.event_record_qps),
            50.0,
        )?,
        event_burst: positive_u32("eventBurst", flags.event_burst.or(f.event_burst), 100)?,
        kube_reserved,
        system_reserved,
        eviction_hard,
        port,
        external_cloud_provider: flags.cloud_provider.as_deref() == Some("external"),
        reported_version: match &flags.version {
            crate::flags::VersionArg::Report(v) => {
                kubelet_types::version::ReportedVersion::pinned(v)
                    .map_err(|e| invalid("version", v.clone(), format!("{e}")))?
            }
            _ => kubelet_types::version::ReportedVersion::Auto,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_match_current_upstream() {
        let c = resolve(&Flags::default(), &KubeletConfiguration::default()).expect("defaults");
        assert!(c.register_node);
        assert!(!c.rotate_certificates);
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!(c.node_lease_duration_seconds, 40);
        assert_eq!((c.kube_api_qps, c.kube_api_burst), (50.0, 100));
        assert_eq!((c.event_record_qps, c.event_burst), (50.0, 100));
        assert_eq!(c.eviction_hard["memory.available"], "100Mi");
        assert_eq!(c.port, 10250);
    }

    #[test]
    fn flags_win_and_bad_values_name_the_field() {
        let flags = Flags::try_parse_from([
            "kubelet-rs",
            "--kube-api-qps=5",
            "--kube-reserved=cpu=100m,memory=256Mi",
            "--eviction-hard=memory.available<200Mi",
            "--rotate-certificates",
        ])
        .expect("flags");
        let file = KubeletConfiguration {
            kube_api_qps: Some(20.0),
            kube_api_burst: Some(30),
            ..Default::default()
        };
        let c = resolve(&flags, &file).expect("resolve");
        assert_eq!((c.kube_api_qps, c.kube_api_burst), (5.0, 30));
        assert_eq!(c.kube_reserved["memory"], "256Mi");
        assert_eq!(c.eviction_hard.len(), 1);
        assert!(c.rotate_certificates);
        let bad = Flags::try_parse_from(["kubelet-rs", "--kube-api-qps=-1"]).expect("flags");
        let e = resolve(&bad, &file).expect_err("negative qps");
        assert!(e.to_string().contains("kubeAPIQPS"), "{e}");
    }
}
