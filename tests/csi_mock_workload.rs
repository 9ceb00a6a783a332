//! csi_mock "CSI Mock workload info", "CSI Mock volume service account
//! token", "CSI Mock volume attach" and "CSI Mock volume limit": what the
//! CSIDriver object (or its absence) makes the kubelet put into
//! NodePublishVolume, whether it waits for attachment, and the driver's
//! attach limit in the CSINode object.

use std::time::Duration;

use kubelet_csi::pb;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::phase;
use kubelet_test_util::csi_driver::Request;
use kubelet_test_util::csi_driver::api::{DriverSpec, attachment_name};
use kubelet_test_util::csi_driver::attacher::attach_once;
use serde_json::{Value, json};

use crate::csi_support::*;

const POD_INFO: [&str; 4] = [
    "csi.storage.k8s.io/pod.name",
    "csi.storage.k8s.io/pod.namespace",
    "csi.storage.k8s.io/pod.uid",
    "csi.storage.k8s.io/serviceAccount.name",
];
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
const TOKENS: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// Upstream's pause pod on a claim (`startPausePodWithClaim`), as the
/// ServiceAccount admission plugin leaves it.
fn pause_pod(claim: &str) -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "serviceAccountName": "default",
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
            "volumeMounts": [{"name": "my-volume", "mountPath": "/mnt/test"}]}],
        "volumes": [{"name": "my-volume", "persistentVolumeClaim": {"claimName": claim}}]
    })
}

/// The first NodePublishVolume of `handle`.
fn first_publish(env: &Env, handle: &str) -> pb::NodePublishVolumeRequest {
    env.driver
        .calls_of("NodePublishVolume")
        .into_iter()
        .find_map(|c| match c.request {
            Request::NodePublishVolume(r) if r.volume_id == handle => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no NodePublishVolume of {handle}"))
}

/// Runs a pause pod on a new claim until it is Running, deletes it and
/// checks the volume was unpublished (upstream `checkPodLogs`' call count);
/// returns the pod's UID and its first NodePublishVolume.
async fn run_pod(env: &Env, name: &str) -> (String, pb::NodePublishVolumeRequest) {
    let (claim, handle) = (format!("claim-{name}"), format!("vol-{name}"));
    env.bound_claim(&claim, &format!("pv-{name}"), &handle, name)
        .await;
    env.j.create_pod(name, pause_pod(&claim)).await;
    let p = env
        .j
        .wait_api(name, T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let publish = first_publish(env, &handle);
    env.delete_pod(name).await;
    let unpublished =
        env.driver.calls_of("NodeUnpublishVolume").iter().any(
            |c| matches!(&c.request, Request::NodeUnpublishVolume(r) if r.volume_id == handle),
        );
    assert!(unpublished, "{name}: NodeUnpublish was never called");
    (uid(&p), publish)
}

fn no_attach() -> DriverSpec {
    DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    }
}

/// csi_mock "CSI workload information using mock driver" with a claim:
/// "should not be passed when podInfoOnMount=nil", "should be passed when
/// podInfoOnMount=true" (with `ephemeral` "false") and "should not be
/// passed when podInfoOnMount=false"; "CSI attach test using mock driver":
/// "should not require VolumeAttach for drivers without attachment" (the
/// pods run with no VolumeAttachment); and "CSIServiceAccountToken":
/// "token should not be plumbed down when csiServiceAccountTokenEnabled=false"
/// and "token should be plumbed down when csiServiceAccountTokenEnabled=true"
/// (an empty audience, 10 minutes, `requiresRepublish`: published again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_info_and_tokens_follow_the_csi_driver_object() {
    let env = Env::start(no_attach()).await;
    for (name, pod_info) in [
        ("infonil", None),
        ("infotrue", Some(true)),
        ("infofalse", Some(false)),
    ] {
        let spec = DriverSpec {
            pod_info_on_mount: pod_info,
            ..no_attach()
        };
        env.set_csi_driver(Some(&spec)).await;
        let (uid, publish) = run_pod(&env, name).await;
        let ctx = &publish.volume_context;
        if pod_info == Some(true) {
            let want = [
                env.j.pod_name(name),
                "default".to_string(),
                uid,
                "default".to_string(),
            ];
            for (k, v) in POD_INFO.iter().zip(want) {
                assert_eq!(ctx.get(*k), Some(&v), "{name}: {k} in {ctx:?}");
            }
            assert_eq!(ctx.get(EPHEMERAL).map(String::as_str), Some("false"));
        } else {
            for k in POD_INFO.iter().chain([&EPHEMERAL]) {
                assert!(!ctx.contains_key(*k), "{name}: {k} in {ctx:?}");
            }
        }
        assert!(!ctx.contains_key(TOKENS), "{name}: {ctx:?}");
    }
    // "should not require VolumeAttach for drivers without attachment":
    // the pods ran without any VolumeAttachment.
    let attachments = env.j.api.list("volumeattachments");
    assert!(attachments.is_empty(), "{attachments:?}");

    // CSIServiceAccountToken, disabled: no tokenRequests, no republish.
    env.set_csi_driver(Some(&DriverSpec {
        requires_republish: Some(false),
        ..no_attach()
    }))
    .await;
    let (_, publish) = run_pod(&env, "notoken").await;
    assert!(!publish.volume_context.contains_key(TOKENS));
    let published = |handle: &str| {
        env.driver
            .calls_of("NodePublishVolume")
            .iter()
            .filter(
                |c| matches!(&c.request, Request::NodePublishVolume(r) if r.volume_id == handle),
            )
            .count()
    };
    assert_eq!(published("vol-notoken"), 1, "published once");

    // Enabled: a token for the apiserver's audience, published again.
    env.set_csi_driver(Some(&DriverSpec {
        requires_republish: Some(true),
        token_requests: vec![(String::new(), Some(600))],
        ..no_attach()
    }))
    .await;
    env.bound_claim("claim-token", "pv-token", "vol-token", "token")
        .await;
    env.j.create_pod("token", pause_pod("claim-token")).await;
    env.j
        .wait_api("token", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let tokens = first_publish(&env, "vol-token")
        .volume_context
        .get(TOKENS)
        .cloned();
    if !env.j.api.profile().at_least(20) {
        // A 1.19 CSIDriver has neither field: no tokens.
        assert_eq!(tokens, None);
    } else {
        let tokens: Value = serde_json::from_str(&tokens.expect("tokens")).expect("json");
        assert!(
            tokens[""]["token"].as_str().is_some_and(|t| !t.is_empty()),
            "{tokens}"
        );
        // "sleep to make sure RequiresRepublish triggers more than 1
        // NodePublishVolume": a pod sync republishes.
        let deadline = tokio::time::Instant::now() + T;
        while published("vol-token") < 2 {
            assert!(tokio::time::Instant::now() < deadline, "never republished");
            label_pod(&env, "token").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    env.delete_pod("token").await;
    env.j.cleanup().await;
}

/// Changes a label of pod `name`, which makes the kubelet sync it.
async fn label_pod(env: &Env, name: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    let stamp = format!(
        "{}",
        std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_millis())
    );
    Api::<Pod>::namespaced(env.j.admin.clone(), "default")
        .patch(
            &env.j.pod_name(name),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"sync": stamp}}})),
        )
        .await
        .expect("label pod");
}

/// Without a CSIDriver object: csi_mock "should preserve attachment policy
/// when no CSIDriver present" (the kubelet waits for the VolumeAttachment,
/// attach being the default), "should not be passed when CSIDriver does not
/// exist" and "token should not be plumbed down when CSIDriver is not
/// deployed" (nothing added to the volume context); then "should bringup
/// pod after deploying CSIDriver attach=false": a pod waiting for an
/// attachment starts once the CSIDriver says none is needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_csi_driver_object_the_kubelet_waits_for_attach() {
    let env = Env::start_with(None, |_| {}).await;
    let j = &env.j;
    env.bound_claim("claim-nodrv", "pv-nodrv", "vol-nodrv", "nodrv")
        .await;
    j.create_pod("nodrv", pause_pod("claim-nodrv")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        env.driver.calls_of("NodeStageVolume").is_empty(),
        "staged before attach"
    );
    assert_ne!(phase(j.api_pod("nodrv").as_ref()), Some("Running"));
    // The attach/detach controller and external-attacher.
    let made = attach_once(&j.admin, DRIVER).await.expect("attach");
    assert!(
        made.contains(&attachment_name("vol-nodrv", DRIVER, &j.node.name)),
        "{made:?}"
    );
    j.wait_api("nodrv", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let ctx = first_publish(&env, "vol-nodrv").volume_context;
    for k in POD_INFO.iter().chain([&EPHEMERAL, &TOKENS]) {
        assert!(!ctx.contains_key(*k), "{k} in {ctx:?}");
    }
    env.delete_pod("nodrv").await;

    env.bound_claim("claim-late", "pv-late", "vol-late", "late")
        .await;
    env.driver.clear_calls();
    j.create_pod("late", pause_pod("claim-late")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        env.driver.calls_of("NodeStageVolume").is_empty(),
        "staged before attach"
    );
    assert_ne!(phase(j.api_pod("late").as_ref()), Some("Running"));
    env.set_csi_driver(Some(&no_attach())).await;
    j.wait_api("late", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    env.delete_pod("late").await;
    env.j.cleanup().await;
}

/// csi_mock "CSI attach test using mock driver": "should require
/// VolumeAttach for ephemeral volume and drivers with attachment": a
/// generic ephemeral volume's claim (`<pod>-<volume>`, made and owned by
/// the ephemeral volume controller) of a driver that attaches is staged
/// only once its VolumeAttachment is attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_ephemeral_volume_waits_for_attach() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    let env = Env::start(DriverSpec {
        attach_required: Some(true),
        ..DriverSpec::default()
    })
    .await;
    let j = &env.j;
    let pod = j
        .create_pod(
            "geneph",
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "my-volume", "mountPath": "/mnt/test"}]}],
                "volumes": [{"name": "my-volume", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}}}]
            }),
        )
        .await;
    // The ephemeral volume controller's and the provisioner's part.
    let claim = format!("{}-my-volume", j.pod_name("geneph"));
    env.bound_claim(&claim, "pv-geneph", "vol-geneph", "geneph")
        .await;
    Api::<PersistentVolumeClaim>::namespaced(j.admin.clone(), "default")
        .patch(
            &claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                "uid": pod.metadata.uid, "controller": true, "blockOwnerDeletion": true}]}})),
        )
        .await
        .expect("owner");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        env.driver.calls_of("NodeStageVolume").is_empty(),
        "staged before attach"
    );
    assert_ne!(phase(j.api_pod("geneph").as_ref()), Some("Running"));
    let made = attach_once(&j.admin, DRIVER).await.expect("attach");
    assert_eq!(
        made,
        vec![attachment_name("vol-geneph", DRIVER, &j.node.name)]
    );
    j.wait_api("geneph", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    env.delete_pod("geneph").await;
    env.call("NodeUnstageVolume").await;
    env.j.cleanup().await;
}

/// csi_mock "CSI volume limit information using mock driver": "should
/// report attach limit when limit is bigger than 0": the driver's
/// `max_volumes_per_node` is the CSINode driver's `allocatable.count`
/// (what the scheduler then enforces is the control plane's part).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attach_limit_is_reported_in_csi_node() {
    let env = Env::start_with(Some(no_attach()), |c| c.max_volumes = 2).await;
    let node = env
        .j
        .api
        .get("csinodes", "", &env.j.node.name)
        .expect("CSINode");
    let driver = node["spec"]["drivers"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == DRIVER))
        .expect("driver in CSINode");
    assert_eq!(driver["allocatable"]["count"], 2, "{driver}");
    env.j.cleanup().await;
}
