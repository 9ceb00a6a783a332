//! `storage.k8s.io` seen through kube-rs as a kubelet and a CSI controller
//! see it, in both releases (`crate::storage`): a node writes only its own
//! CSINode, reads CSIDrivers, gets only the VolumeAttachments for itself,
//! and reaches the secrets its CSI volumes name.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use super::{Cluster, api_error, create_pod, from};
use crate::Options;
use crate::profile::Profile;

async fn start(profile: Profile) -> Cluster {
    Cluster::start_with(Options {
        profile,
        ..Options::default()
    })
    .await
}

fn csi_node(name: &str, node_id: &str) -> CSINode {
    from(json!({"metadata": {"name": name}, "spec": {"drivers": [
        {"name": "hostpath.csi.k8s.io", "nodeID": node_id,
         "topologyKeys": ["topology.hostpath.csi/node"]}]}}))
}

fn attachment(name: &str, node: &str) -> VolumeAttachment {
    from(
        json!({"metadata": {"name": name}, "spec": {"attacher": "hostpath.csi.k8s.io",
        "nodeName": node, "source": {"persistentVolumeName": "pv1"}}}),
    )
}

#[tokio::test]
async fn a_node_writes_only_its_own_csinode() {
    for p in Profile::ALL {
        let c = start(p).await;
        let n1 = Api::<CSINode>::all(c.node("n1").await);
        let created = n1
            .create(&PostParams::default(), &csi_node("n1", "n1"))
            .await
            .expect("own CSINode");
        assert_eq!(created.spec.drivers[0].node_id, "n1");
        let (code, msg) = api_error(
            n1.create(&PostParams::default(), &csi_node("n2", "n2"))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (code, msg.as_str()),
            (
                403,
                "csinodes.storage.k8s.io \"n2\" is forbidden: can only access CSINode with the same name as the requesting node"
            ),
            "{p}"
        );
        // Another node's CSINode: the authorizer refuses every other verb.
        let admin = Api::<CSINode>::all(c.admin().await);
        admin
            .create(&PostParams::default(), &csi_node("n2", "n2"))
            .await
            .expect("admin");
        let (code, msg) = api_error(n1.get("n2").await.unwrap_err());
        assert_eq!(code, 403);
        assert_eq!(
            msg,
            "csinodes.storage.k8s.io \"n2\" is forbidden: User \"system:node:n1\" cannot get resource \"csinodes\" in API group \"storage.k8s.io\" at the cluster scope: can only access CSINode with the same name as the requesting node"
        );
        let (code, _) = api_error(n1.delete("n2", &DeleteParams::default()).await.unwrap_err());
        assert_eq!(code, 403);
        let (code, msg) = api_error(n1.list(&Default::default()).await.unwrap_err());
        assert_eq!(code, 403);
        assert!(msg.ends_with("can only get, create, update, patch, or delete a CSINode"));
        // Adding a driver by merge patch, as a kubelet does.
        let patch = json!({"spec": {"drivers": [
            {"name": "hostpath.csi.k8s.io", "nodeID": "n1", "topologyKeys": ["topology.hostpath.csi/node"]},
            {"name": "other.example.com", "nodeID": "n1-other"}]}});
        let patched = n1
            .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("add a driver");
        assert_eq!(patched.spec.drivers.len(), 2);
        // Changing a driver's node ID under the same name is refused.
        let renamed = json!({"spec": {"drivers": [
            {"name": "hostpath.csi.k8s.io", "nodeID": "elsewhere"}]}});
        let (code, msg) = api_error(
            n1.patch("n1", &PatchParams::default(), &Patch::Merge(&renamed))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        assert!(msg.ends_with("field is immutable"), "{msg}");
        // A node ID between the two releases' limits.
        let long = "x".repeat(200);
        let moved = json!({"spec": {"drivers": [{"name": "third.example.com", "nodeID": long}]}});
        let r = n1
            .patch("n1", &PatchParams::default(), &Patch::Merge(&moved))
            .await;
        match p {
            Profile::V1_19 => {
                let (code, msg) = api_error(r.unwrap_err());
                assert_eq!(code, 422);
                assert_eq!(
                    msg,
                    format!(
                        "CSINode \"n1\" is invalid: spec.drivers[0].nodeID: Invalid value: {long:?}: must be 128 characters or less"
                    )
                );
            }
            Profile::V1_35 => {
                r.expect("256 bytes allowed");
            }
        }
        n1.delete("n1", &DeleteParams::default())
            .await
            .expect("delete own");
    }
}

#[tokio::test]
async fn csi_drivers_are_defaulted_per_release_and_read_by_nodes() {
    for p in Profile::ALL {
        let c = start(p).await;
        let admin = Api::<CSIDriver>::all(c.admin().await);
        let d: CSIDriver = from(json!({"metadata": {"name": "hostpath.csi.k8s.io"},
            "spec": {"fsGroupPolicy": "File", "podInfoOnMount": true,
                "volumeLifecycleModes": ["Persistent", "Ephemeral"]}}));
        admin
            .create(&PostParams::default(), &d)
            .await
            .expect("create");
        let n1 = Api::<CSIDriver>::all(c.node("n1").await);
        let got = n1.get("hostpath.csi.k8s.io").await.expect("node reads");
        let spec = serde_json::to_value(&got.spec).expect("json");
        assert_eq!(spec["attachRequired"], json!(true));
        assert_eq!(spec["podInfoOnMount"], json!(true));
        assert_eq!(
            spec["volumeLifecycleModes"],
            json!(["Persistent", "Ephemeral"])
        );
        match p {
            Profile::V1_19 => {
                assert_eq!(
                    spec.get("fsGroupPolicy"),
                    None,
                    "1.19 drops the alpha field"
                );
                assert_eq!(spec.get("requiresRepublish"), None);
            }
            Profile::V1_35 => {
                assert_eq!(spec["fsGroupPolicy"], json!("File"));
                assert_eq!(spec["requiresRepublish"], json!(false));
                assert_eq!(spec["storageCapacity"], json!(false));
            }
        }
        let list = n1.list(&Default::default()).await.expect("node lists");
        assert_eq!(list.items.len(), 1);
        let (code, _) = api_error(
            n1.create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": "x.example.com"}})),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(code, 403, "{p}");
        // attachRequired is immutable.
        let (code, _) = api_error(
            admin
                .patch(
                    "hostpath.csi.k8s.io",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"attachRequired": false}})),
                )
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        // v1beta1 exists only where upstream serves it.
        let req = http::Request::get("/apis/storage.k8s.io/v1beta1/csidrivers")
            .body(Vec::new())
            .expect("request");
        let beta = c.admin().await.request_text(req).await;
        assert_eq!(beta.is_ok(), p == Profile::V1_19, "{p}");
    }
}

#[tokio::test]
async fn a_node_gets_only_its_volume_attachments_and_sees_them_attach() {
    for p in Profile::ALL {
        let c = start(p).await;
        let admin = Api::<VolumeAttachment>::all(c.admin().await);
        admin
            .create(&PostParams::default(), &attachment("csi-a", "n1"))
            .await
            .expect("attachment for n1");
        admin
            .create(&PostParams::default(), &attachment("csi-b", "n2"))
            .await
            .expect("attachment for n2");
        let n1 = Api::<VolumeAttachment>::all(c.node("n1").await);
        let mine = n1.get("csi-a").await.expect("own attachment");
        assert!(mine.status.is_none());
        let (code, msg) = api_error(n1.get("csi-b").await.unwrap_err());
        assert_eq!(
            (code, msg.as_str()),
            (
                403,
                "volumeattachments.storage.k8s.io \"csi-b\" is forbidden: User \"system:node:n1\" cannot get resource \"volumeattachments\" in API group \"storage.k8s.io\" at the cluster scope: no relationship found between node 'n1' and this object"
            ),
            "{p}"
        );
        let (code, msg) = api_error(n1.list(&Default::default()).await.unwrap_err());
        assert_eq!(code, 403);
        assert!(msg.ends_with("can only get individual resources of this type"));

        // The external attacher marks it attached through the subresource;
        // a watch sees the change.
        let mut events = admin
            .watch(&WatchParams::default().fields("metadata.name=csi-a"), "0")
            .await
            .expect("watch")
            .boxed();
        let status =
            json!({"status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}}});
        admin
            .patch_status("csi-a", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("status");
        let mut attached = false;
        while let Some(ev) =
            tokio::time::timeout(std::time::Duration::from_secs(5), events.try_next())
                .await
                .expect("event in time")
                .expect("watch stream")
        {
            if let WatchEvent::Modified(va) = ev {
                attached = va.status.as_ref().is_some_and(|s| s.attached);
                break;
            }
        }
        assert!(attached, "{p}");
        // A write to the main resource keeps the status and the spec.
        let mut changed = n1.get("csi-a").await.expect("get");
        assert!(changed.status.as_ref().is_some_and(|s| s.attached));
        changed.status = None;
        changed.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        let kept = admin
            .replace("csi-a", &PostParams::default(), &changed)
            .await
            .expect("replace");
        assert!(kept.status.is_some_and(|s| s.attached));
        let (code, _) = api_error(
            admin
                .patch(
                    "csi-a",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"nodeName": "n3"}})),
                )
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        let (code, msg) = api_error(
            admin
                .create(
                    &PostParams::default(),
                    &from(json!({"metadata": {"name": "bad"}, "spec": {"attacher": "",
                        "nodeName": "n1", "source": {}}})),
                )
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        assert!(msg.contains("spec.attacher: Required value"), "{msg}");
    }
}

#[tokio::test]
async fn a_node_reaches_the_secrets_of_its_csi_volumes() {
    let c = start(Profile::from_env_or_default()).await;
    let admin = c.admin().await;
    let secret: Secret =
        from(json!({"metadata": {"name": "stage-secret"}, "stringData": {"k": "v"}}));
    Api::<Secret>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let pv: PersistentVolume = from(json!({"metadata": {"name": "pv1"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "claimRef": {"namespace": "default", "name": "claim"},
        "csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "v1",
            "nodeStageSecretRef": {"namespace": "default", "name": "stage-secret"}}}}));
    Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("pv");
    let pvc: PersistentVolumeClaim = from(json!({"metadata": {"name": "claim"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
        "volumeName": "pv1"}}));
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pvc)
        .await
        .expect("pvc");
    let secrets = Api::<Secret>::namespaced(c.node("n1").await, "default");
    assert_eq!(
        api_error(secrets.get("stage-secret").await.unwrap_err()).0,
        403
    );
    create_pod(
        &admin,
        "default",
        "p",
        "n1",
        json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "claim"}}]}),
    )
    .await;
    let got = secrets
        .get("stage-secret")
        .await
        .expect("reached through the PV");
    assert!(got.data.is_some_and(|d| d.contains_key("k")));
    // Another node does not reach it.
    let other = Api::<Secret>::namespaced(c.node("n2").await, "default");
    assert_eq!(
        api_error(other.get("stage-secret").await.unwrap_err()).0,
        403
    );
}
