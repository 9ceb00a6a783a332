//! Tests of the driver's raw block volumes on real loop devices: publish
//! gives a block device node at the target whose writes land in the
//! volume's backing file, publishes share one loop device, and the last
//! unpublish, DeleteVolume, a failed publish and the driver's drop leave
//! none attached. Need root, as the driver does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use kubelet_csi::pb;
use kubelet_csi::pb::controller_server::Controller;
use kubelet_csi::pb::node_server::Node;
use kubelet_csi::pb::volume_capability::{AccessMode, AccessType, BlockVolume};
use tonic::{Code, Request};

use super::{BLOCK_SIZE, CsiDriver, DriverConfig, loopdev};

/// A scratch directory that unmounts whatever a failed test left in it.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new() -> Self {
        Self(tempfile::tempdir().expect("tempdir"))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let root = self.0.path().to_string_lossy().into_owned();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&root))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

async fn start(dir: &Path, stage: bool) -> CsiDriver {
    let mut cfg = DriverConfig::new("block.csi.kubelet-rs.test", "node-1", &dir.join("data"));
    cfg.stage_unstage = stage;
    CsiDriver::start(cfg, &dir.join("csi.sock"), None)
        .await
        .expect("driver starts")
}

fn block_cap() -> Option<pb::VolumeCapability> {
    Some(pb::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: 1 }),
    })
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn publish_req(id: &str, staging: &str, target: &Path, ro: bool) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.into(),
        target_path: path(target),
        volume_capability: block_cap(),
        readonly: ro,
        ..Default::default()
    }
}

async fn publish(d: &CsiDriver, req: pb::NodePublishVolumeRequest) -> Result<(), tonic::Status> {
    d.driver
        .node_publish_volume(Request::new(req))
        .await
        .map(|_| ())
}

async fn unpublish(d: &CsiDriver, id: &str, target: &Path) -> Result<(), tonic::Status> {
    let req = pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: path(target),
    };
    d.driver
        .node_unpublish_volume(Request::new(req))
        .await
        .map(|_| ())
}

async fn delete(d: &CsiDriver, id: &str) {
    let req = pb::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    d.driver
        .delete_volume(Request::new(req))
        .await
        .expect("DeleteVolume");
}

fn attached_to(file: &Path) -> Vec<PathBuf> {
    loopdev::find(file, loopdev::DEADLINE).expect("losetup -j")
}

fn is_block_device(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

#[tokio::test]
async fn a_published_block_volume_is_its_loop_device() {
    let dir = Scratch::new();
    let d = start(dir.path(), true).await;
    let file = d.block_file("pvc/blk");
    assert_eq!(file, dir.path().join("data").join("pvc_blk.block"));

    let staging = dir.path().join("volumeDevices/staging/pv-blk");
    let stage = pb::NodeStageVolumeRequest {
        volume_id: "pvc/blk".into(),
        staging_target_path: path(&staging),
        volume_capability: block_cap(),
        ..Default::default()
    };
    d.driver
        .node_stage_volume(Request::new(stage))
        .await
        .expect("stage");
    assert!(staging.is_dir() && !super::mount::is_mount_point(&staging));
    assert_eq!(
        std::fs::metadata(&file).expect("backing file").len(),
        BLOCK_SIZE
    );
    assert!(attached_to(&file).is_empty(), "staging attaches nothing");

    // Two pods' publish paths (parents missing) and a read-only one.
    let publish_dir = dir.path().join("volumeDevices/publish/pv-blk");
    let t1 = publish_dir.join("pod-1");
    let t2 = publish_dir.join("pod-2");
    let t3 = publish_dir.join("pod-3");
    let staged = path(&staging);
    publish(&d, publish_req("pvc/blk", &staged, &t1, false))
        .await
        .expect("publish");
    publish(&d, publish_req("pvc/blk", &staged, &t1, false))
        .await
        .expect("publish again");
    publish(&d, publish_req("pvc/blk", &staged, &t2, false))
        .await
        .expect("second publish");
    publish(&d, publish_req("pvc/blk", &staged, &t3, true))
        .await
        .expect("read-only publish");
    let devices = attached_to(&file);
    assert_eq!(devices.len(), 1, "one loop device per volume: {devices:?}");
    let dev = &devices[0];
    assert_eq!(
        d.loop_device("pvc/blk").await.expect("losetup"),
        Some(dev.clone())
    );
    let rdev = std::fs::metadata(dev).expect("device").rdev();
    for t in [&t1, &t2, &t3] {
        assert!(is_block_device(t), "{} is a block device", t.display());
        assert!(super::mount::is_mount_point(t));
        assert_eq!(std::fs::metadata(t).expect("target").rdev(), rdev);
    }

    // Bytes written through the target land in the backing file.
    let mut target = std::fs::OpenOptions::new()
        .write(true)
        .open(&t1)
        .expect("open the device");
    target.seek(SeekFrom::Start(4096)).expect("seek");
    target.write_all(b"raw block bytes").expect("write");
    target.sync_all().expect("flush the device");
    drop(target);
    let mut backing = std::fs::File::open(&file).expect("backing file");
    backing.seek(SeekFrom::Start(4096)).expect("seek");
    let mut got = [0u8; 15];
    backing.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"raw block bytes");

    // Stats of a block target: its device's size, in bytes.
    let stats = d
        .driver
        .node_get_volume_stats(Request::new(pb::NodeGetVolumeStatsRequest {
            volume_id: "pvc/blk".into(),
            volume_path: path(&t2),
            ..Default::default()
        }))
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(stats.usage[0].total, BLOCK_SIZE as i64);
    assert_eq!(stats.usage[0].unit, pb::volume_usage::Unit::Bytes as i32);

    // Unpublishing removes the target; the device stays while a publish
    // remains and goes with the last.
    unpublish(&d, "pvc/blk", &t1).await.expect("unpublish");
    assert!(std::fs::symlink_metadata(&t1).is_err(), "target removed");
    assert_eq!(attached_to(&file), devices, "still published twice");
    unpublish(&d, "pvc/blk", &t2).await.expect("unpublish 2");
    unpublish(&d, "pvc/blk", &t3).await.expect("unpublish 3");
    assert!(std::fs::symlink_metadata(&t3).is_err());
    assert!(attached_to(&file).is_empty(), "loop device detached");
    assert_eq!(d.loop_device("pvc/blk").await.expect("losetup"), None);
    unpublish(&d, "pvc/blk", &t3)
        .await
        .expect("unpublish repeated");

    d.driver
        .node_unstage_volume(Request::new(pb::NodeUnstageVolumeRequest {
            volume_id: "pvc/blk".into(),
            staging_target_path: path(&staging),
        }))
        .await
        .expect("unstage");
    delete(&d, "pvc/blk").await;
    assert!(!file.exists(), "DeleteVolume removes the backing file");
    delete(&d, "pvc/blk").await;
}

#[tokio::test]
async fn delete_volume_detaches_a_device_still_published() {
    let dir = Scratch::new();
    let d = start(dir.path(), false).await;
    let create = pb::CreateVolumeRequest {
        name: "blk-created".into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 2 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: block_cap().into_iter().collect(),
        ..Default::default()
    };
    d.driver
        .create_volume(Request::new(create))
        .await
        .expect("CreateVolume");
    let file = d.block_file("blk-created");
    assert_eq!(
        std::fs::metadata(&file).expect("backing file").len(),
        2 << 20
    );
    assert!(
        !d.volume_path("blk-created").exists(),
        "no directory for a block volume"
    );

    let t = dir.path().join("publish/pod-1");
    publish(&d, publish_req("blk-created", "", &t, false))
        .await
        .expect("publish");
    assert_eq!(loopdev::device_size(&t).expect("device size"), 2 << 20);
    assert_eq!(attached_to(&file).len(), 1);
    delete(&d, "blk-created").await;
    assert!(!file.exists());
    // `losetup -j` needs the file: look for a device still naming it.
    let all = std::process::Command::new("/usr/sbin/losetup")
        .arg("-a")
        .output()
        .expect("losetup -a");
    let listing = String::from_utf8_lossy(&all.stdout);
    assert!(
        !listing.contains(&*file.to_string_lossy()),
        "a loop device outlived DeleteVolume: {listing}"
    );
}

#[tokio::test]
async fn a_failed_publish_and_the_drivers_drop_leave_no_device() {
    let dir = Scratch::new();
    let d = start(dir.path(), false).await;

    // The target's parent is a file: the publish fails after the attach.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"").expect("file");
    let err = publish(&d, publish_req("blk-fail", "", &blocker.join("pod"), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(attached_to(&d.block_file("blk-fail")).is_empty());

    // A volume still published when the driver goes.
    let t = dir.path().join("publish/pod-1");
    publish(&d, publish_req("blk-kept", "", &t, false))
        .await
        .expect("publish");
    let file = d.block_file("blk-kept");
    assert_eq!(attached_to(&file).len(), 1);
    let published: HashMap<_, _> = d.published();
    assert!(published[&t].block);
    drop(d);
    assert!(
        attached_to(&file).is_empty(),
        "the drop detached the device"
    );
}
