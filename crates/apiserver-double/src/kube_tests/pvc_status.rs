//! A node records a finished online expansion in the status of a claim its
//! pod uses (the Node authorizer's `authorizeStatusUpdate` and
//! NodeRestriction's `admitPVCStatus`, [`crate::profile::node`]), in both
//! releases: only through `status`, only for related claims, and only
//! the capacity, the conditions and (from 1.32) the allocated resources.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Cluster, api_error, create_pod, from};
use crate::Options;
use crate::profile::Profile;

async fn claim(admin: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    let c: PersistentVolumeClaim =
        from(json!({"metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": format!("pv-{name}"),
            "resources": {"requests": {"storage": "2Gi"}}}}));
    admin
        .create(&PostParams::default(), &c)
        .await
        .expect("create claim");
    admin
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True"}]}}),
            ),
        )
        .await
        .expect("bind claim")
}

fn storage(c: &PersistentVolumeClaim) -> Option<String> {
    c.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|m| m.get("storage"))
        .map(|q| q.0.clone())
}

/// The patch upstream's `MarkFSResizeFinished` sends (a strategic merge
/// patch with the claim's resourceVersion).
fn resize_finished(c: &PersistentVolumeClaim, size: &str) -> Patch<serde_json::Value> {
    Patch::Strategic(json!({
        "metadata": {"resourceVersion": c.metadata.resource_version},
        "status": {"capacity": {"storage": size},
            "conditions": [{"$patch": "delete", "type": "FileSystemResizePending"}]}}))
}

#[tokio::test]
async fn a_node_writes_only_the_size_of_the_claims_its_pods_use() {
    for p in Profile::ALL {
        let c = Cluster::start_with(Options {
            profile: p,
            ..Options::default()
        })
        .await;
        let admin_client = c.admin().await;
        let admin = Api::<PersistentVolumeClaim>::namespaced(admin_client.clone(), "default");
        let used = claim(&admin, "used").await;
        let other = claim(&admin, "other").await;
        create_pod(
            &admin_client,
            "default",
            "p",
            "n1",
            json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "used"}}]}),
        )
        .await;
        let n1 = Api::<PersistentVolumeClaim>::namespaced(c.node("n1").await, "default");

        let resized = n1
            .patch_status(
                "used",
                &PatchParams::default(),
                &resize_finished(&used, "2Gi"),
            )
            .await
            .expect("a related claim's status");
        assert_eq!(storage(&resized).as_deref(), Some("2Gi"), "{p}");
        let conditions = resized.status.as_ref().and_then(|s| s.conditions.clone());
        assert!(conditions.unwrap_or_default().is_empty(), "{p}");

        let (code, msg) = api_error(
            n1.patch_status(
                "other",
                &PatchParams::default(),
                &resize_finished(&other, "2Gi"),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(
            (code, msg.as_str()),
            (
                403,
                "persistentvolumeclaims \"other\" is forbidden: User \"system:node:n1\" cannot patch resource \"persistentvolumeclaims/status\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
            ),
            "{p}"
        );
        assert_eq!(
            storage(&admin.get("other").await.expect("other")).as_deref(),
            Some("1Gi")
        );

        // A label through the status subresource: NodeRestriction refuses.
        let relabel = Patch::Merge(json!({"metadata": {"labels": {"app": "evil"}},
            "status": {"capacity": {"storage": "3Gi"}}}));
        let (code, msg) = api_error(
            n1.patch_status("used", &PatchParams::default(), &relabel)
                .await
                .unwrap_err(),
        );
        let allowed = if p.at_least(24) {
            "status.quantity"
        } else {
            "status.capacity"
        };
        assert_eq!(code, 403, "{p}");
        let prefix = format!(
            "persistentvolumeclaims \"used\" is forbidden: node \"n1\" is not allowed to update fields other than {allowed} and status.conditions: "
        );
        assert!(msg.starts_with(&prefix), "{p}: {msg}");
        assert!(msg.contains("metadata.labels.app"), "{p}: {msg}");
        let kept = admin.get("used").await.expect("used");
        assert_eq!(storage(&kept).as_deref(), Some("2Gi"), "{p}");
        assert_eq!(
            kept.metadata
                .labels
                .unwrap_or_default()
                .get("app")
                .map(String::as_str),
            Some("db")
        );

        // The claim itself (spec, metadata): only reads.
        let (code, msg) = api_error(
            n1.patch(
                "used",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": "evil"}}})),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(code, 403, "{p}");
        assert!(
            msg.ends_with("cannot patch resource \"persistentvolumeclaims\" in API group \"\" in the namespace \"default\": can only get individual resources of this type"),
            "{p}: {msg}"
        );
        let (code, msg) = api_error(n1.get_status("used").await.unwrap_err());
        assert_eq!(code, 403, "{p}");
        assert!(
            msg.ends_with(": can only get/update/patch this type"),
            "{p}: {msg}"
        );

        // A whole-object update through status, as an older kubelet's.
        let mut current = admin.get("used").await.expect("used");
        if let Some(s) = current.status.as_mut() {
            s.capacity = Some(
                [(
                    "storage".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("4Gi".into()),
                )]
                .into(),
            );
        }
        let replaced = n1
            .replace_status("used", &PostParams::default(), &current)
            .await
            .expect("update of the status");
        assert_eq!(storage(&replaced).as_deref(), Some("4Gi"), "{p}");

        // RecoverVolumeExpansionFailure (on from 1.32): the allocated
        // resources are the node's to write too.
        if p.at_least(32) {
            let allocated = Patch::Merge(json!({"status": {
                "allocatedResources": {"storage": "4Gi"},
                "allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}}));
            n1.patch_status("used", &PatchParams::default(), &allocated)
                .await
                .expect("allocated resources");
        }
    }
}
