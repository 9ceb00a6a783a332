//! Attach wait, deadlines, driver errors, stats and expand.

use super::*;

fn attachment(status: VolumeAttachmentStatus) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(attachment_name("vol-1", DRIVER, "node-1")),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: "node-1".into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some("pv-1".into()),
                ..Default::default()
            },
        },
        status: Some(status),
    }
}

#[tokio::test(start_paused = true)]
async fn attach_wait_reports_attach_error_and_times_out() {
    let e = env(Timeouts {
        attach: Duration::from_secs(30),
        attach_poll: Duration::from_secs(1),
        ..Timeouts::default()
    });
    let pod = pod("uid-3");
    let pv = pv("pv-1", "vol-1");
    let name = attachment_name("vol-1", DRIVER, "node-1");

    // No CSIDriver: attach is required; nothing appears: upstream's timeout text.
    let err = e
        .plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("timeout");
    assert_eq!(
        err.to_string(),
        "MountVolume.WaitForAttach failed for volume \"pv-1\" : timed out waiting for external-attacher of fake.csi.k8s.io CSI driver to attach volume vol-1"
    );
    assert!(e.host.state.lock().va_reads >= 30, "polled every second");

    // attachRequired: true and the attacher failed: its message.
    e.csi_driver(CSIDriverSpec {
        attach_required: Some(true),
        ..Default::default()
    });
    e.host.state.lock().attachments.insert(
        name.clone(),
        attachment(VolumeAttachmentStatus {
            attached: false,
            attach_error: Some(VolumeError {
                message: Some("rpc error: code = Internal desc = no disk".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    );
    let err = e
        .plugin
        .set_up(
            &pod,
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("attach error");
    assert_eq!(
        err.to_string(),
        "MountVolume.WaitForAttach failed for volume \"pv-1\" : rpc error: code = Internal desc = no disk"
    );

    // Attached: the wait returns the attachment metadata as publish context.
    e.host.state.lock().attachments.insert(
        name.clone(),
        attachment(VolumeAttachmentStatus {
            attached: true,
            attachment_metadata: Some(BTreeMap::from([("devicePath".into(), "/dev/x".into())])),
            ..Default::default()
        }),
    );
    let (id, ctx) = crate::attach::wait_for_attach(
        e.host.as_ref(),
        DRIVER,
        "vol-1",
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .await
    .expect("attached");
    assert_eq!(id, name);
    assert_eq!(ctx.get("devicePath").map(String::as_str), Some("/dev/x"));
}

#[tokio::test]
async fn a_hung_publish_hits_its_deadline_and_keeps_the_directory() {
    let e = env(Timeouts {
        operation: Duration::from_millis(300),
        ..Timeouts::default()
    });
    let mut config = caps(&[]);
    config.hang_publish = true;
    let _d = e.driver(config).await;
    e.csi_driver(no_attach());
    let pod = pod("uid-4");
    let vol = inline_volume();
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..no_attach()
    });
    e.host
        .state
        .lock()
        .secrets
        .insert(("ns1".into(), "pub".into()), Secret::default());
    // A generous outer bound: the 300ms deadline, not the driver, ends the call.
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        e.plugin.set_up(&pod, CsiVolume::Inline(&vol)),
    )
    .await
    .expect("the deadline ends the call")
    .expect_err("deadline");
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    );
    // The publish may still complete: the volume directory and its data stay for teardown.
    assert!(
        e.root
            .join("pods/uid-4/volumes/kubernetes.io~csi/scratch/vol_data.json")
            .exists()
    );
}

#[tokio::test]
async fn a_failed_publish_cleans_up_and_shows_the_grpc_error() {
    let e = env(Timeouts::default());
    let mut config = caps(&[]);
    config.fail_publish = Some("no space".into());
    let _d = e.driver(config).await;
    e.csi_driver(CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..no_attach()
    });
    e.host
        .state
        .lock()
        .secrets
        .insert(("ns1".into(), "pub".into()), Secret::default());
    let err = e
        .plugin
        .set_up(&pod("uid-5"), CsiVolume::Inline(&inline_volume()))
        .await
        .expect_err("fails");
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = Internal desc = no space"
    );
    assert!(
        !e.root
            .join("pods/uid-5/volumes/kubernetes.io~csi/scratch")
            .exists()
    );
}

#[tokio::test]
async fn stats_and_expand_follow_the_capabilities() {
    let e = env(Timeouts::default());
    let d = e.driver(caps(&[])).await;
    e.csi_driver(no_attach());
    secret(&e.host, "pub", "k");
    let pv = pv("pv-10", "vol-10");
    e.plugin
        .set_up(
            &pod("uid-10"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    assert_eq!(
        e.plugin
            .volume_stats("uid-10", "pv-10")
            .await
            .expect("stats"),
        None
    );
    assert_eq!(
        e.plugin
            .expand("uid-10", "pv-10", 2048, "ext4", "ReadWriteOnce")
            .await
            .expect("expand"),
        None
    );

    d.config.lock().caps = vec![Cap::GetVolumeStats, Cap::ExpandVolume];
    let stats = e
        .plugin
        .volume_stats("uid-10", "pv-10")
        .await
        .expect("stats")
        .expect("some");
    assert_eq!(stats.bytes, Some((70, 100, 30)));
    assert_eq!(stats.abnormal.as_deref(), Some("disk sad"));
    assert_eq!(
        e.plugin
            .expand("uid-10", "pv-10", 2048, "ext4", "ReadWriteOnce")
            .await
            .expect("expand"),
        Some(2048)
    );
    let calls = d.calls();
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, Call::Stats(s) if s.volume_id == "vol-10"))
    );
    assert!(calls.iter().any(|c| matches!(c, Call::Expand(x) if x.capacity_range.as_ref().map(|r| r.required_bytes) == Some(2048))));
}

/// Upstream `nodeExpandWithClient`: the PV's `nodeExpandSecretRef` data
/// and mount options go with `NodeExpandVolume` (csi_mock "CSI online
/// volume expansion with secret"); a missing secret fails the expansion
/// with upstream's text.
#[tokio::test]
async fn node_expand_passes_the_expand_secret_and_mount_options() {
    let e = env(Timeouts::default());
    let d = e
        .driver(caps(&[Cap::ExpandVolume, Cap::StageUnstageVolume]))
        .await;
    e.csi_driver(no_attach());
    for name in ["stage", "pub"] {
        secret(&e.host, name, "k");
    }
    let mut pv = pv("pv-12", "vol-12");
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.node_expand_secret_ref = Some(SecretReference {
            name: Some("expand".into()),
            namespace: Some("sec".into()),
        });
    }
    e.plugin
        .set_up(
            &pod("uid-12"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect("set up");
    let err = e
        .plugin
        .node_expand("uid-12", &pv, 4096)
        .await
        .expect_err("no such secret");
    assert!(
        err.to_string().starts_with(
            "MountVolume.NodeExpandVolume failed for volume \"pv-12\" : expander.NodeExpand failed to get NodeExpandSecretRef sec/expand: "
        ),
        "{err}"
    );
    assert!(!d.calls().iter().any(|c| matches!(c, Call::Expand(_))));

    secret(&e.host, "expand", "password");
    assert!(
        e.plugin
            .node_expand("uid-12", &pv, 4096)
            .await
            .expect("grown")
    );
    let expand = d
        .calls()
        .into_iter()
        .find_map(|c| match c {
            Call::Expand(x) => Some(x),
            _ => None,
        })
        .expect("NodeExpandVolume");
    assert_eq!(
        expand.secrets.get("password").map(String::as_str),
        Some("s3cr3t")
    );
    assert!(!expand.staging_target_path.is_empty(), "the staging path");
    let flags = match expand.volume_capability.and_then(|c| c.access_type) {
        Some(crate::pb::volume_capability::AccessType::Mount(m)) => m.mount_flags,
        other => panic!("{other:?}"),
    };
    assert_eq!(flags, vec!["noatime".to_string()]);
}

#[tokio::test]
async fn an_unregistered_driver_is_upstreams_error() {
    let e = env(Timeouts::default());
    e.csi_driver(no_attach());
    let pv = pv("pv-11", "vol-11");
    let err = e
        .plugin
        .set_up(
            &pod("uid-11"),
            CsiVolume::Persistent {
                pv: &pv,
                read_only: false,
            },
        )
        .await
        .expect_err("no driver");
    assert_eq!(
        err.to_string(),
        "MountVolume.MountDevice failed for volume \"pv-11\" : kubernetes.io/csi: attacher.MountDevice failed to create newCsiDriverClient: driver name fake.csi.k8s.io not found in the list of registered CSI drivers"
    );
}

/// Upstream `NodeExpander`: the claim is marked NodeResizeInProgress before
/// the driver's call, and a driver's `InvalidArgument` marks it
/// NodeResizeInfeasible with a NodeResizeError condition.
#[tokio::test]
async fn node_expansion_progress_and_failure_reach_the_claims_status() {
    let e = env(Timeouts::default());
    let pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "3"},
            "status": {"capacity": {"storage": "1Gi"}}}))
        .expect("pvc");
    e.plugin
        .mark_node_expansion_in_progress(&pvc)
        .await
        .expect("in progress");
    let err = crate::Error::Grpc(tonic::Status::invalid_argument("too big"));
    e.plugin
        .mark_node_expansion_failed(&pvc, &err)
        .await
        .expect("failed");
    let patches = e.host.state.lock().claim_patches.clone();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(
        patches[0].1["status"]["allocatedResourceStatuses"]["storage"],
        "NodeResizeInProgress"
    );
    assert_eq!(patches[0].1["metadata"]["resourceVersion"], "3");
    let failed = &patches[1].1["status"];
    assert_eq!(
        failed["allocatedResourceStatuses"]["storage"],
        "NodeResizeInfeasible"
    );
    assert_eq!(failed["conditions"][0]["type"], "NodeResizeError");
    assert_eq!(
        failed["conditions"][0]["message"],
        "failed to expand pvc with rpc error: code = InvalidArgument desc = too big"
    );
}
