//! Shared parts of the test CSI driver's tests (`csi_driver.rs`,
//! `csi_driver_faults.rs`): scratch directories unmounted on drop, mount and
//! device checks, a started driver, and CSI requests.

#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

pub use std::collections::HashMap;
pub use std::path::{Path, PathBuf};
pub use std::time::Duration;

pub use kubelet_csi::pb;
pub use kubelet_csi::pb::identity_client::IdentityClient;
pub use kubelet_csi::pb::node_client::NodeClient;
pub use kubelet_csi::pb::node_service_capability::rpc::Type as Cap;
pub use kubelet_csi::pb::volume_capability::{AccessType, BlockVolume, MountVolume};
pub use kubelet_pluginmanager::pb as reg;
pub use kubelet_pluginmanager::pb::registration_client::RegistrationClient;
pub use kubelet_test_util::csi_driver::{self, CsiDriver, DriverConfig, Fault, Request};
pub use tonic::Code;

pub const DRIVER: &str = "hostpath.csi.kubelet-rs.test";
pub const LIMIT: Duration = Duration::from_secs(5);

/// Unmounts whatever a failed test left under its directory.
pub struct Scratch(pub tempfile::TempDir);

impl Scratch {
    pub fn new() -> Self {
        Self(tempfile::tempdir().expect("tempdir"))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let root = self.0.path().to_string_lossy().into_owned();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&root))
            .map(str::to_string)
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

pub fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == want)
}

pub fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

pub fn device_size(path: &Path) -> u64 {
    use std::io::Seek;
    let mut f = std::fs::File::open(path).expect("open device");
    f.seek(std::io::SeekFrom::End(0)).expect("device size")
}

pub async fn start(dir: &Path, f: impl FnOnce(&mut DriverConfig)) -> CsiDriver {
    let mut cfg = DriverConfig::new(DRIVER, "node-1", &dir.join("data"));
    f(&mut cfg);
    let d = CsiDriver::start_in_root(cfg, dir)
        .await
        .expect("driver starts");
    assert_eq!(
        d.socket(),
        dir.join("plugins").join(DRIVER).join("csi.sock")
    );
    d
}

pub async fn node(d: &CsiDriver) -> NodeClient<tonic::transport::Channel> {
    NodeClient::new(csi_driver::connect(d.socket(), LIMIT).await.expect("dial"))
}

pub fn mount_cap(group: &str) -> Option<pb::VolumeCapability> {
    Some(pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec![],
            volume_mount_group: group.into(),
        })),
        access_mode: Some(pb::volume_capability::AccessMode { mode: 1 }),
    })
}

pub fn block_cap() -> Option<pb::VolumeCapability> {
    Some(pb::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(pb::volume_capability::AccessMode { mode: 1 }),
    })
}

pub fn stage_req(id: &str, staging: &Path) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: mount_cap(""),
        secrets: HashMap::from([("user".to_string(), "stage".to_string())]),
        ..Default::default()
    }
}

pub fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    ro: bool,
) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: mount_cap(""),
        readonly: ro,
        ..Default::default()
    }
}

pub fn unpublish_req(id: &str, target: &Path) -> pb::NodeUnpublishVolumeRequest {
    pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

pub fn unstage_req(id: &str, staging: &Path) -> pb::NodeUnstageVolumeRequest {
    pb::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
    }
}
