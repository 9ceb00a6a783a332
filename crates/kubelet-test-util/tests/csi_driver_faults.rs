//! The test CSI driver's faults (hang, fail, fail the first calls, fail
//! after the work), a restart keeping its volumes, and the control plane
//! helpers against the apiserver double, over real unix sockets. Needs
//! root (mounts), as the integration suite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

#[allow(unused_imports)]
use common::*;

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
