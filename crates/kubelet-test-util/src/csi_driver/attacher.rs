//! The attach/detach controller and the external-attacher for one driver,
//! as a test loop (upstream `pkg/controller/volume/attachdetach` and
//! `kubernetes-csi/external-attacher`, from their documented behaviour):
//! - a PV of the driver claimed by a pod bound to a node (and not ended),
//!   through a `persistentVolumeClaim` or a generic ephemeral volume,
//!   gets its VolumeAttachment, which is marked attached, and the node's
//!   `status.volumesAttached` lists the volume as
//!   `kubernetes.io/csi/<driver>^<volume handle>`;
//! - an attachment no pod needs any more is deleted, and the volume leaves
//!   `volumesAttached`, once the node no longer reports it in
//!   `status.volumesInUse` (the controller waits for the kubelet's
//!   unmount).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::api::{attachment_name, create_attachment, mark_attached};

/// The unique name of a CSI volume in a node's `volumesAttached` and
/// `volumesInUse`.
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// One attachment a pod needs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Wanted {
    pv: String,
    handle: String,
    node: String,
}

async fn wanted(admin: &Client, driver: &str) -> Result<BTreeSet<Wanted>, kube::Error> {
    let pvs = Api::<PersistentVolume>::all(admin.clone())
        .list(&ListParams::default())
        .await?;
    let pods = Api::<Pod>::all(admin.clone())
        .list(&ListParams::default())
        .await?;
    let mut out = BTreeSet::new();
    for pv in pvs.items {
        let spec = pv.spec.as_ref();
        let (Some(csi), Some(claim)) = (
            spec.and_then(|s| s.csi.as_ref()),
            spec.and_then(|s| s.claim_ref.as_ref()),
        ) else {
            continue;
        };
        if csi.driver != driver {
            continue;
        }
        for pod in &pods.items {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let ended = matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
            let uses = pod.metadata.namespace == claim.namespace
                && pod
                    .spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .any(|v| {
                        // A generic ephemeral volume's claim is `<pod>-<volume>`.
                        let name = match (&v.persistent_volume_claim, &v.ephemeral) {
                            (Some(c), _) => c.claim_name.clone(),
                            (None, Some(_)) => format!("{pod_name}-{}", v.name),
                            (None, None) => return false,
                        };
                        Some(name.as_str()) == claim.name.as_deref()
                    });
            if !node.is_empty() && uses && !ended {
                out.insert(Wanted {
                    pv: pv.metadata.name.clone().unwrap_or_default(),
                    handle: csi.volume_handle.clone(),
                    node,
                });
            }
        }
    }
    Ok(out)
}

/// Adds or removes `volume` in node `node`'s `status.volumesAttached`.
async fn set_attached(
    admin: &Client,
    node: &str,
    volume: &str,
    attached: bool,
) -> Result<(), kube::Error> {
    let nodes = Api::<Node>::all(admin.clone());
    let Some(n) = nodes.get_opt(node).await? else {
        return Ok(());
    };
    let mut list: Vec<serde_json::Value> = n
        .status
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default()
        .into_iter()
        .map(|v| json!({"name": v.name, "devicePath": v.device_path}))
        .collect();
    let present = list.iter().any(|v| v["name"] == volume);
    if present == attached {
        return Ok(());
    }
    if attached {
        list.push(json!({"name": volume, "devicePath": ""}));
    } else {
        list.retain(|v| v["name"] != volume);
    }
    let patch = json!({"status": {"volumesAttached": list}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// One attach pass: the attachments it created.
pub async fn attach_once(admin: &Client, driver: &str) -> Result<Vec<String>, kube::Error> {
    let vas = Api::<VolumeAttachment>::all(admin.clone());
    let mut made = Vec::new();
    for w in wanted(admin, driver).await? {
        let name = attachment_name(&w.handle, driver, &w.node);
        let attached = match vas.get_opt(&name).await? {
            Some(va) => va.status.is_some_and(|s| s.attached),
            None => {
                create_attachment(admin, &w.pv, &w.handle, driver, &w.node).await?;
                made.push(name.clone());
                false
            }
        };
        if !attached {
            mark_attached(admin, &name, None).await?;
        }
        set_attached(admin, &w.node, &unique_volume_name(driver, &w.handle), true).await?;
    }
    Ok(made)
}

/// One detach pass: the attachments it deleted.
pub async fn detach_once(admin: &Client, driver: &str) -> Result<Vec<String>, kube::Error> {
    let wanted: BTreeSet<String> = wanted(admin, driver)
        .await?
        .iter()
        .map(|w| attachment_name(&w.handle, driver, &w.node))
        .collect();
    let vas = Api::<VolumeAttachment>::all(admin.clone());
    let nodes = Api::<Node>::all(admin.clone());
    let pvs = Api::<PersistentVolume>::all(admin.clone());
    let mut deleted = Vec::new();
    for va in vas.list(&ListParams::default()).await?.items {
        let name = va.metadata.name.clone().unwrap_or_default();
        if va.spec.attacher != driver || wanted.contains(&name) {
            continue;
        }
        let node = va.spec.node_name.clone();
        let handle = match va.spec.source.persistent_volume_name.as_deref() {
            Some(pv) => pvs
                .get_opt(pv)
                .await?
                .and_then(|p| p.spec.and_then(|s| s.csi).map(|c| c.volume_handle)),
            None => None,
        };
        let Some(handle) = handle else { continue };
        let unique = unique_volume_name(driver, &handle);
        let in_use = nodes
            .get_opt(&node)
            .await?
            .and_then(|n| n.status.and_then(|s| s.volumes_in_use))
            .is_some_and(|v| v.contains(&unique));
        if in_use {
            continue;
        }
        vas.delete(&name, &DeleteParams::default()).await?;
        set_attached(admin, &node, &unique, false).await?;
        deleted.push(name);
    }
    Ok(deleted)
}

/// Runs [`attach_once`] and [`detach_once`] every `period` until the task
/// is aborted.
pub fn spawn_attacher(
    admin: Client,
    driver: String,
    period: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Err(e) = attach_once(&admin, &driver).await {
                tracing::debug!(error = %e, "test attacher: attach pass failed");
            }
            if let Err(e) = detach_once(&admin, &driver).await {
                tracing::debug!(error = %e, "test attacher: detach pass failed");
            }
            tokio::time::sleep(period).await;
        }
    })
}
