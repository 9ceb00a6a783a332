//! csi_mock "CSI Mock volume fsgroup policies", "CSI Mock fsgroup as mount
//! option", "CSI Mock volume expansion" and "CSI Mock when kubelet
//! restart": who gives the pod's fsGroup the volume, what NodeExpandVolume
//! carries and what the claim's status says after it, and a terminating
//! claim's volume kept through a kubelet restart.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubelet_csi::pb::volume_capability::AccessType;
use kubelet_rs_integration::cluster::phase;
use kubelet_rs_integration::*;
use kubelet_test_util::csi_driver::Request;
use kubelet_test_util::csi_driver::api::DriverSpec;
use serde_json::{Value, json};
use tonic::Code;

use crate::csi_support::*;

fn no_attach() -> DriverSpec {
    DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    }
}

/// Upstream's busybox pod with `fsGroup` (`startBusyBoxPodWithClaim`); the
/// container makes a directory and a file on the volume and prints the
/// file's group, as `VerifyFSGroupInPod` reads it with `ls -l`.
fn fs_group_pod(claim: &str, fs_group: i64) -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"fsGroup": fs_group},
        "containers": [{"name": "main", "image": BUSYBOX,
            "command": ["sh", "-c", "mkdir /mnt/test/dir && echo filecontents > /mnt/test/dir/file \
                && sync && echo group=$(ls -ln /mnt/test/dir/file | awk '{print $4}'); sleep 3600"],
            "volumeMounts": [{"name": "my-volume", "mountPath": "/mnt/test"}]}],
        "volumes": [{"name": "my-volume", "persistentVolumeClaim": {"claimName": claim}}]
    })
}

/// The `volume_mount_group` of a stage or publish request's capability.
fn mount_group(r: &Request) -> String {
    let cap = match r {
        Request::NodeStageVolume(s) => s.volume_capability.clone(),
        Request::NodePublishVolume(p) => p.volume_capability.clone(),
        _ => None,
    };
    match cap.and_then(|c| c.access_type) {
        Some(AccessType::Mount(m)) => m.volume_mount_group,
        _ => String::new(),
    }
}

/// csi_mock "CSI FSGroupPolicy": "should modify fsGroup if
/// fsGroupPolicy=default" (ReadWriteOnceWithFSType: an RWO claim with an
/// fsType), "should modify fsGroup if fsGroupPolicy=File" and "should not
/// modify fsGroup if fsGroupPolicy=None" (the file the pod writes is
/// root's); and "Delegate FSGroup to CSI driver": "should pass FSGroup to
/// CSI driver if it is set in pod and driver supports VOLUME_MOUNT_GROUP"
/// (NodeStage and NodePublish carry it as `volume_mount_group`) and "should
/// not pass FSGroup to CSI driver if it is set in pod and driver supports
/// VOLUME_MOUNT_GROUP" (the capability off: empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_group_by_policy_or_by_the_driver() {
    let env = Env::start(no_attach()).await;
    // 1.19 drops `fsGroupPolicy` (alpha there): the kubelet's default,
    // ReadWriteOnceWithFSType, applies.
    let policies = env.j.api.profile().at_least(20);
    let cases = [
        ("default", Some("ReadWriteOnceWithFSType"), false, true),
        ("file", Some("File"), false, true),
        ("none", Some("None"), false, !policies),
        ("mountgroup", None, true, true),
        ("nomountgroup", None, false, true),
    ];
    for (i, (name, policy, volume_mount_group, modified)) in cases.into_iter().enumerate() {
        env.set_csi_driver(Some(&DriverSpec {
            fs_group_policy: policy.map(str::to_string),
            ..no_attach()
        }))
        .await;
        env.driver
            .configure(|c| c.volume_mount_group = volume_mount_group);
        env.driver.clear_calls();
        let fs_group = 2000 + i as i64;
        let claim = format!("claim-{name}");
        env.bound_claim(&claim, &format!("pv-{name}"), &format!("vol-{name}"), name)
            .await;
        env.j.create_pod(name, fs_group_pod(&claim, fs_group)).await;
        let p = env
            .j
            .wait_api(name, T, "Running", |p| phase(p) == Some("Running"))
            .await;
        let want = if modified { fs_group } else { 0 };
        wait_log(&env.j, name, &uid(&p), &format!("group={want}")).await;
        if policy.is_none() {
            let want = if volume_mount_group {
                fs_group.to_string()
            } else {
                String::new()
            };
            for method in ["NodeStageVolume", "NodePublishVolume"] {
                let call = env.call(method).await;
                assert_eq!(mount_group(&call), want, "{name}: {method}");
            }
        }
        env.delete_pod(name).await;
        env.call("NodeUnstageVolume").await;
    }
    env.j.cleanup().await;
}

/// What the control plane's resizer does: the PV grows to `size` and
/// the claim waits for the node (`FileSystemResizePending`).
async fn grow(env: &Env, pv: &str, claim: &str, size: &str) {
    Api::<PersistentVolume>::all(env.j.admin.clone())
        .patch(
            pv,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": {"storage": size}}})),
        )
        .await
        .expect("grow pv");
    Api::<PersistentVolumeClaim>::namespaced(env.j.admin.clone(), "default")
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "FileSystemResizePending", "status": "True"}]}})),
        )
        .await
        .expect("resize pending");
}

/// Waits for the claim's status to say `size` with no condition left
/// (upstream `WaitForFSResize` and "pvc should not have conditions").
async fn wait_resized(env: &Env, claim: &str, size: &str) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let c = env.claim(claim);
        let status = c.as_ref().map(|c| &c["status"]);
        let done = status.is_some_and(|s| {
            s["capacity"]["storage"] == size && s["conditions"].as_array().is_none_or(Vec::is_empty)
        });
        if done {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "claim {claim} never resized: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The NodeExpandVolume calls of volume `handle` that succeeded.
fn expands(env: &Env, handle: &str) -> Vec<kubelet_csi::pb::NodeExpandVolumeRequest> {
    env.driver
        .calls_of("NodeExpandVolume")
        .into_iter()
        .filter(|c| c.code == Code::Ok)
        .filter_map(|c| match c.request {
            Request::NodeExpandVolume(r) if r.volume_id == handle => Some(r),
            _ => None,
        })
        .collect()
}

/// csi_mock "CSI Volume expansion": "should expand volume by restarting
/// pod if attach=off, nodeExpansion=on" and "should not have staging_path
/// missing in node expand volume pod if attach=off, nodeExpansion=on"
/// (the volume grown while a pod used it is expanded on the node, with
/// its staging path, and the claim's status gets the size without
/// conditions once a pod runs on it again); "CSI online volume expansion
/// with secret": "should expand volume without restarting pod if
/// nodeExpansion=on, csiNodeExpandSecret=on" (NodeExpandVolume carries the
/// PV's `nodeExpandSecretRef` data). Attaching is the control plane's part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_expansion_on_the_node() {
    let env = Env::start_with(Some(no_attach()), |c| c.expand = true).await;
    let j = &env.j;
    env.bound_claim("claim-off", "pv-off", "vol-off", "off")
        .await;
    j.create_pod("off1", claim_pod("claim-off")).await;
    j.wait_api("off1", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    grow(&env, "pv-off", "claim-off", "6Gi").await;
    env.delete_pod("off1").await;
    j.create_pod("off2", claim_pod("claim-off")).await;
    j.wait_api("off2", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    wait_resized(&env, "claim-off", "6Gi").await;
    let done = expands(&env, "vol-off");
    let last = done.last().expect("NodeExpandVolume");
    assert_eq!(last.capacity_range.map(|c| c.required_bytes), Some(6 << 30));
    assert_eq!(
        std::path::Path::new(&last.staging_target_path),
        env.staging("vol-off"),
        "staging_path missing"
    );
    env.delete_pod("off2").await;

    // With a secret.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "test-secret", "namespace": "default"},
        "data": {"username": ByteString(b"admin".to_vec()),
            "password": ByteString(b"t0p-Secret".to_vec())}}))
    .expect("secret");
    Api::<Secret>::namespaced(j.admin.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    env.bound_claim("claim-sec", "pv-sec", "vol-sec", "sec")
        .await;
    Api::<PersistentVolume>::all(j.admin.clone())
        .patch(
            "pv-sec",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"csi": {"nodeExpandSecretRef":
                {"name": "test-secret", "namespace": "default"}}}})),
        )
        .await
        .expect("expand secret ref");
    j.create_pod("sec", claim_pod("claim-sec")).await;
    j.wait_api("sec", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    grow(&env, "pv-sec", "claim-sec", "6Gi").await;
    // A pod update makes the kubelet sync it (else the next periodic sync).
    Api::<Pod>::namespaced(j.admin.clone(), "default")
        .patch(
            &j.pod_name("sec"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"resized": "yes"}}})),
        )
        .await
        .expect("label pod");
    wait_resized(&env, "claim-sec", "6Gi").await;
    let done = expands(&env, "vol-sec");
    let secrets = &done.last().expect("NodeExpandVolume").secrets;
    assert_eq!(secrets.get("username").map(String::as_str), Some("admin"));
    assert_eq!(
        secrets.get("password").map(String::as_str),
        Some("t0p-Secret")
    );
    let container =
        |p: Option<Value>| p.map(|p| p["status"]["containerStatuses"][0]["restartCount"].clone());
    assert_eq!(container(j.api_pod("sec")), Some(json!(0)), "restarted");
    env.delete_pod("sec").await;
    env.j.cleanup().await;
}

/// csi_mock "CSI Mock when kubelet restart": "should not umount volume
/// when the pvc is terminating but still used by a running pod": the claim
/// is deleted (its `pvc-protection` finalizer keeps it, terminating), the
/// kubelet restarts, and the volume stays published and the pod running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_claim_in_use_stays_mounted_across_a_kubelet_restart() {
    let mut env = Env::start(no_attach()).await;
    env.bound_claim("claim-term", "pv-term", "vol-term", "term")
        .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(env.j.admin.clone(), "default");
    claims
        .patch(
            "claim-term",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["kubernetes.io/pvc-protection"]}})),
        )
        .await
        .expect("finalizer");
    env.j.create_pod("term", claim_pod("claim-term")).await;
    let p = env
        .j
        .wait_api("term", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let container =
        p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"].clone();
    claims
        .delete("claim-term", &Default::default())
        .await
        .expect("delete claim");
    let c = env.claim("claim-term").expect("still there");
    assert!(
        c["metadata"]["deletionTimestamp"].is_string(),
        "terminating: {c}"
    );

    env.j.node.restart().await;
    let name = env.j.pod_name("term");
    env.j
        .node
        .wait_status("term", T, "running again", |s| is_running(s, "main"))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // Consistently, for a while: no unpublish, the pod runs on.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            env.driver.calls_of("NodeUnpublishVolume").is_empty(),
            "unpublished: {:?}",
            env.driver.calls()
        );
        let p = env.j.api_pod("term");
        assert_eq!(phase(p.as_ref()), Some("Running"));
        assert_eq!(
            p.as_ref().expect("pod")["status"]["containerStatuses"][0]["containerID"],
            container
        );
    }
    env.delete_pod("term").await;
    env.call("NodeUnpublishVolume").await;
    env.j.cleanup().await;
}
