//! The test CSI driver over real unix sockets, driven by the generated CSI
//! and plugin registration clients as the kubelet drives a real driver:
//! registration, capabilities, stage/publish bind mounts and their
//! idempotency and error codes, block and ephemeral volumes, stats,
//! expansion, faults and restarts, and the control plane helpers against
//! the apiserver double. Needs root (mounts), as the integration suite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

#[allow(unused_imports)]
use common::*;

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
