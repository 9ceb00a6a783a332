//! CSI device lifecycle (upstream `operation_generator.go`
//! `GenerateMountVolumeFunc` / `GenerateUnmountDeviceFunc`): a device
//! staged for a pod whose publish then failed is still unstaged once the
//! pod goes, and the node's `status.volumesInUse` lists the device from the
//! set-up until the unstage.

use std::time::Duration;

use kubelet_rs_integration::cluster::phase;
use kubelet_test_util::csi_driver::Fault;
use kubelet_test_util::csi_driver::api::DriverSpec;
use tonic::Code;

use crate::csi_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_volume_whose_publish_failed_is_unstaged_when_the_pod_goes() {
    let env = Env::start(DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    })
    .await;
    let j = &env.j;
    env.bound_claim("claim-f", "pv-f", "vol-f", "never-read")
        .await;
    env.driver.set_fault(
        "NodePublishVolume",
        Fault::Fail(Code::Internal, "fake publish failure".into()),
    );
    j.create_pod("stuck", claim_pod("claim-f")).await;
    env.call("NodeStageVolume").await;
    env.driver
        .wait_for_call("NodePublishVolume", Code::Internal, T)
        .await
        .expect("a failed publish");
    let staging = env.staging("vol-f");
    assert!(staging.exists(), "staged");
    // Staged, not published: the device is in use.
    env.wait_volume_in_use("vol-f", true).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_ne!(phase(j.api_pod("stuck").as_ref()), Some("Running"));

    env.delete_pod("stuck").await;
    env.call("NodeUnstageVolume").await;
    wait_gone(&staging).await;
    assert!(env.driver.staged().is_empty(), "{:?}", env.driver.staged());
    env.wait_volume_in_use("vol-f", false).await;
    env.driver.clear_fault("NodePublishVolume");
    env.j.cleanup().await;
}

/// From csi_mock: a NodeStageVolume error is a `FailedMount` event naming
/// the MountDevice step and the PV, and the pod starts once the driver
/// stops failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_error_is_a_failed_mount_event_and_the_pod_starts_once_it_stops() {
    let env = Env::start(DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    })
    .await;
    let j = &env.j;
    env.bound_claim("claim-s", "pv-s", "vol-s", "staged").await;
    env.driver.set_fault(
        "NodeStageVolume",
        Fault::Fail(Code::Internal, "fake stage failure".into()),
    );
    j.create_pod("stage", claim_pod("claim-s")).await;
    let want = "MountVolume.MountDevice failed for volume \"pv-s\" : rpc error: code = Internal desc = fake stage failure";
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.pod_events("stage");
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
    assert!(env.driver.calls_of("NodePublishVolume").is_empty());
    env.driver.clear_fault("NodeStageVolume");
    j.wait_api("stage", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    env.delete_pod("stage").await;
    env.call("NodeUnstageVolume").await;
    env.j.cleanup().await;
}

/// A claim `claim` bound to a CSI PV `pv` (volume `handle`) whose node
/// affinity requires label `key` to be `value`.
async fn bind_with_affinity(
    env: &Env,
    claim: &str,
    pv: &str,
    handle: &str,
    key: &str,
    value: &str,
) {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::Api;
    use kube::api::{Patch, PatchParams, PostParams};
    let claims = Api::<PersistentVolumeClaim>::namespaced(env.j.admin.clone(), "default");
    let c: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("pvc");
    let c = claims
        .create(&PostParams::default(), &c)
        .await
        .expect("create pvc");
    let mut v = kubelet_test_util::csi_driver::api::csi_pv(
        pv,
        DRIVER,
        handle,
        ("default", claim),
        None,
        None,
        "Filesystem",
    );
    v["spec"]["claimRef"]["uid"] = serde_json::json!(c.metadata.uid);
    v["spec"]["nodeAffinity"] = serde_json::json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}});
    let v: PersistentVolume = serde_json::from_value(v).expect("pv");
    Api::<PersistentVolume>::all(env.j.admin.clone())
        .create(&PostParams::default(), &v)
        .await
        .expect("create pv");
    claims
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Bound",
                "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}})),
        )
        .await
        .expect("bind");
}

/// Upstream `checkNodeAffinity` (operation generator) against the Node's
/// labels as the apiserver holds them: a claim bound to a CSI PV whose node
/// affinity excludes this node is refused with upstream's `FailedMount`
/// text before any driver call; one whose affinity names the driver's
/// topology label (set on the Node at registration, not by the kubelet's
/// own label set) is mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_whose_node_affinity_excludes_the_node_is_never_staged() {
    let env = Env::start(DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    })
    .await;
    let j = &env.j;
    bind_with_affinity(
        &env,
        "claim-n",
        "pv-n",
        "vol-n",
        "kubernetes.io/hostname",
        "another-node",
    )
    .await;
    j.create_pod("elsewhere", claim_pod("claim-n")).await;
    let want =
        "MountVolume.NodeAffinity check failed for volume \"pv-n\" : no matching NodeSelectorTerms";
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.pod_events("elsewhere");
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
    assert!(env.driver.calls_of("NodeStageVolume").is_empty());
    assert!(env.driver.calls_of("NodePublishVolume").is_empty());
    assert_ne!(phase(j.api_pod("elsewhere").as_ref()), Some("Running"));
    env.delete_pod("elsewhere").await;

    let node = j.node.name.clone();
    bind_with_affinity(
        &env,
        "claim-t",
        "pv-t",
        "vol-t",
        "topology.hostpath.csi/node",
        &node,
    )
    .await;
    std::fs::create_dir_all(env.driver.volume_path("vol-t")).expect("volume dir");
    std::fs::write(env.driver.volume_path("vol-t").join("hello"), "topology").expect("file");
    j.create_pod("here", claim_pod("claim-t")).await;
    j.wait_api("here", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    env.delete_pod("here").await;
    env.j.cleanup().await;
}
