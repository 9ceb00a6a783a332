//! A node as `kubeadm join` leaves one, for the idle benchmark (issue 28):
//! the KubeletConfiguration kubeadm writes to `/var/lib/kubelet/config.yaml`
//! (v1beta1 with kubeadm's zero-valued fields, webhook authentication and
//! authorization, client certificate rotation on) with an empty static pod
//! directory, a CSI driver registered through the plugin watcher, and a
//! device plugin registered with the device manager.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use apiserver_double::ApiServer;
use kubelet_devicemanager::stub::{self, Stub, StubConfig};
use kubelet_test_util::csi_driver::{CsiDriver, DriverConfig};

/// The device plugin's resource.
pub const RESOURCE: &str = "example.com/idle-dev";

/// Writes kubeadm's config file (the cgroup driver and `failCgroupV1: false`
/// are this cgroup v1 host's, where
/// kubeadm writes `systemd`), its CA, and the empty static pod directory;
/// returns the kubelet's `--config` flag. `IDLE_BENCH_FLUSH_FREQUENCY`
/// replaces kubeadm's `logging.flushFrequency: 0` (kubelet-rs before issue
/// 28 refused the number: give it `0s` to bench that build).
pub fn kubeadm_config(api: &ApiServer, work: &Path) -> anyhow::Result<Vec<String>> {
    let ca = work.join("ca.crt");
    std::fs::write(&ca, api.ca_pem())?;
    let manifests = work.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let flush = std::env::var("IDLE_BENCH_FLUSH_FREQUENCY").unwrap_or_else(|_| "0".into());
    let config = work.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: cgroupfs
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: \"\"
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
failCgroupV1: false
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: {flush}
  options:
    json:
      infoBufferSize: \"0\"
  verbosity: 0
memorySwap: {{}}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: {manifests}
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
",
            ca = ca.display(),
            manifests = manifests.display(),
            flush = flush,
        ),
    )?;
    Ok(vec![format!("--config={}", config.display())])
}

/// The plugins a real node runs beside its kubelet, served while this lives.
pub struct Plugins {
    _csi: CsiDriver,
    _device: Stub,
}

/// Starts a CSI driver in the kubelet's plugin directories and a device
/// plugin, and waits until the kubelet has registered both.
pub async fn register_plugins(root: &Path, node: &str) -> anyhow::Result<Plugins> {
    let data: PathBuf = root.join("idle-csi-data");
    let csi =
        CsiDriver::start_in_root(DriverConfig::new("idle.csi.example.com", node, &data), root)
            .await
            .context("CSI driver")?;
    let status = csi
        .wait_registration(Duration::from_secs(60))
        .await
        .context("the kubelet never called NotifyRegistrationStatus")?;
    anyhow::ensure!(status.registered, "CSI driver refused: {status:?}");
    let dir = root.join("device-plugins");
    let device = Stub::start(
        &dir.join("idle.sock"),
        vec![stub::device("d1", true), stub::device("d2", true)],
        StubConfig::default(),
    )
    .context("device plugin")?;
    device
        .register_v1beta1(&dir.join("kubelet.sock"), RESOURCE)
        .await
        .map_err(|s| anyhow::anyhow!("device plugin registration: {s}"))?;
    Ok(Plugins {
        _csi: csi,
        _device: device,
    })
}
