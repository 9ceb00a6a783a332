//! CSI volumes (upstream `pkg/volume/csi`, `test/e2e/storage/csi_mock`) on real containerd.
//!
//! A host-path CSI driver (`kubelet-test-util`'s) registers through the
//! kubelet's plugin watcher as a deployed driver with its registrar does;
//! the test plays the control plane (CSIDriver object, PV binding, the
//! external-attacher marking the VolumeAttachment attached). Each test
//! checks what the driver was asked (upstream's paths and volume context)
//! and what the pod sees.

#[path = "csi_support.rs"]
mod csi_support;

#[path = "csi_lifecycle.rs"]
mod csi_lifecycle;

#[path = "csi_block.rs"]
mod csi_block;

#[path = "csi_mock.rs"]
mod csi_mock;

use std::path::Path;
use std::time::Duration;

use apiserver_double::Options;
use csi_support::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubelet_rs_integration::cluster::{Joined, phase};
use kubelet_rs_integration::*;
use kubelet_test_util::csi_driver::api::{
    DriverSpec, attachment_name, create_attachment, create_csi_driver, mark_attached,
};
use kubelet_test_util::csi_driver::{CsiDriver, DriverConfig, Fault, Request};
use serde_json::{Value, json};
use tonic::Code;

/// unstages it.
/// (a) A claim bound to a CSI PV of a driver that needs attaching: the pod
/// waits for the VolumeAttachment, then the volume is staged and published
/// on upstream's paths, the container sees the volume's files, the pod's
/// summary lists the volume's stats, and deleting the pod unpublishes and
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_pv_waits_for_attach_is_staged_published_and_torn_down() {
    let env = Env::start(DriverSpec {
        attach_required: Some(true),
        ..DriverSpec::default()
    })
    .await;
    let j = &env.j;
    env.bound_claim("claim-a", "pv-a", "vol-a", "hello-from-csi")
        .await;
    j.create_pod("attach", claim_pod("claim-a")).await;

    // Not attached: nothing is staged and the pod does not start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.driver.calls_of("NodeStageVolume").len(), 0);
    assert_ne!(phase(j.api_pod("attach").as_ref()), Some("Running"));

    let va = attachment_name("vol-a", DRIVER, &j.node.name);
    create_attachment(&j.admin, "pv-a", "vol-a", DRIVER, &j.node.name)
        .await
        .expect("VolumeAttachment");
    mark_attached(&j.admin, &va, None).await.expect("attached");

    let p = j
        .wait_api("attach", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let uid = uid(&p);
    wait_log(j, "attach", &uid, "hello-from-csi").await;

    let root = j.node.root_dir();
    let staging = root
        .join("plugins/kubernetes.io/csi")
        .join(DRIVER)
        .join(kubelet_csi::paths::sha256_hex("vol-a"))
        .join("globalmount");
    let vol_dir = env
        .pods_dir()
        .join(&uid)
        .join("volumes/kubernetes.io~csi/pv-a");
    let Request::NodeStageVolume(stage) = env.call("NodeStageVolume").await else {
        panic!("stage")
    };
    assert_eq!(Path::new(&stage.staging_target_path), staging);
    assert_eq!(stage.volume_id, "vol-a");
    let Request::NodePublishVolume(publish) = env.call("NodePublishVolume").await else {
        panic!("publish")
    };
    assert_eq!(Path::new(&publish.target_path), vol_dir.join("mount"));
    assert_eq!(Path::new(&publish.staging_target_path), staging);
    let data: Value = serde_json::from_slice(
        &std::fs::read(vol_dir.join("vol_data.json")).expect("vol_data.json"),
    )
    .expect("json");
    assert_eq!(data["driverName"], DRIVER);
    assert_eq!(data["volumeHandle"], "vol-a");
    assert_eq!(data["specVolID"], "pv-a");
    assert_eq!(data["attachmentID"], va.as_str());
    assert_eq!(data["volumeLifecycleMode"], "Persistent");
    let deadline = tokio::time::Instant::now() + T;
    let written = env.driver.volume_path("vol-a").join("written");
    while !written.exists() {
        assert!(tokio::time::Instant::now() < deadline, "pod wrote nothing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The summary lists the volume as the pod names it, with its claim.
    let summary = kubelet_server::stats::StatsProvider::summary(&*j.node.handle().host)
        .await
        .expect("summary");
    let pod = summary
        .pods
        .iter()
        .find(|p| p.pod_ref.uid == uid)
        .expect("pod in summary");
    assert_eq!(pod.volume.len(), 1, "{:?}", pod.volume);
    assert_eq!(pod.volume[0].name, "data");
    assert_eq!(
        pod.volume[0].pvc_ref.as_ref().map(|r| r.name.as_str()),
        Some("claim-a")
    );
    assert!(pod.volume[0].fs.capacity_bytes.is_some());
    // The node's `status.volumesInUse` lists the device while it is used.
    env.wait_volume_in_use("vol-a", true).await;

    env.delete_pod("attach").await;
    let Request::NodeUnpublishVolume(unpublish) = env.call("NodeUnpublishVolume").await else {
        panic!("unpublish")
    };
    assert_eq!(Path::new(&unpublish.target_path), vol_dir.join("mount"));
    let Request::NodeUnstageVolume(unstage) = env.call("NodeUnstageVolume").await else {
        panic!("unstage")
    };
    assert_eq!(Path::new(&unstage.staging_target_path), staging);
    wait_gone(&vol_dir).await;
    wait_gone(&staging).await;
    assert!(env.driver.published().is_empty());
    env.wait_volume_in_use("vol-a", false).await;
    env.j.cleanup().await;
}

/// (b) An inline ephemeral volume of a driver with `podInfoOnMount`
/// (upstream csi_mock "CSI workload information using mock driver"): the
/// volume context names the pod and says the volume is ephemeral; there is
/// no staging; deleting the pod unpublishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_ephemeral_volume_gets_the_pod_info_and_is_unpublished() {
    let env = Env::start(ephemeral_spec()).await;
    let j = &env.j;
    j.create_pod("inline", inline_pod()).await;
    let p = j
        .wait_api("inline", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let uid = uid(&p);
    wait_log(j, "inline", &uid, "inline").await;
    let Request::NodePublishVolume(publish) = env.call("NodePublishVolume").await else {
        panic!("publish")
    };
    let ctx = &publish.volume_context;
    let get = |k: &str| ctx.get(k).map(String::as_str);
    assert_eq!(get("csi.storage.k8s.io/ephemeral"), Some("true"));
    assert_eq!(
        get("csi.storage.k8s.io/pod.name"),
        Some(j.pod_name("inline").as_str())
    );
    assert_eq!(get("csi.storage.k8s.io/pod.namespace"), Some("default"));
    assert_eq!(get("csi.storage.k8s.io/pod.uid"), Some(uid.as_str()));
    assert!(ctx.contains_key("csi.storage.k8s.io/serviceAccount.name"));
    assert_eq!(get("size"), Some("1Mi"));
    let vol_dir = env
        .pods_dir()
        .join(&uid)
        .join("volumes/kubernetes.io~csi/scratch");
    assert_eq!(Path::new(&publish.target_path), vol_dir.join("mount"));
    assert_eq!(env.driver.calls_of("NodeStageVolume").len(), 0);

    env.delete_pod("inline").await;
    env.call("NodeUnpublishVolume").await;
    wait_gone(&vol_dir).await;
    assert_eq!(env.driver.calls_of("NodeUnstageVolume").len(), 0);
    env.j.cleanup().await;
}

/// (c) The driver restarts while a pod uses its volume: the plugin watcher
/// registers it again, the pod keeps running, and its volume is
/// unpublished through the new driver process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_restart_reregisters_and_the_pod_keeps_running() {
    let mut env = Env::start(ephemeral_spec()).await;
    env.j.create_pod("restart", inline_pod()).await;
    let p = env
        .j
        .wait_api("restart", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let container =
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"].clone();
    let before = env.driver.registration_statuses().len();
    env.driver.restart().await.expect("driver restart");
    let deadline = tokio::time::Instant::now() + T;
    while env.driver.registration_statuses().len() <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never re-registered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        env.driver
            .registration_statuses()
            .last()
            .is_some_and(|s| s.registered)
    );
    env.wait_csi_node_lists_driver().await;
    let p = env.j.api_pod("restart");
    assert_eq!(phase(p.as_ref()), Some("Running"));
    assert_eq!(
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"],
        container
    );
    env.driver.clear_calls();
    env.delete_pod("restart").await;
    env.call("NodeUnpublishVolume").await;
    env.j.cleanup().await;
}

/// (d) The kubelet restarts with a CSI volume mounted: the volume is
/// adopted (no stage or publish again), the pod is not restarted, and
/// deleting it later unpublishes and unstages it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_adopts_the_mounted_volume_and_tears_it_down_later() {
    let mut env = Env::start(DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    })
    .await;
    env.bound_claim("claim-d", "pv-d", "vol-d", "kept").await;
    env.j.create_pod("adopt", claim_pod("claim-d")).await;
    let p = env
        .j
        .wait_api("adopt", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let container =
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"].clone();
    let (staged, published) = (
        env.ok_calls("NodeStageVolume"),
        env.ok_calls("NodePublishVolume"),
    );
    assert_eq!((staged, published), (1, 1));

    env.j.node.restart().await;
    let name = env.j.pod_name("adopt");
    env.j
        .node
        .wait_status("adopt", T, "running again", |s| is_running(s, "main"))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // Give the new kubelet's volume manager a few loops.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.ok_calls("NodeStageVolume"), staged, "staged again");
    assert_eq!(
        env.ok_calls("NodePublishVolume"),
        published,
        "published again"
    );
    let p = env.j.api_pod("adopt");
    assert_eq!(
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"],
        container,
        "the container was restarted"
    );
    assert_eq!(
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["restartCount"],
        0
    );

    env.delete_pod("adopt").await;
    env.call("NodeUnpublishVolume").await;
    env.call("NodeUnstageVolume").await;
    assert!(env.driver.published().is_empty());
    assert!(env.driver.staged().is_empty());
    env.j.cleanup().await;
}

/// (e) From csi_mock: a NodePublishVolume error is a `FailedMount` event
/// with the driver's message, and the pod starts once the driver stops
/// failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_error_is_a_failed_mount_event_and_the_pod_starts_once_it_stops() {
    let env = Env::start(ephemeral_spec()).await;
    let j = &env.j;
    env.driver.set_fault(
        "NodePublishVolume",
        Fault::Fail(Code::Internal, "fake publish failure".into()),
    );
    j.create_pod("failing", inline_pod()).await;
    let want = "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = Internal desc = fake publish failure";
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.pod_events("failing");
        if events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "FailedMount" && m == want)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no FailedMount event {want:?}: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(phase(j.api_pod("failing").as_ref()), Some("Running"));
    env.driver.clear_fault("NodePublishVolume");
    j.wait_api("failing", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    env.delete_pod("failing").await;
    env.call("NodeUnpublishVolume").await;
    env.j.cleanup().await;
}

/// Online expansion: the control plane grows the PV past its claim's
/// status capacity; at the pod's next sync the kubelet asks the driver to
/// grow the published volume (`NodeExpandVolume` with the PV's size), once,
/// and records the new size in the claim's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_pv_is_expanded_on_the_node_at_the_next_pod_sync() {
    let data = tempfile::tempdir().expect("data");
    let j = Joined::start(Options::default()).await;
    create_csi_driver(
        &j.admin,
        DRIVER,
        &DriverSpec {
            attach_required: Some(false),
            ..DriverSpec::default()
        },
    )
    .await
    .expect("CSIDriver");
    let mut config = DriverConfig::new(DRIVER, &j.node.name, data.path());
    config.expand = true;
    let driver = CsiDriver::start_in_root(config, &j.node.root_dir())
        .await
        .expect("driver");
    assert!(
        driver
            .wait_registration(T)
            .await
            .is_some_and(|s| s.registered)
    );
    let env = Env {
        j,
        driver,
        _data: data,
    };
    env.wait_csi_node_lists_driver().await;
    env.bound_claim("claim-x", "pv-x", "vol-x", "small").await;
    env.j.create_pod("grow", claim_pod("claim-x")).await;
    env.j
        .wait_api("grow", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    assert!(env.driver.calls_of("NodeExpandVolume").is_empty());

    Api::<PersistentVolume>::all(env.j.admin.clone())
        .patch(
            "pv-x",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": {"storage": "2Gi"}}})),
        )
        .await
        .expect("grow pv");
    // A pod update makes the kubelet sync it (else the next periodic sync).
    Api::<Pod>::namespaced(env.j.admin.clone(), "default")
        .patch(
            &env.j.pod_name("grow"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"resized": "yes"}}})),
        )
        .await
        .expect("label pod");
    let Request::NodeExpandVolume(expand) = env.call("NodeExpandVolume").await else {
        panic!("expand")
    };
    assert_eq!(expand.volume_id, "vol-x");
    assert_eq!(
        expand.capacity_range.map(|c| c.required_bytes),
        Some(2 << 30)
    );
    let uid = uid(&env.j.api_pod("grow"));
    assert_eq!(
        Path::new(&expand.volume_path),
        env.pods_dir()
            .join(&uid)
            .join("volumes/kubernetes.io~csi/pv-x/mount")
    );
    assert_eq!(env.driver.expanded_size("vol-x"), Some(2 << 30));
    // The kubelet records the new size in the claim's status (upstream
    // `MarkFSResizeFinished`, a node's patch of `persistentvolumeclaims/status`).
    let claims = Api::<PersistentVolumeClaim>::namespaced(env.j.admin.clone(), "default");
    let deadline = tokio::time::Instant::now() + T;
    let recorded = loop {
        let c = claims.get("claim-x").await.expect("claim");
        let size = c
            .status
            .and_then(|s| s.capacity)
            .and_then(|m| m.get("storage").map(|q| q.0.clone()));
        if size.as_deref() == Some("2Gi") || tokio::time::Instant::now() > deadline {
            break size;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(recorded.as_deref(), Some("2Gi"), "claim status capacity");
    // Once per size, however often the pod syncs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.ok_calls("NodeExpandVolume"), 1);
    assert_eq!(
        env.ok_calls("NodePublishVolume"),
        1,
        "never published again"
    );
    env.delete_pod("grow").await;
    env.call("NodeUnstageVolume").await;
    env.j.cleanup().await;
}

/// A generic ephemeral volume: its claim `<pod>-<volume>`, created by the
/// control plane and owned by the pod, bound to a CSI PV, is staged and
/// published as any claim; a claim of that name the pod does not own is
/// refused with upstream's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_ephemeral_volume_uses_only_the_claim_its_pod_owns() {
    let env = Env::start(DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    })
    .await;
    let j = &env.j;
    let spec = || {
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX,
                "command": ["sh", "-c", "cat /data/hello; echo; sleep 3600"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/data"}]}],
            "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}}]
        })
    };
    let owned = j.create_pod("eph", spec()).await;
    let stray = j.create_pod("stray", spec()).await;
    // The ephemeral volume controller's part: the claims, the first owned
    // by its pod, the second not.
    for (pod, owner) in [(&owned, true), (&stray, false)] {
        let name = format!(
            "{}-scratch",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        env.bound_claim(&name, &format!("pv-{name}"), &format!("vol-{name}"), &name)
            .await;
        if owner {
            Api::<PersistentVolumeClaim>::namespaced(j.admin.clone(), "default")
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"ownerReferences": [{
                        "apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                        "uid": pod.metadata.uid, "controller": true,
                        "blockOwnerDeletion": true}]}})),
                )
                .await
                .expect("owner");
        }
    }
    let p = j
        .wait_api("eph", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    wait_log(
        j,
        "eph",
        &uid(&p),
        &format!("{}-scratch", j.pod_name("eph")),
    )
    .await;
    let want = format!(
        "PVC default/{0}-scratch was not created for pod default/{0} (pod is not owner)",
        j.pod_name("stray")
    );
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.pod_events("stray");
        if events
            .iter()
            .any(|(_, r, m)| r == "FailedMount" && m.contains(&want))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no FailedMount {want:?}: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(phase(j.api_pod("stray").as_ref()), Some("Running"));
    env.delete_pod("eph").await;
    env.call("NodeUnstageVolume").await;
    env.j.cleanup().await;
}

/// A driver whose CSIDriver asks for service-account tokens and
/// republishing (upstream csi_mock "CSIServiceAccountToken" and
/// "RequiresRepublish"): the publish carries a token per audience in
/// `csi.storage.k8s.io/serviceAccount.tokens`, and the volume is published
/// again at the pod's next sync. A 1.19 apiserver's CSIDriver has neither
/// field (both came in 1.20), so there the driver gets no tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_passed_to_the_driver_and_the_volume_is_republished() {
    let env = Env::start(DriverSpec {
        requires_republish: Some(true),
        token_requests: vec![("csi-aud".into(), Some(3600))],
        ..ephemeral_spec()
    })
    .await;
    let j = &env.j;
    let mut spec = inline_pod();
    spec["serviceAccountName"] = json!("default");
    j.create_pod("tokens", spec).await;
    j.wait_api("tokens", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let Request::NodePublishVolume(publish) = env.call("NodePublishVolume").await else {
        panic!("publish")
    };
    let tokens = publish
        .volume_context
        .get("csi.storage.k8s.io/serviceAccount.tokens");
    if !j.api.profile().at_least(20) {
        // 1.19's CSIDriver has neither field: the driver gets no tokens.
        assert_eq!(tokens, None);
        env.delete_pod("tokens").await;
        env.call("NodeUnpublishVolume").await;
        env.j.cleanup().await;
        return;
    }
    let tokens: Value =
        serde_json::from_str(tokens.expect("tokens in the volume context")).expect("tokens json");
    let token = tokens["csi-aud"]["token"].as_str().unwrap_or_default();
    assert!(token.starts_with("eyJ"), "a JWT: {tokens}");
    assert!(tokens["csi-aud"]["expirationTimestamp"].is_string());

    let before = env.ok_calls("NodePublishVolume");
    Api::<Pod>::namespaced(j.admin.clone(), "default")
        .patch(
            &j.pod_name("tokens"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"sync": "again"}}})),
        )
        .await
        .expect("label pod");
    let deadline = tokio::time::Instant::now() + T;
    while env.ok_calls("NodePublishVolume") <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never published again: {:?}",
            env.driver.calls()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.delete_pod("tokens").await;
    env.call("NodeUnpublishVolume").await;
    env.j.cleanup().await;
}
