//! The test CSI driver over real unix sockets, driven by the generated CSI
//! and plugin registration clients as the kubelet drives a real driver:
//! registration, capabilities, stage/publish bind mounts and their
//! idempotency and error codes, block and ephemeral volumes, stats,
//! expansion, faults and restarts, and the control plane helpers against
//! the apiserver double. Needs root (mounts), as the integration suite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kubelet_csi::pb;
use kubelet_csi::pb::identity_client::IdentityClient;
use kubelet_csi::pb::node_client::NodeClient;
use kubelet_csi::pb::node_service_capability::rpc::Type as Cap;
use kubelet_csi::pb::volume_capability::{AccessType, BlockVolume, MountVolume};
use kubelet_pluginmanager::pb as reg;
use kubelet_pluginmanager::pb::registration_client::RegistrationClient;
use kubelet_test_util::csi_driver::{self, CsiDriver, DriverConfig, Fault, Request};
use tonic::Code;

const DRIVER: &str = "hostpath.csi.kubelet-rs.test";
const LIMIT: Duration = Duration::from_secs(5);

/// Unmounts whatever a failed test left under its directory.
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

fn is_mount_point(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == want)
}

fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

fn device_size(path: &Path) -> u64 {
    use std::io::Seek;
    let mut f = std::fs::File::open(path).expect("open device");
    f.seek(std::io::SeekFrom::End(0)).expect("device size")
}

async fn start(dir: &Path, f: impl FnOnce(&mut DriverConfig)) -> CsiDriver {
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

async fn node(d: &CsiDriver) -> NodeClient<tonic::transport::Channel> {
    NodeClient::new(csi_driver::connect(d.socket(), LIMIT).await.expect("dial"))
}

fn mount_cap(group: &str) -> Option<pb::VolumeCapability> {
    Some(pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec![],
            volume_mount_group: group.into(),
        })),
        access_mode: Some(pb::volume_capability::AccessMode { mode: 1 }),
    })
}

fn block_cap() -> Option<pb::VolumeCapability> {
    Some(pb::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(pb::volume_capability::AccessMode { mode: 1 }),
    })
}

fn stage_req(id: &str, staging: &Path) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: mount_cap(""),
        secrets: HashMap::from([("user".to_string(), "stage".to_string())]),
        ..Default::default()
    }
}

fn publish_req(id: &str, staging: &Path, target: &Path, ro: bool) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: mount_cap(""),
        readonly: ro,
        ..Default::default()
    }
}

fn unpublish_req(id: &str, target: &Path) -> pb::NodeUnpublishVolumeRequest {
    pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

fn unstage_req(id: &str, staging: &Path) -> pb::NodeUnstageVolumeRequest {
    pb::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
    }
}

#[tokio::test]
async fn the_driver_registers_and_describes_itself() {
    let dir = Scratch::new();
    let d = start(dir.path(), |c| c.max_volumes = 7).await;
    let reg_socket = d.registration_socket().expect("registers").to_path_buf();
    assert_eq!(
        reg_socket,
        dir.path()
            .join("plugins_registry")
            .join(format!("{DRIVER}-reg.sock"))
    );
    let mut r =
        RegistrationClient::new(csi_driver::connect(&reg_socket, LIMIT).await.expect("dial"));
    let info = r
        .get_info(reg::InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(PathBuf::from(&info.endpoint), d.socket());
    assert_eq!(info.supported_versions, vec!["1.0.0"]);
    assert!(d.registration_statuses().is_empty());
    r.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: false,
        error: "bad version".into(),
    })
    .await
    .expect("notify");
    let status = d.wait_registration(LIMIT).await.expect("status kept");
    assert!(!status.registered && status.error == "bad version");
    d.configure(|c| c.registration_versions = vec!["0.1.0".into()]);
    let info = r
        .get_info(reg::InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.supported_versions, vec!["0.1.0"]);
    d.set_fault(
        "GetInfo",
        Fault::FailOnce(Code::Unavailable, "not yet".into()),
    );
    let err = r.get_info(reg::InfoRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);

    let channel = csi_driver::connect(d.socket(), LIMIT).await.expect("dial");
    let mut id = IdentityClient::new(channel.clone());
    let plugin = id
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(plugin.name, DRIVER);
    let probe = id
        .probe(pb::ProbeRequest {})
        .await
        .expect("probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    let mut n = NodeClient::new(channel);
    let info = n
        .node_get_info(pb::NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    assert_eq!(info.max_volumes_per_node, 7);
    let segments = info.accessible_topology.expect("topology").segments;
    assert_eq!(
        segments
            .get("topology.hostpath.csi/node")
            .map(String::as_str),
        Some("node-1")
    );
    let caps = |r: pb::NodeGetCapabilitiesResponse| -> Vec<i32> {
        r.capabilities
            .into_iter()
            .filter_map(|c| {
                c.r#type
                    .map(|pb::node_service_capability::Type::Rpc(rpc)| rpc.r#type)
            })
            .collect()
    };
    let before = caps(
        n.node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
            .await
            .expect("caps")
            .into_inner(),
    );
    assert_eq!(
        before,
        vec![Cap::StageUnstageVolume as i32, Cap::GetVolumeStats as i32]
    );
    d.configure(|c| {
        c.stage_unstage = false;
        c.expand = true;
        c.volume_mount_group = true;
    });
    let after = caps(
        n.node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
            .await
            .expect("caps")
            .into_inner(),
    );
    assert_eq!(
        after,
        vec![
            Cap::GetVolumeStats as i32,
            Cap::ExpandVolume as i32,
            Cap::VolumeMountGroup as i32
        ]
    );
    assert_eq!(d.calls_of("NodeGetCapabilities").len(), 2);
}

#[tokio::test]
async fn stage_and_publish_bind_mount_and_repeat_idempotently() {
    let dir = Scratch::new();
    let d = start(dir.path(), |_| {}).await;
    let mut n = node(&d).await;
    let staging = dir.path().join("plugins/kubernetes.io/csi/d/h/globalmount");
    let target = dir
        .path()
        .join("pods/uid/volumes/kubernetes.io~csi/pv1/mount");
    let ro_target = dir
        .path()
        .join("pods/uid2/volumes/kubernetes.io~csi/pv1/mount");

    // Publishing before staging is refused as the spec says.
    let err = n
        .node_publish_volume(publish_req("vol-1", &staging, &target, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let mut no_staging = publish_req("vol-1", &staging, &target, false);
    no_staging.staging_target_path.clear();
    let err = n.node_publish_volume(no_staging).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);

    n.node_stage_volume(stage_req("vol-1", &staging))
        .await
        .expect("stage");
    assert!(is_mount_point(&staging));
    n.node_stage_volume(stage_req("vol-1", &staging))
        .await
        .expect("stage again");
    n.node_publish_volume(publish_req("vol-1", &staging, &target, false))
        .await
        .expect("publish");
    assert!(is_mount_point(&target));
    std::fs::write(target.join("hello"), b"world").expect("write through the target");
    assert_eq!(
        std::fs::read(d.volume_path("vol-1").join("hello")).expect("in the volume"),
        b"world"
    );
    n.node_publish_volume(publish_req("vol-1", &staging, &target, false))
        .await
        .expect("publish again");
    let err = n
        .node_publish_volume(publish_req("vol-1", &staging, &target, true))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    n.node_publish_volume(publish_req("vol-1", &staging, &ro_target, true))
        .await
        .expect("read-only");
    assert_eq!(
        std::fs::read(ro_target.join("hello")).expect("read"),
        b"world"
    );
    let denied = std::fs::write(ro_target.join("other"), b"x").unwrap_err();
    assert_eq!(denied.raw_os_error(), Some(nix::libc::EROFS));

    // Missing fields are InvalidArgument.
    let mut bad = stage_req("", &staging);
    assert_eq!(
        n.node_stage_volume(bad.clone()).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    bad.volume_id = "vol-1".into();
    bad.volume_capability = None;
    assert_eq!(
        n.node_stage_volume(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    for t in [&target, &ro_target] {
        n.node_unpublish_volume(unpublish_req("vol-1", t))
            .await
            .expect("unpublish");
        assert!(!is_mount_point(t) && !t.exists(), "{}", t.display());
        n.node_unpublish_volume(unpublish_req("vol-1", t))
            .await
            .expect("unpublish again");
    }
    n.node_unstage_volume(unstage_req("vol-1", &staging))
        .await
        .expect("unstage");
    assert!(!is_mount_point(&staging));
    n.node_unstage_volume(unstage_req("vol-1", &staging))
        .await
        .expect("unstage again");
    let err = n
        .node_unstage_volume(unstage_req("no-such-volume", &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // The data outlives the mounts.
    assert!(d.volume_path("vol-1").join("hello").exists());

    let stage = &d.calls_of("NodeStageVolume")[0];
    let Request::NodeStageVolume(r) = &stage.request else {
        panic!("{stage:?}")
    };
    assert_eq!(r.secrets.get("user").map(String::as_str), Some("stage"));
    assert_eq!(d.calls_of("NodeUnpublishVolume").len(), 4);
    assert!(d.published().is_empty() && d.staged().is_empty());
}

#[tokio::test]
async fn block_ephemeral_stats_and_expansion() {
    let dir = Scratch::new();
    let d = start(dir.path(), |c| {
        c.stage_unstage = false;
        c.expand = true;
    })
    .await;
    let mut n = node(&d).await;

    // Block: the volume's loop device bind-mounted on a file.
    let dev = dir
        .path()
        .join("pods/uid/volumeDevices/kubernetes.io~csi/pv-b");
    let mut req = publish_req("vol-b", Path::new(""), &dev, false);
    req.staging_target_path.clear();
    req.volume_capability = block_cap();
    n.node_publish_volume(req).await.expect("block publish");
    assert!(is_mount_point(&dev) && is_block_device(&dev));
    assert_eq!(device_size(&dev), csi_driver::BLOCK_SIZE);
    let loop_dev = d.loop_device("vol-b").await.expect("losetup");
    assert!(loop_dev.is_some());
    let stats = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "vol-b".into(),
            volume_path: dev.to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await
        .expect("block stats")
        .into_inner();
    assert_eq!(stats.usage[0].total, csi_driver::BLOCK_SIZE as i64);
    let expanded = n
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: "vol-b".into(),
            volume_path: dev.to_string_lossy().into_owned(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 2 << 20,
                limit_bytes: 0,
            }),
            volume_capability: block_cap(),
            ..Default::default()
        })
        .await
        .expect("expand")
        .into_inner();
    assert_eq!(expanded.capacity_bytes, 2 << 20);
    assert_eq!(d.expanded_size("vol-b"), Some(2 << 20));
    assert_eq!(device_size(&dev), 2 << 20, "the loop device grew");
    assert_eq!(
        std::fs::metadata(d.block_file("vol-b"))
            .expect("meta")
            .len(),
        2 << 20
    );
    n.node_unpublish_volume(unpublish_req("vol-b", &dev))
        .await
        .expect("block unpublish");
    assert!(!dev.exists());
    assert_eq!(d.loop_device("vol-b").await.expect("losetup"), None);

    // Ephemeral: a fresh directory that goes with the unpublish.
    let eph = dir
        .path()
        .join("pods/uid/volumes/kubernetes.io~csi/scratch/mount");
    let mut req = publish_req("csi-eph", Path::new(""), &eph, false);
    req.staging_target_path.clear();
    req.volume_context = HashMap::from([
        (
            csi_driver::EPHEMERAL_CONTEXT_KEY.to_string(),
            "true".to_string(),
        ),
        ("csi.storage.k8s.io/pod.name".to_string(), "p".to_string()),
    ]);
    n.node_publish_volume(req).await.expect("ephemeral publish");
    assert!(is_mount_point(&eph));
    std::fs::write(eph.join("f"), b"1").expect("write");
    let stats = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "csi-eph".into(),
            volume_path: eph.to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await
        .expect("stats")
        .into_inner();
    let bytes = &stats.usage[0];
    assert_eq!(bytes.unit, pb::volume_usage::Unit::Bytes as i32);
    assert!(
        bytes.total > 0 && bytes.available <= bytes.total && bytes.used >= 0,
        "{bytes:?}"
    );
    assert_eq!(stats.usage[1].unit, pb::volume_usage::Unit::Inodes as i32);
    assert!(d.published().values().any(|p| p.ephemeral));
    n.node_unpublish_volume(unpublish_req("csi-eph", &eph))
        .await
        .expect("ephemeral unpublish");
    assert!(!d.volume_path("csi-eph").exists(), "ephemeral data removed");
    n.node_unpublish_volume(unpublish_req("csi-eph", &eph))
        .await
        .expect("repeat is OK");

    let err = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "csi-eph".into(),
            volume_path: eph.to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    d.configure(|c| c.get_volume_stats = false);
    let err = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "x".into(),
            volume_path: "/".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test]
async fn faults_hang_or_fail_and_a_restart_keeps_the_volumes() {
    let dir = Scratch::new();
    let mut d = start(dir.path(), |c| c.volume_mount_group = true).await;
    let mut n = node(&d).await;
    let staging = dir.path().join("globalmount");

    d.set_fault(
        "NodeStageVolume",
        Fault::FailOnce(Code::ResourceExhausted, "busy".into()),
    );
    let err = n
        .node_stage_volume(stage_req("vol-f", &staging))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::ResourceExhausted, "busy")
    );
    let mut grouped = stage_req("vol-f", &staging);
    grouped.volume_capability = mount_cap("4321");
    n.node_stage_volume(grouped).await.expect("second try");
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(d.volume_path("vol-f")).expect("volume dir");
        assert_eq!(meta.gid(), 4321);
        assert_ne!(meta.mode() & 0o2000, 0, "setgid");
    }
    assert_eq!(
        d.calls_of("NodeStageVolume")
            .iter()
            .map(|c| c.code)
            .collect::<Vec<_>>(),
        vec![Code::ResourceExhausted, Code::Ok]
    );

    d.set_fault("*", Fault::Fail(Code::Internal, "down".into()));
    let err = n
        .node_get_info(pb::NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    d.clear_fault("*");

    d.set_fault("NodePublishVolume", Fault::Hang);
    let target = dir.path().join("target");
    let mut hanging = n.clone();
    let req = publish_req("vol-f", &staging, &target, false);
    let call = tokio::spawn(async move { hanging.node_publish_volume(req).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the call hangs");
    assert!(!is_mount_point(&target));
    assert!(
        d.wait_for_call("NodePublishVolume", Code::Ok, Duration::from_millis(100))
            .await
            .is_none()
    );
    d.clear_fault("NodePublishVolume");
    let done = d
        .wait_for_call("NodePublishVolume", Code::Ok, LIMIT)
        .await
        .expect("recorded once it answers");
    assert!(matches!(done.request, Request::NodePublishVolume(ref r) if r.volume_id == "vol-f"));
    tokio::time::timeout(LIMIT, call)
        .await
        .expect("answers once cleared")
        .expect("task")
        .expect("publish");
    assert!(is_mount_point(&target));

    // A restart: the sockets go and come back; the state and mounts stay.
    let socket = d.socket().to_path_buf();
    d.stop().await;
    assert!(!socket.exists());
    assert!(d.registration_socket().is_some_and(|p| !p.exists()));
    assert!(is_mount_point(&target));
    d.restart().await.expect("serves again");
    let mut n = node(&d).await;
    n.node_publish_volume(publish_req("vol-f", &staging, &target, false))
        .await
        .expect("still published: OK");
    n.node_unpublish_volume(unpublish_req("vol-f", &target))
        .await
        .expect("unpublish");
    n.node_unstage_volume(unstage_req("vol-f", &staging))
        .await
        .expect("unstage");
    assert!(!is_mount_point(&staging) && !is_mount_point(&target));
}

#[tokio::test]
async fn the_control_plane_helpers_attach_for_the_node() {
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kubelet_test_util::csi_driver::{api, attacher};
    use serde_json::json;

    // Upstream getAttachmentName: "csi-" + sha256(handle + driver + node).
    assert_eq!(
        api::attachment_name("vol-1", "hostpath.csi.k8s.io", "node-1"),
        "csi-a5a2e67339ab5660a390dc86be397e784322823ff01f40cf2c01a72c3cab1374"
    );
    let c = kubelet_test_util::Cluster::start(Default::default()).await;
    let admin = c.admin().await;
    let spec = api::DriverSpec {
        pod_info_on_mount: Some(true),
        volume_lifecycle_modes: vec!["Persistent".into(), "Ephemeral".into()],
        ..Default::default()
    };
    api::create_csi_driver(&admin, DRIVER, &spec)
        .await
        .expect("CSIDriver");
    let got = Api::<CSIDriver>::all(c.node_client("node-1").await)
        .get(DRIVER)
        .await
        .expect("the node reads it");
    assert_eq!(got.spec.attach_required, Some(true));
    assert_eq!(got.spec.pod_info_on_mount, Some(true));

    let pv: PersistentVolume = serde_json::from_value(api::csi_pv(
        "pv-a",
        DRIVER,
        "handle-a",
        ("default", "claim-a"),
        None,
        None,
        "Filesystem",
    ))
    .expect("pv");
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("create pv");
    let pvc: PersistentVolumeClaim =
        serde_json::from_value(json!({"metadata": {"name": "claim-a"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": "pv-a"}}))
        .expect("pvc");
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pvc)
        .await
        .expect("create pvc");
    assert!(
        attacher::attach_once(&admin, DRIVER)
            .await
            .expect("pass")
            .is_empty(),
        "no pod yet"
    );
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-1"}})).expect("node");
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
        "nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "claim-a"}}]}}))
    .expect("pod");
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let name = api::attachment_name("handle-a", DRIVER, "node-1");
    assert_eq!(
        attacher::attach_once(&admin, DRIVER).await.expect("pass"),
        vec![name.clone()]
    );
    let va = Api::<VolumeAttachment>::all(c.node_client("node-1").await)
        .get(&name)
        .await
        .expect("the node gets its attachment");
    assert!(va.status.is_some_and(|s| s.attached));
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-a")
    );
    assert!(
        attacher::attach_once(&admin, DRIVER)
            .await
            .expect("pass")
            .is_empty(),
        "once"
    );
    let err = Api::<VolumeAttachment>::all(c.node_client("node-2").await)
        .get(&name)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 403));

    // The node lists the volume as attached; it is detached only once the
    // pod is gone and the node no longer has it in use.
    let nodes = Api::<Node>::all(admin.clone());
    let unique = attacher::unique_volume_name(DRIVER, "handle-a");
    assert_eq!(unique, format!("kubernetes.io/csi/{DRIVER}^handle-a"));
    let attached = nodes
        .get("node-1")
        .await
        .expect("node")
        .status
        .and_then(|s| s.volumes_attached);
    assert_eq!(
        attached.map(|v| v.into_iter().map(|a| a.name).collect::<Vec<_>>()),
        Some(vec![unique.clone()])
    );
    nodes
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"volumesInUse": [unique]}})),
        )
        .await
        .expect("in use");
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete("p", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    assert!(
        attacher::detach_once(&admin, DRIVER)
            .await
            .expect("pass")
            .is_empty(),
        "still in use"
    );
    nodes
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"volumesInUse": null}})),
        )
        .await
        .expect("unmounted");
    assert_eq!(
        attacher::detach_once(&admin, DRIVER).await.expect("pass"),
        vec![name.clone()]
    );
    let attached = nodes
        .get("node-1")
        .await
        .expect("node")
        .status
        .and_then(|s| s.volumes_attached);
    assert!(attached.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn fail_times_fails_the_first_calls_and_fail_after_work_does_the_work() {
    let dir = Scratch::new();
    let d = start(dir.path(), |_| {}).await;
    let mut n = node(&d).await;
    let staging = dir.path().join("globalmount");

    d.set_fault(
        "NodeStageVolume",
        Fault::FailTimes(2, Code::InvalidArgument, "fake error".into()),
    );
    for _ in 0..2 {
        let err = n
            .node_stage_volume(stage_req("vol-t", &staging))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(!is_mount_point(&staging), "a failed call does nothing");
    }
    n.node_stage_volume(stage_req("vol-t", &staging))
        .await
        .expect("the third call works");
    assert!(is_mount_point(&staging));
    assert_eq!(
        d.calls_of("NodeStageVolume")
            .iter()
            .map(|c| c.code)
            .collect::<Vec<_>>(),
        vec![Code::InvalidArgument, Code::InvalidArgument, Code::Ok]
    );

    d.set_fault(
        "NodeUnstageVolume",
        Fault::FailAfterWork(Code::DeadlineExceeded, "too slow".into()),
    );
    let err = n
        .node_unstage_volume(unstage_req("vol-t", &staging))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::DeadlineExceeded, "too slow")
    );
    assert!(!is_mount_point(&staging), "unstaged all the same");
    assert!(d.staged().is_empty());
    // Until cleared, every call fails after its work.
    assert!(
        n.node_unstage_volume(unstage_req("vol-t", &staging))
            .await
            .is_err()
    );
    d.clear_fault("NodeUnstageVolume");
    n.node_unstage_volume(unstage_req("vol-t", &staging))
        .await
        .expect("cleared");
}
