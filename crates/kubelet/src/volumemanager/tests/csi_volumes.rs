//! [`CsiVolumes`] without a driver: a set-up that failed before or after
//! staging keeps its device in use and is undone by the volume's
//! tear-down, an unstage stays pending (and in use) until it succeeded, and
//! a device whose staging path another mount still shows is not unstaged.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, PersistentVolume, PersistentVolumeSpec, Secret,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubelet_csi::{CsiHost, CsiPlugin, CsiVolume, Timeouts};

use super::super::csi::CsiVolumes;
use super::*;

const DRIVER: &str = "d.example.com";

/// An apiserver with one CSIDriver (no attach) and nothing else.
struct StubHost;

fn stub_error() -> kubelet_csi::Error {
    kubelet_csi::Error::InvalidSpec("not in this test".into())
}

#[async_trait::async_trait]
impl CsiHost for StubHost {
    fn node_name(&self) -> &str {
        "node-1"
    }
    async fn csi_driver(&self, name: &str) -> kubelet_csi::Result<Option<CSIDriver>> {
        Ok(Some(CSIDriver {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: CSIDriverSpec {
                attach_required: Some(false),
                ..Default::default()
            },
        }))
    }
    async fn volume_attachment(&self, _: &str) -> kubelet_csi::Result<Option<VolumeAttachment>> {
        Ok(None)
    }
    async fn persistent_volume(&self, _: &str) -> kubelet_csi::Result<Option<PersistentVolume>> {
        Ok(None)
    }
    async fn secret(&self, _: &str, _: &str) -> kubelet_csi::Result<Secret> {
        Err(stub_error())
    }
    async fn csi_node(&self, _: &str) -> kubelet_csi::Result<Option<CSINode>> {
        Ok(None)
    }
    async fn create_csi_node(&self, node: CSINode) -> kubelet_csi::Result<CSINode> {
        Ok(node)
    }
    async fn update_csi_node(&self, node: CSINode) -> kubelet_csi::Result<CSINode> {
        Ok(node)
    }
    async fn node(&self) -> kubelet_csi::Result<Option<Node>> {
        Ok(None)
    }
    async fn patch_node_metadata(
        &self,
        _: BTreeMap<String, Option<String>>,
        _: BTreeMap<String, Option<String>>,
    ) -> kubelet_csi::Result<()> {
        Ok(())
    }
    async fn patch_claim_status(
        &self,
        _: &str,
        _: &str,
        _: serde_json::Value,
    ) -> kubelet_csi::Result<()> {
        Ok(())
    }
    async fn service_account_token(
        &self,
        _: &str,
        _: &str,
        _: TokenRequest,
    ) -> kubelet_csi::Result<TokenRequestStatus> {
        Err(stub_error())
    }
}

fn pv(handle: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-1".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: handle.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Env {
    _dir: tempfile::TempDir,
    csi: CsiVolumes,
    plugin: Arc<CsiPlugin>,
}

fn env() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    // Short deadlines: a driver call in these tests never gets an answer.
    let timeouts = Timeouts {
        probe: Duration::from_secs(1),
        dial: Duration::from_secs(1),
        operation: Duration::from_secs(1),
        ..Timeouts::default()
    };
    let plugin = Arc::new(CsiPlugin::new(Arc::new(StubHost), dir.path(), timeouts));
    Env {
        _dir: dir,
        csi: CsiVolumes::new(plugin.clone()),
        plugin,
    }
}

fn in_use(handle: &str) -> Vec<String> {
    vec![format!("kubernetes.io/csi/{DRIVER}^{handle}")]
}

/// Sets up the claim volume `data` of pod `u1` on PV `pv-1`: the driver
/// is not registered, so it fails (as a publish failing after a stage).
async fn failed_set_up(e: &Env, handle: &str) {
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
    );
    let volume = p
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.first().cloned())
        .expect("volume");
    let pv = pv(handle);
    let r = e
        .csi
        .set_up_csi(
            &p,
            &volume,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await;
    assert!(r.is_err(), "no driver: {r:?}");
}

#[tokio::test]
async fn a_failed_set_up_keeps_the_device_in_use_until_its_tear_down_unstages_it() {
    let e = env();
    failed_set_up(&e, "h1").await;
    assert_eq!(
        e.csi.volumes_in_use(),
        in_use("h1"),
        "in use from the set-up"
    );
    let dir = e
        .csi
        .set_up_dir("u1", "data")
        .expect("the failed set-up's directory");
    assert_eq!(dir, e.plugin.layout().pod_volume_dir("u1", "pv-1"));
    // Never staged here (no device directory): nothing to ask the driver.
    e.csi.tear_down(&dir).await.expect("torn down");
    assert!(e.csi.volumes_in_use().is_empty());
    assert_eq!(e.csi.set_up_dir("u1", "data"), None);
}

#[tokio::test]
async fn an_unstage_that_failed_stays_pending_and_in_use_until_a_retry_succeeds() {
    let e = env();
    failed_set_up(&e, "h2").await;
    // Staged (the device's directory exists), the driver gone since.
    let staging = e.plugin.layout().device_mount_path(DRIVER, "h2");
    tokio::fs::create_dir_all(&staging).await.expect("staging");
    let dir = e.csi.set_up_dir("u1", "data").expect("dir");
    e.csi
        .tear_down(&dir)
        .await
        .expect("the pod's volume is gone");
    assert_eq!(e.csi.volumes_in_use(), in_use("h2"), "pending unstage");
    e.csi.retry_unstages().await;
    assert_eq!(e.csi.volumes_in_use(), in_use("h2"), "still failing");
    // Gone by other means: the retry finds nothing left to unstage.
    tokio::fs::remove_dir_all(staging.parent().expect("device dir"))
        .await
        .expect("remove");
    e.csi.retry_unstages().await;
    assert!(e.csi.volumes_in_use().is_empty());
}

/// Unmounts its paths, in order, when dropped (a failed assertion too).
struct Unmount(Vec<std::path::PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = kubelet_volume::mount::unmount_blocking(p);
        }
    }
}

#[tokio::test]
async fn a_device_whose_staging_path_is_still_mounted_elsewhere_is_not_unstaged() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let e = env();
    failed_set_up(&e, "h3").await;
    let staging = e.plugin.layout().device_mount_path(DRIVER, "h3");
    let other = e._dir.path().join("other-pod-target");
    for d in [&staging, &other] {
        tokio::fs::create_dir_all(d).await.expect("dir");
    }
    let _unmount = Unmount(vec![other.clone(), staging.clone()]);
    kubelet_volume::mount::mount_tmpfs(&staging, None, 0o755)
        .await
        .expect("tmpfs");
    kubelet_volume::mount::bind_mount(&staging, &other, false)
        .await
        .expect("bind");
    // A driver that registers every connection (and never answers).
    let socket = e._dir.path().join("driver.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    e.plugin.drivers().set(
        DRIVER,
        kubelet_csi::drivers::Driver {
            endpoint: socket,
            highest_supported_version: kubelet_csi::drivers::Version(1, 0, 0),
        },
    );
    let dir = e.csi.set_up_dir("u1", "data").expect("dir");
    e.csi
        .tear_down(&dir)
        .await
        .expect("the pod's volume is gone");
    // Refused before the driver is asked: still staged, still in use.
    assert_eq!(e.csi.volumes_in_use(), in_use("h3"));
    let asked = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(
        asked.is_err(),
        "the driver was called for NodeUnstageVolume"
    );
    assert!(
        kubelet_volume::mount::is_mount_point(&staging)
            .await
            .expect("mountinfo")
    );
}

#[tokio::test]
async fn a_volume_without_a_lifecycle_mode_is_persistent_and_its_device_unstaged() {
    use kubelet_test_util::csi_driver::{CsiDriver, DriverConfig};
    let e = env();
    let data = e._dir.path().join("driver-data");
    let socket = e._dir.path().join("driver.sock");
    let driver = CsiDriver::start(DriverConfig::new(DRIVER, "node-1", &data), &socket, None)
        .await
        .expect("driver");
    e.plugin.drivers().set(
        DRIVER,
        kubelet_csi::drivers::Driver {
            endpoint: socket,
            highest_supported_version: kubelet_csi::drivers::Version(1, 0, 0),
        },
    );
    tokio::fs::create_dir_all(driver.volume_path("h4"))
        .await
        .expect("the driver's volume");
    // Written by an older kubelet: no `volumeLifecycleMode`.
    let dir = e.plugin.layout().pod_volume_dir("u1", "pv-1");
    tokio::fs::create_dir_all(dir.join("mount"))
        .await
        .expect("target");
    let data = BTreeMap::from([
        ("driverName".to_string(), DRIVER.to_string()),
        ("volumeHandle".to_string(), "h4".to_string()),
        ("specVolID".to_string(), "pv-1".to_string()),
    ]);
    kubelet_csi::paths::save_volume_data(&dir, &data)
        .await
        .expect("vol_data.json");
    let staging = e.plugin.layout().device_mount_path(DRIVER, "h4");
    tokio::fs::create_dir_all(&staging).await.expect("staging");
    e.csi.tear_down(&dir).await.expect("torn down");
    assert_eq!(driver.calls_of("NodeUnpublishVolume").len(), 1);
    assert_eq!(
        driver.calls_of("NodeUnstageVolume").len(),
        1,
        "unstaged as a persistent volume's device: {:?}",
        driver.calls()
    );
}
