//! CSI volumes in the volume manager: the plugin's own event text, and a
//! published volume's directory (`<spec name>`, holding `mount`) kept and
//! torn down as the volume's, found on disk or not.

use kubelet_volume::plugin::names::CSI;

use super::*;

#[tokio::test(start_paused = true)]
async fn a_csi_error_is_the_whole_failed_mount_message() {
    let f = fixture(vec![]);
    f.ops.failing_csi.lock().insert("scratch".into());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "scratch", "csi": {"driver": "d.example.com"}}]),
    );
    let vm = f.vm.clone();
    let p2 = p.clone();
    let wait = tokio::spawn(async move { vm.wait_for_attach_and_mount(&p2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let events = f.events.events.lock().clone();
    assert_eq!(
        events.first(),
        Some(&(
            "FailedMount".to_string(),
            "MountVolume.SetUp failed for volume \"scratch\" : rpc error: code = Internal desc = boom"
                .to_string()
        ))
    );
    f.ops.failing_csi.lock().clear();
    wait.await
        .expect("join")
        .expect("mounted once the driver stops failing");
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_csi_volume_found_under_its_pv_name_is_adopted_and_torn_down_as_a_directory() {
    let dir = PathBuf::from("/var/lib/kubelet-test/pods/u1/volumes/kubernetes.io~csi/pv-1");
    let f = fixture(vec![OnDisk {
        uid: "u1".into(),
        plugin: CSI,
        name: "pv-1".into(),
        dir: dir.clone(),
    }]);
    f.ops.csi.lock().insert("data".into(), "pv-1".into());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
    );
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    settle().await;
    assert_eq!(f.ops.calls(), vec!["set_up data"], "nothing torn down");
    assert_eq!(
        f.vm.get_mounted_volumes_for_pod("u1")["data"].host_path,
        dir.join("mount")
    );
    f.vm.pod_terminated("u1", true);
    assert!(f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await);
    settle().await;
    // One tear-down, of the volume's directory, through the CSI plugin.
    assert_eq!(f.ops.torn.lock().clone(), vec![(CSI.to_string(), dir)]);
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_csi_set_up_is_torn_down_through_its_directory_when_the_pod_goes() {
    let dir = PathBuf::from("/var/lib/kubelet-test/pods/u1/volumes/kubernetes.io~csi/pv-1");
    let f = fixture(vec![]);
    // Staged, then publishing failed: the device must still be unstaged.
    f.ops.failing_csi.lock().insert("data".into());
    f.ops.set_up_dirs.lock().insert("data".into(), dir.clone());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
    );
    let vm = f.vm.clone();
    let p2 = p.clone();
    let wait = tokio::spawn(async move { vm.wait_for_attach_and_mount(&p2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(f.ops.count("set_up data") >= 1);
    f.vm.pod_terminated("u1", true);
    assert!(f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await);
    settle().await;
    wait.abort();
    let torn: Vec<PathBuf> = f.ops.torn.lock().iter().map(|t| t.1.clone()).collect();
    assert_eq!(
        torn,
        vec![dir],
        "the failed set-up's directory is torn down"
    );
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_set_up_longer_than_the_default_bound_runs_to_its_own_deadline() {
    let f = fixture(vec![]);
    // A CSI set-up may wait 10 min for attach, then stage and publish.
    *f.ops.set_up_timeout.lock() = Some(Duration::from_secs(1000));
    *f.ops.delay.lock() = Duration::from_secs(300);
    f.ops.csi.lock().insert("data".into(), "pv-1".into());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
    );
    f.vm.wait_for_attach_and_mount_within(&p, Duration::from_secs(600))
        .await
        .expect("mounted after 300 s");
    assert_eq!(f.ops.count("set_up data"), 1, "not cut short and retried");
    assert!(f.events.events.lock().is_empty(), "no FailedMount");
    f.shutdown.cancel();
}
