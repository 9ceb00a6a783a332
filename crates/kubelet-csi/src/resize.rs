//! Online expansion on the node (upstream `operation_generator.go`
//! `nodeExpandVolume`, `RequiresFSResize` and `util.MarkFSResizeFinished`):
//! once the control plane grew a PV past its claim's status capacity, the
//! kubelet asks the driver to grow the published filesystem
//! (`NodeExpandVolume`), then records the new capacity in the claim's
//! status and drops its `FileSystemResizePending` condition.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

use crate::plugin::{CsiPlugin, CsiVolume};
use crate::reconstruct::ExpandOptions;
use crate::{Error, Result};

/// The condition the resizer sets while the node has work to do.
pub const FS_RESIZE_PENDING: &str = "FileSystemResizePending";
/// The claim conditions of a resize in progress or failed (upstream
/// `knownResizeConditions`: `Resizing` and `FileSystemResizePending`, and
/// from 1.32 the two error conditions).
const RESIZE_CONDITIONS: [&str; 4] = [
    "Resizing",
    FS_RESIZE_PENDING,
    "ControllerResizeError",
    "NodeResizeError",
];

fn storage(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    q.and_then(|q| kubelet_types::quantity::parse_bytes(&q.0))
}

/// The size the volume must grow to on the node: the PV's capacity when it
/// exceeds the claim's status capacity (upstream `RequiresFSResize`).
pub fn resize_required(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> Option<i64> {
    let want = storage(
        pv.spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    )?;
    let have = storage(
        pvc.status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    )?;
    (want > have).then_some(want)
}

/// The claim status patch that marks the resize finished at the PV's
/// capacity (upstream `MarkFSResizeFinished`).
pub fn resize_finished_patch(
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
) -> serde_json::Value {
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let mut status = json!({"capacity": {"storage": capacity}});
    // Upstream `MergeResizeConditionOnPVC` with no new condition: every
    // resize condition goes.
    let done: Vec<serde_json::Value> = pvc
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| RESIZE_CONDITIONS.contains(&c.type_.as_str()))
        .map(|c| json!({"$patch": "delete", "type": c.type_}))
        .collect();
    if !done.is_empty() {
        status["conditions"] = serde_json::Value::Array(done);
    }
    let allocated = pvc
        .status
        .as_ref()
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .is_some_and(|a| a.contains_key("storage"));
    if allocated {
        status["allocatedResourceStatuses"] = json!({"storage": null});
    }
    // Upstream `PatchPVCStatus`: a claim changed since it was read makes
    // the patch fail (409) and the resize is checked again at the next sync.
    match &pvc.metadata.resource_version {
        Some(rv) => json!({"metadata": {"resourceVersion": rv}, "status": status}),
        None => json!({"status": status}),
    }
}

/// `allocatedResourceStatuses` values the kubelet writes for `storage`
/// (upstream `ClaimResourceStatus`, RecoverVolumeExpansionFailure).
pub mod resize_status {
    /// The resizer grew the volume; the node's step is pending.
    pub const NODE_RESIZE_PENDING: &str = "NodeResizePending";
    /// The kubelet is expanding the volume on the node.
    pub const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
    /// The node's expansion failed with an error retrying cannot fix.
    pub const NODE_RESIZE_INFEASIBLE: &str = "NodeResizeInfeasible";
}

/// The condition the kubelet sets when the node's expansion failed.
pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";

/// Upstream csi `isInfeasibleError`: a driver's `InvalidArgument`,
/// `OutOfRange` or `NotFound` to NodeExpandVolume means retrying with the
/// same size cannot succeed.
pub fn is_infeasible(e: &Error) -> bool {
    match e {
        Error::Grpc(s) => matches!(
            s.code(),
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::NotFound
        ),
        Error::Step { source, .. } | Error::Phase { source, .. } => is_infeasible(source),
        _ => false,
    }
}

/// Upstream csi `inUseError`: a driver's `FailedPrecondition` to
/// NodeExpandVolume means it cannot grow the volume while it is in use;
/// the mount goes on and the expansion waits for the next mount.
pub fn is_in_use_error(e: &Error) -> bool {
    match e {
        Error::Grpc(s) => s.code() == tonic::Code::FailedPrecondition,
        Error::Step { source, .. } | Error::Phase { source, .. } => is_in_use_error(source),
        _ => false,
    }
}

/// The claim status patch marking the node's expansion in progress
/// (upstream `MarkNodeExpansionInProgress`, guarded by the read version).
pub fn node_expansion_in_progress_patch(pvc: &PersistentVolumeClaim) -> serde_json::Value {
    let status = json!({"allocatedResourceStatuses":
        {"storage": resize_status::NODE_RESIZE_IN_PROGRESS}});
    match &pvc.metadata.resource_version {
        Some(rv) => json!({"metadata": {"resourceVersion": rv}, "status": status}),
        None => json!({"status": status}),
    }
}

/// The claim status patch recording a failed node expansion (upstream
/// `MarkNodeExpansionInfeasible` when `infeasible`, else
/// `MarkNodeExpansionFailedCondition`): a `NodeResizeError` condition
/// "failed to expand pvc with <error>", other resize conditions kept, and
/// for an infeasible size the `NodeResizeInfeasible` status. `now` is the
/// condition's transition time (RFC 3339). Not guarded by the version, as
/// upstream.
pub fn node_expansion_failed_patch(
    message: &str,
    infeasible: bool,
    now: &str,
) -> serde_json::Value {
    let mut status = json!({"conditions": [{
        "type": NODE_RESIZE_ERROR, "status": "True", "lastTransitionTime": now,
        "message": format!("failed to expand pvc with {message}")}]});
    if infeasible {
        status["allocatedResourceStatuses"] =
            json!({"storage": resize_status::NODE_RESIZE_INFEASIBLE});
    }
    json!({"status": status})
}

impl CsiPlugin {
    /// Grows the published volume of `pv` for pod `pod_uid` to `size`
    /// bytes (`NodeExpandVolume`); false when the driver needs no node step.
    pub async fn node_expand(
        &self,
        pod_uid: &str,
        pv: &PersistentVolume,
        size: i64,
    ) -> Result<bool> {
        let facts = CsiVolume::Persistent {
            pv,
            read_only: false,
        }
        .facts(pod_uid)?;
        let spec = pv.spec.as_ref();
        let secrets = match spec
            .and_then(|s| s.csi.as_ref())
            .and_then(|c| c.node_expand_secret_ref.as_ref())
        {
            Some(r) => crate::mounter::secrets(self.host.as_ref(), r, "")
                .await
                .map_err(|e| {
                    Error::InvalidSpec(format!(
                        "expander.NodeExpand failed to get NodeExpandSecretRef {}/{}: {e}",
                        r.namespace.as_deref().unwrap_or_default(),
                        r.name.as_deref().unwrap_or_default()
                    ))
                    .phase("MountVolume.NodeExpandVolume", &facts.spec_name)
                })?,
            None => Default::default(),
        };
        let mount_options = spec
            .and_then(|s| s.mount_options.clone())
            .unwrap_or_default();
        let opts = ExpandOptions {
            fs_type: &facts.fs_type,
            access_mode: &facts.access_mode,
            mount_options: &mount_options,
            secrets,
        };
        let grown = self
            .expand_with(pod_uid, &facts.spec_name, size, opts)
            .await?;
        if grown.is_some() {
            tracing::info!(volume = %facts.spec_name, size, "MountVolume.NodeExpandVolume succeeded");
        }
        Ok(grown.is_some())
    }

    /// Records in the claim's status that the node's expansion started
    /// (upstream `MarkNodeExpansionInProgress`).
    pub async fn mark_node_expansion_in_progress(&self, pvc: &PersistentVolumeClaim) -> Result<()> {
        self.patch_claim(pvc, node_expansion_in_progress_patch(pvc))
            .await
    }

    /// Records the node's failed expansion `e` in the claim's status
    /// (upstream `MarkNodeExpansionInfeasible` / `MarkNodeExpansionFailedCondition`).
    pub async fn mark_node_expansion_failed(
        &self,
        pvc: &PersistentVolumeClaim,
        e: &Error,
    ) -> Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let patch = node_expansion_failed_patch(&e.to_string(), is_infeasible(e), &now);
        self.patch_claim(pvc, patch).await
    }

    async fn patch_claim(
        &self,
        pvc: &PersistentVolumeClaim,
        patch: serde_json::Value,
    ) -> Result<()> {
        let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        self.host
            .patch_claim_status(ns, name, patch)
            .await
            .map_err(|e: Error| e.step(format!("failed to patch the status of claim {ns}/{name}")))
    }

    /// Records the finished resize in the claim's status.
    pub async fn mark_resize_finished(
        &self,
        pv: &PersistentVolume,
        pvc: &PersistentVolumeClaim,
    ) -> Result<()> {
        let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        self.host
            .patch_claim_status(ns, name, resize_finished_patch(pv, pvc))
            .await
            .map_err(|e: Error| {
                e.step(format!(
                    "failed to mark the resize of claim {ns}/{name} finished"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(size: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": size}, "csi": {"driver": "d", "volumeHandle": "h"}}}))
        .expect("pv")
    }

    fn pvc(size: &str, pending: bool) -> PersistentVolumeClaim {
        let mut c = json!({"metadata": {"name": "c", "namespace": "ns"},
            "status": {"capacity": {"storage": size}}});
        if pending {
            c["status"]["conditions"] = json!([{"type": FS_RESIZE_PENDING, "status": "True"}]);
        }
        serde_json::from_value(c).expect("pvc")
    }

    #[test]
    fn node_expansion_progress_and_failures_are_upstreams_status() {
        let mut c = pvc("1Gi", true);
        c.metadata.resource_version = Some("7".into());
        assert_eq!(
            node_expansion_in_progress_patch(&c),
            json!({"metadata": {"resourceVersion": "7"},
                "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}})
        );
        let bad = Error::Grpc(tonic::Status::invalid_argument("too big"))
            .phase("MountVolume.NodeExpandVolume", "pv-1");
        assert!(is_infeasible(&bad));
        assert!(!is_infeasible(&Error::Grpc(tonic::Status::internal("x"))));
        let busy = Error::Grpc(tonic::Status::failed_precondition("in use")).step("x");
        assert!(is_in_use_error(&busy) && !is_infeasible(&busy));
        assert!(!is_in_use_error(&bad));
        assert!(!is_infeasible(&Error::Grpc(
            tonic::Status::deadline_exceeded("x")
        )));
        let when = "2026-01-01T00:00:00Z";
        assert_eq!(
            node_expansion_failed_patch("boom", true, when),
            json!({"status": {"allocatedResourceStatuses": {"storage": "NodeResizeInfeasible"},
                "conditions": [{"type": "NodeResizeError", "status": "True",
                    "lastTransitionTime": when, "message": "failed to expand pvc with boom"}]}})
        );
        let p = node_expansion_failed_patch("boom", false, when);
        assert!(
            p["status"].get("allocatedResourceStatuses").is_none(),
            "{p}"
        );
    }

    #[test]
    fn a_pv_grown_past_its_claims_capacity_needs_a_node_resize() {
        assert_eq!(
            resize_required(&pv("2Gi"), &pvc("1Gi", true)),
            Some(2 << 30)
        );
        assert_eq!(resize_required(&pv("1Gi"), &pvc("1Gi", false)), None);
        assert_eq!(resize_required(&pv("1Gi"), &pvc("2Gi", false)), None);
        assert_eq!(
            resize_finished_patch(&pv("2Gi"), &pvc("1Gi", true)),
            json!({"status": {"capacity": {"storage": "2Gi"},
                "conditions": [{"$patch": "delete", "type": FS_RESIZE_PENDING}]}})
        );
        assert_eq!(
            resize_finished_patch(&pv("2Gi"), &pvc("1Gi", false)),
            json!({"status": {"capacity": {"storage": "2Gi"}}})
        );
        // Every resize condition goes, others stay; the read version guards it.
        let mut c = pvc("1Gi", true);
        c.metadata.resource_version = Some("42".into());
        if let Some(conds) = c.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            for t in ["Resizing", "Ready"] {
                conds.push(
                    serde_json::from_value(json!({"type": t, "status": "True"})).expect("cond"),
                );
            }
        }
        assert_eq!(
            resize_finished_patch(&pv("2Gi"), &c),
            json!({"metadata": {"resourceVersion": "42"},
                "status": {"capacity": {"storage": "2Gi"},
                "conditions": [{"$patch": "delete", "type": FS_RESIZE_PENDING},
                               {"$patch": "delete", "type": "Resizing"}]}})
        );
    }
}
