//! What the control plane does for a CSI driver, done by a test with an
//! admin client: the driver's `CSIDriver` object (as its deployment
//! installs it), PersistentVolumes of the driver, and the
//! attach/detach controller and external-attacher's `VolumeAttachment`
//! (named as upstream's `getAttachmentName`: `csi-` and the hex SHA-256 of
//! volume handle, driver and node name), marked attached. [`super::attacher`]
//! runs the controllers' loop.
//!
//! Written from the API's documentation, sharing nothing with the kubelet.

use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The CSIDriver spec fields a test sets; `None` leaves the apiserver's
/// default.
#[derive(Debug, Clone, Default)]
pub struct DriverSpec {
    /// `attachRequired`.
    pub attach_required: Option<bool>,
    /// `podInfoOnMount`.
    pub pod_info_on_mount: Option<bool>,
    /// `volumeLifecycleModes`: `Persistent`, `Ephemeral`.
    pub volume_lifecycle_modes: Vec<String>,
    /// `fsGroupPolicy`: `ReadWriteOnceWithFSType`, `File`, `None`.
    pub fs_group_policy: Option<String>,
    /// `requiresRepublish`.
    pub requires_republish: Option<bool>,
    /// `tokenRequests` as `(audience, expirationSeconds)`.
    pub token_requests: Vec<(String, Option<i64>)>,
}

/// The CSIDriver object named `name` with `spec`.
pub fn csi_driver(name: &str, spec: &DriverSpec) -> Value {
    let mut s = json!({});
    if let Some(v) = spec.attach_required {
        s["attachRequired"] = json!(v);
    }
    if let Some(v) = spec.pod_info_on_mount {
        s["podInfoOnMount"] = json!(v);
    }
    if !spec.volume_lifecycle_modes.is_empty() {
        s["volumeLifecycleModes"] = json!(spec.volume_lifecycle_modes);
    }
    if let Some(v) = &spec.fs_group_policy {
        s["fsGroupPolicy"] = json!(v);
    }
    if let Some(v) = spec.requires_republish {
        s["requiresRepublish"] = json!(v);
    }
    if !spec.token_requests.is_empty() {
        let reqs: Vec<Value> = spec
            .token_requests
            .iter()
            .map(|(aud, exp)| match exp {
                Some(e) => json!({"audience": aud, "expirationSeconds": e}),
                None => json!({"audience": aud}),
            })
            .collect();
        s["tokenRequests"] = json!(reqs);
    }
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": name}, "spec": s})
}

/// Creates the CSIDriver object (as the driver's deployment does).
pub async fn create_csi_driver(
    admin: &Client,
    name: &str,
    spec: &DriverSpec,
) -> Result<CSIDriver, kube::Error> {
    let obj: CSIDriver =
        serde_json::from_value(csi_driver(name, spec)).map_err(kube::Error::SerdeError)?;
    Api::<CSIDriver>::all(admin.clone())
        .create(&PostParams::default(), &obj)
        .await
}

/// A PersistentVolume of `driver` with `handle`, bound to claim
/// `namespace/claim`, with optional stage and publish secrets
/// (`namespace/name`) and `volumeMode` (`Filesystem` or `Block`).
pub fn csi_pv(
    name: &str,
    driver: &str,
    handle: &str,
    claim: (&str, &str),
    stage_secret: Option<(&str, &str)>,
    publish_secret: Option<(&str, &str)>,
    volume_mode: &str,
) -> Value {
    let mut csi = json!({"driver": driver, "volumeHandle": handle,
        "volumeAttributes": {"kubelet-rs.test/pv": name}});
    if let Some((ns, n)) = stage_secret {
        csi["nodeStageSecretRef"] = json!({"namespace": ns, "name": n});
    }
    if let Some((ns, n)) = publish_secret {
        csi["nodePublishSecretRef"] = json!({"namespace": ns, "name": n});
    }
    if volume_mode == "Filesystem" {
        csi["fsType"] = json!("ext4");
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "volumeMode": volume_mode,
            "claimRef": {"namespace": claim.0, "name": claim.1}, "csi": csi}})
}

/// The name the attach/detach controller gives the VolumeAttachment of
/// volume `handle` of `driver` on `node`.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// Creates the VolumeAttachment of PV `pv` (volume `handle` of `driver`)
/// on `node`, not attached yet (the attach/detach controller's part).
pub async fn create_attachment(
    admin: &Client,
    pv: &str,
    handle: &str,
    driver: &str,
    node: &str,
) -> Result<VolumeAttachment, kube::Error> {
    let obj = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": attachment_name(handle, driver, node)},
        "spec": {"attacher": driver, "nodeName": node,
            "source": {"persistentVolumeName": pv}}});
    let va: VolumeAttachment = serde_json::from_value(obj).map_err(kube::Error::SerdeError)?;
    Api::<VolumeAttachment>::all(admin.clone())
        .create(&PostParams::default(), &va)
        .await
}

/// Marks VolumeAttachment `name` attached (the external-attacher's part),
/// or records an attach error when `error` is given.
pub async fn mark_attached(
    admin: &Client,
    name: &str,
    error: Option<&str>,
) -> Result<VolumeAttachment, kube::Error> {
    let status = match error {
        None => json!({"status": {"attached": true, "attachmentMetadata": {}}}),
        Some(msg) => json!({"status": {"attached": false,
            "attachError": {"time": "2026-01-01T00:00:00Z", "message": msg}}}),
    };
    Api::<VolumeAttachment>::all(admin.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
}
