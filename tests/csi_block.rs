//! Raw block CSI volumes (upstream `csi_block.go`, `util.MapBlockVolume`,
//! `kubelet_pods.go` `makeBlockVolumes`; the e2e `volumeMode` suite's
//! "should create sc, pod, pv, and pvc, read/write to the pv, and delete
//! all created resources" for block): a claim with `volumeMode: Block`
//! bound to a CSI PV is staged and published on upstream's block paths,
//! linked from the pod's device map path and handed to the container as a
//! device node, which the container writes and reads; the data reaches the
//! volume; deleting the pod unpublishes, unmaps and unstages it. A block
//! claim named in `volumeMounts` is refused with upstream's message.

use std::path::Path;
use std::time::Duration;

use kubelet_rs_integration::cluster::phase;
use kubelet_rs_integration::*;
use kubelet_test_util::csi_driver::Request;
use kubelet_test_util::csi_driver::api::DriverSpec;
use serde_json::json;

use crate::csi_support::*;

fn block_pod(claim: &str) -> serde_json::Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX,
            "command": ["sh", "-c", "test -b /dev/xvda && echo is-a-block-device; \
                echo hello-block | dd of=/dev/xvda bs=512 conv=sync,fsync 2>/dev/null; \
                dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -c 11; echo; sleep 3600"],
            "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_pv_is_a_device_in_the_container_and_is_unmapped_on_delete() {
    let mut env = Env::start(DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    })
    .await;
    env.bind("claim-b", "pv-b", "vol-b", "Block").await;
    let j = &env.j;

    // Upstream's populator refuses a block claim in volumeMounts.
    j.create_pod("wrongmode", claim_pod("claim-b")).await;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.pod_events("wrongmode");
        if events.iter().any(|(t, r, m)| {
            t == "Warning"
                && r == "FailedMount"
                && m.contains("volume data has volumeMode Block, but is specified in volumeMounts")
        }) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{events:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_ne!(phase(j.api_pod("wrongmode").as_ref()), Some("Running"));
    assert_eq!(env.driver.calls_of("NodeStageVolume").len(), 0);
    env.delete_pod("wrongmode").await;

    j.create_pod("block", block_pod("claim-b")).await;
    let p = j
        .wait_api("block", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let uid = uid(&p);
    wait_log(j, "block", &uid, "is-a-block-device").await;
    wait_log(j, "block", &uid, "hello-block").await;

    let devices = j
        .node
        .root_dir()
        .join("plugins/kubernetes.io/csi/volumeDevices");
    let staging = devices.join("staging/pv-b");
    let publish = devices.join("publish/pv-b").join(&uid);
    let Request::NodeStageVolume(stage) = env.call("NodeStageVolume").await else {
        panic!("stage")
    };
    assert_eq!(Path::new(&stage.staging_target_path), staging);
    let Request::NodePublishVolume(published) = env.call("NodePublishVolume").await else {
        panic!("publish")
    };
    assert_eq!(Path::new(&published.target_path), publish);
    assert_eq!(Path::new(&published.staging_target_path), staging);
    let link = env
        .pods_dir()
        .join(&uid)
        .join("volumeDevices/kubernetes.io~csi/pv-b");
    assert_eq!(std::fs::read_link(&link).expect("device link"), publish);
    let global = devices.join("pv-b/dev").join(&uid);
    assert!(global.exists(), "global map path");
    let data: serde_json::Value = serde_json::from_slice(
        &std::fs::read(devices.join("pv-b/data/vol_data.json")).expect("vol_data.json"),
    )
    .expect("json");
    assert_eq!(data["volumeHandle"], "vol-b");
    assert_eq!(data["specVolID"], "pv-b");
    // What the container wrote is on the volume.
    let backing = env.driver.block_file("vol-b");
    let bytes = std::fs::read(&backing).expect("backing file");
    assert!(bytes.starts_with(b"hello-block"), "{:?}", &bytes[..16]);
    env.wait_volume_in_use("vol-b", true).await;

    // A kubelet restart adopts the mapped device: no driver call, the
    // container keeps running.
    let container =
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"].clone();
    let calls = (
        env.ok_calls("NodeStageVolume"),
        env.ok_calls("NodePublishVolume"),
    );
    assert_eq!(calls, (1, 1));
    env.j.node.restart().await;
    let name = env.j.pod_name("block");
    env.j
        .node
        .wait_status("block", T, "running again", |s| is_running(s, "main"))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        (
            env.ok_calls("NodeStageVolume"),
            env.ok_calls("NodePublishVolume")
        ),
        calls,
        "staged or published again"
    );
    let p = env.j.api_pod("block");
    assert_eq!(
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"],
        container,
        "the container was restarted"
    );
    assert_eq!(std::fs::read_link(&link).expect("device link"), publish);

    env.delete_pod("block").await;
    let Request::NodeUnpublishVolume(unpublish) = env.call("NodeUnpublishVolume").await else {
        panic!("unpublish")
    };
    assert_eq!(Path::new(&unpublish.target_path), publish);
    let Request::NodeUnstageVolume(unstage) = env.call("NodeUnstageVolume").await else {
        panic!("unstage")
    };
    assert_eq!(Path::new(&unstage.staging_target_path), staging);
    wait_gone(&link).await;
    wait_gone(&global).await;
    wait_gone(&devices.join("pv-b")).await;
    assert!(env.driver.published().is_empty());
    env.wait_volume_in_use("vol-b", false).await;
    env.j.cleanup().await;
}
