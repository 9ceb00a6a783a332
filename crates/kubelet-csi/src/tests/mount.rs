//! Stage and publish: paths, vol_data.json, volume context, ephemeral volumes, fsGroup, tokens.

use super::*;

#[tokio::test]
async fn stage_and_publish_use_upstreams_paths_vol_data_secrets_and_pod_info() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::StageUnstageVolume])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "stage", "stagekey");
    secret(&e.host, "pub", "pubkey");
    let pod = pod("uid-1");
    let pv = pv("pv-1", "vol-1");

    let mounted = e
        .plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");

    let staging = e.root.join(format!(
        "plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        crate::paths::sha256_hex("vol-1")
    ));
    let target = e
        .root
        .join("pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount");
    assert_eq!(mounted.path, target);
    assert_eq!(mounted.staging_path.as_deref(), Some(staging.as_path()));
    assert_eq!(
        e.host.state.lock().va_reads,
        0,
        "attachRequired=false skips the attach wait"
    );

    let calls = d.calls();
    let Call::Stage(stage) = &calls[0] else {
        panic!("stage first: {calls:?}")
    };
    assert_eq!(stage.staging_target_path, staging.to_string_lossy());
    assert_eq!(
        stage.secrets.get("stagekey").map(String::as_str),
        Some("s3cr3t")
    );
    assert_eq!(
        stage.volume_context.get("attr").map(String::as_str),
        Some("v")
    );
    let Call::Publish(publish) = &calls[1] else {
        panic!("publish second: {calls:?}")
    };
    assert_eq!(publish.target_path, target.to_string_lossy());
    assert_eq!(publish.staging_target_path, staging.to_string_lossy());
    assert_eq!(
        publish.secrets.get("pubkey").map(String::as_str),
        Some("s3cr3t")
    );
    let ctx = &publish.volume_context;
    assert_eq!(
        ctx.get("csi.storage.k8s.io/pod.name").map(String::as_str),
        Some("web")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/pod.namespace")
            .map(String::as_str),
        Some("ns1")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/pod.uid").map(String::as_str),
        Some("uid-1")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/serviceAccount.name")
            .map(String::as_str),
        Some("sa1")
    );
    assert_eq!(
        ctx.get("csi.storage.k8s.io/ephemeral").map(String::as_str),
        Some("false")
    );
    let Some(crate::pb::volume_capability::AccessType::Mount(m)) = publish
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    else {
        panic!("mount capability");
    };
    assert_eq!(
        (m.fs_type.as_str(), m.mount_flags.clone()),
        ("ext4", vec!["noatime".to_string()])
    );

    let pod_data = load_volume_data(target.parent().expect("parent"))
        .await
        .expect("pod vol_data");
    let expect = BTreeMap::from([
        (keys::SPEC_VOL_ID.to_string(), "pv-1".to_string()),
        (keys::VOLUME_HANDLE.to_string(), "vol-1".to_string()),
        (keys::DRIVER_NAME.to_string(), DRIVER.to_string()),
        (keys::NODE_NAME.to_string(), "node-1".to_string()),
        (
            keys::ATTACHMENT_ID.to_string(),
            attachment_name("vol-1", DRIVER, "node-1"),
        ),
        (
            keys::VOLUME_LIFECYCLE_MODE.to_string(),
            "Persistent".to_string(),
        ),
    ]);
    assert_eq!(pod_data, expect);
    let stage_data = load_volume_data(staging.parent().expect("parent"))
        .await
        .expect("stage vol_data");
    assert_eq!(
        stage_data,
        BTreeMap::from([
            (keys::VOLUME_HANDLE.to_string(), "vol-1".to_string()),
            (keys::DRIVER_NAME.to_string(), DRIVER.to_string()),
        ])
    );

    // After a restart the volume is found from vol_data.json.
    let found = e.plugin.reconstruct("uid-1").await.expect("reconstruct");
    assert_eq!(found.len(), 1);
    assert_eq!(
        (
            found[0].spec_name.as_str(),
            found[0].driver.as_str(),
            found[0].volume_handle.as_str()
        ),
        ("pv-1", DRIVER, "vol-1")
    );
    assert_eq!(found[0].target, target);

    // Teardown: unpublish, then the pod's directory is gone; unstage, then the staging dir is gone.
    let torn = e
        .plugin
        .tear_down("uid-1", "pv-1")
        .await
        .expect("tear down");
    assert_eq!(
        (torn.driver.as_str(), torn.volume_handle.as_str()),
        (DRIVER, "vol-1")
    );
    assert!(
        !target.parent().expect("parent").exists(),
        "pod volume dir removed"
    );
    e.plugin
        .unmount_device(DRIVER, "vol-1")
        .await
        .expect("unstage");
    assert!(
        !staging.parent().expect("parent").exists(),
        "staging dir removed"
    );
    let calls = d.calls();
    assert!(
        matches!(&calls[2], Call::Unpublish(u) if u.target_path == target.to_string_lossy() && u.volume_id == "vol-1")
    );
    assert!(
        matches!(&calls[3], Call::Unstage(u) if u.staging_target_path == staging.to_string_lossy())
    );
    assert!(
        e.plugin
            .reconstruct("uid-1")
            .await
            .expect("reconstruct")
            .is_empty()
    );
}

#[tokio::test]
async fn inline_volume_is_refused_unless_the_driver_allows_ephemeral() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::StageUnstageVolume])).await;
    let pod = pod("uid-2");
    let vol = inline_volume();

    // No CSIDriver object.
    let err = e
        .plugin
        .set_up(&pod, CsiVolume::Inline(&vol))
        .await
        .expect_err("no CSIDriver");
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"scratch\" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode \"Ephemeral\" not supported by driver fake.csi.k8s.io (no CSIDriver object)"
    );
    // A CSIDriver listing only Persistent.
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Persistent".into()]),
        ..no_attach()
    });
    let err = e
        .plugin
        .set_up(&pod, CsiVolume::Inline(&vol))
        .await
        .expect_err("persistent only");
    assert!(
        err.to_string()
            .ends_with("(only supports [\"Persistent\"])"),
        "{err}"
    );
    assert!(d.calls().is_empty(), "the driver is never asked");

    // Allowed: no stage, generated handle, ephemeral=true, the secret from the pod's namespace.
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..no_attach()
    });
    e.host.state.lock().secrets.insert(
        ("ns1".into(), "pub".into()),
        Secret {
            data: Some(BTreeMap::from([("k".into(), ByteString(b"v".to_vec()))])),
            ..Default::default()
        },
    );
    let mounted = e
        .plugin
        .set_up(&pod, CsiVolume::Inline(&vol))
        .await
        .expect("ephemeral set up");
    assert_eq!(
        mounted.path,
        e.root
            .join("pods/uid-2/volumes/kubernetes.io~csi/scratch/mount")
    );
    let calls = d.calls();
    assert_eq!(calls.len(), 1, "publish only: {calls:?}");
    let Call::Publish(p) = &calls[0] else {
        panic!("publish")
    };
    assert_eq!(p.volume_id, ephemeral_volume_handle("uid-2", "scratch"));
    assert_eq!(
        p.volume_context
            .get("csi.storage.k8s.io/ephemeral")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(
        p.volume_context.get("size").map(String::as_str),
        Some("1Mi")
    );
    assert_eq!(p.secrets.get("k").map(String::as_str), Some("v"));
    let data = load_volume_data(&e.root.join("pods/uid-2/volumes/kubernetes.io~csi/scratch"))
        .await
        .expect("vol_data");
    assert_eq!(
        data.get(keys::VOLUME_LIFECYCLE_MODE).map(String::as_str),
        Some("Ephemeral")
    );
}

#[tokio::test]
async fn fs_group_goes_to_the_driver_with_volume_mount_group_else_the_kubelet_applies_it() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[Cap::VolumeMountGroup])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "pub", "k");
    let mut pod = pod("uid-6");
    if let Some(spec) = pod.spec.as_mut() {
        spec.security_context = Some(PodSecurityContext {
            fs_group: Some(4321),
            ..Default::default()
        });
    }
    let pv6 = pv("pv-6", "vol-6");
    e.plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv6,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let calls = d.calls();
    let Some(Call::Publish(p)) = calls.last() else {
        panic!("publish")
    };
    let Some(crate::pb::volume_capability::AccessType::Mount(m)) = p
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_type.clone())
    else {
        panic!("mount");
    };
    assert_eq!(m.volume_mount_group, "4321");
    let target = e
        .root
        .join("pods/uid-6/volumes/kubernetes.io~csi/pv-6/mount");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(target.join("data")).expect("data").gid(),
        4321,
        "the driver's job"
    );

    // Without the capability, fsGroupPolicy File: the kubelet chowns.
    d.config.lock().caps.clear();
    e.csi_driver(CSIDriverSpec {
        fs_group_policy: Some("File".into()),
        ..no_attach()
    });
    let pv7 = pv("pv-7", "vol-7");
    e.plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv7,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let target = e
        .root
        .join("pods/uid-6/volumes/kubernetes.io~csi/pv-7/mount");
    assert_eq!(
        std::fs::metadata(target.join("data")).expect("data").gid(),
        4321
    );

    // fsGroupPolicy None: nothing changes.
    e.csi_driver(CSIDriverSpec {
        fs_group_policy: Some("None".into()),
        ..no_attach()
    });
    let pv8 = pv("pv-8", "vol-8");
    e.plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv8,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let target = e
        .root
        .join("pods/uid-6/volumes/kubernetes.io~csi/pv-8/mount");
    assert_ne!(
        std::fs::metadata(target.join("data")).expect("data").gid(),
        4321
    );
}

#[tokio::test]
async fn token_requests_reach_the_volume_context() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[])).await;
    e.csi_driver(CSIDriverSpec {
        token_requests: Some(vec![DriverTokenRequest {
            audience: "vault".into(),
            expiration_seconds: Some(3600),
        }]),
        ..no_attach()
    });
    secret(&e.host, "pub", "k");
    let pv = pv("pv-9", "vol-9");
    e.plugin
        .set_up(
            &pod("uid-9"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let calls = d.calls();
    let Some(Call::Publish(p)) = calls.last() else {
        panic!("publish")
    };
    let tokens: serde_json::Value = serde_json::from_str(
        p.volume_context
            .get("csi.storage.k8s.io/serviceAccount.tokens")
            .expect("tokens"),
    )
    .expect("json");
    assert_eq!(tokens["vault"]["token"], "token-for-vault");
    let s = e.host.state.lock();
    let (ns, sa, req) = &s.token_requests[0];
    assert_eq!((ns.as_str(), sa.as_str()), ("ns1", "sa1"));
    assert_eq!(req.spec.expiration_seconds, Some(3600));
    assert_eq!(
        req.spec
            .bound_object_ref
            .as_ref()
            .and_then(|b| b.uid.as_deref()),
        Some("uid-9")
    );
}
