//! PersistentVolumeClaim volumes (upstream `volumemanager/populator`'s
//! claim resolution, `util.CheckNodeAffinity`, and the `local` and
//! `hostPath` PV plugins): the claim must be Bound to a PV that names it;
//! the PV's node affinity must match this node; a `local` PV is
//! bind-mounted onto `kubernetes.io~local-volume/<pv-name>` (read-only when
//! the pod's claim reference says so) and a `hostPath` PV is used in place.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim, Pod, Volume,
};

use crate::hostpath::validate_path_no_backsteps;
use crate::mount::{bind_mount_blocking, blocking, is_mount_point_blocking, mount_refs_blocking};
use crate::plugin::{MountedVolume, SetUpRequest, names, volume_dir};
use crate::{Error, Result, VolumeHost};

/// PV spec fields that are not a volume source.
const NOT_SOURCES: &[&str] = &[
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeAttributesClassName",
    "volumeMode",
];

/// Sets up the pod volume `req.volume` (a `persistentVolumeClaim` or a
/// generic `ephemeral` source).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let Some(r) = resolve_volume(host, req.pod, req.volume).await? else {
        return Err(Error::Invalid(format!(
            "volume {:?} is not a persistentVolumeClaim volume",
            req.volume.name
        )));
    };
    set_up_bound(host, req, &r.pv, r.read_only).await
}

/// The claim a pod volume uses (name, `readOnly`, whether it is a generic
/// ephemeral volume): its `persistentVolumeClaim`, or for an `ephemeral`
/// volume the claim the control plane creates, `<pod name>-<volume name>`
/// (upstream `ephemeral.VolumeClaimName`). `None` for other volumes.
pub fn claim_of(pod: &Pod, volume: &Volume) -> Option<(String, bool, bool)> {
    if let Some(src) = volume.persistent_volume_claim.as_ref() {
        return Some((
            src.claim_name.clone(),
            src.read_only.unwrap_or(false),
            false,
        ));
    }
    volume.ephemeral.as_ref().map(|_| {
        (
            format!("{}-{}", kubelet_types::pod::name(pod), volume.name),
            false,
            true,
        )
    })
}

/// Upstream `ephemeral.VolumeIsForPod`: the claim of a generic ephemeral
/// volume must be controlled by the pod.
fn check_claim_is_for_pod(pod: &Pod, pvc: &PersistentVolumeClaim) -> Result<()> {
    let (pod_ns, pod_name) = (
        kubelet_types::pod::namespace(pod),
        kubelet_types::pod::name(pod),
    );
    let pvc_ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
    let controlled = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == kubelet_types::pod::uid(pod));
    if pvc_ns != pod_ns || !controlled {
        return Err(Error::Invalid(format!(
            "PVC {pvc_ns}/{} was not created for pod {pod_ns}/{pod_name} (pod is not owner)",
            pvc.metadata.name.as_deref().unwrap_or_default()
        )));
    }
    Ok(())
}

/// A pod volume's claim and the PV bound to it.
#[derive(Debug, Clone)]
pub struct ResolvedClaim {
    /// The claim.
    pub pvc: PersistentVolumeClaim,
    /// Its PV.
    pub pv: PersistentVolume,
    /// The pod volume's `readOnly`.
    pub read_only: bool,
}

/// The claim of `volume` and the PV bound to it (upstream's populator
/// `createVolumeSpec`): the claim must be bound, a generic ephemeral
/// volume's claim must be the pod's, and the PV must name the claim.
/// `None` when the volume uses no claim.
pub async fn resolve_volume(
    host: &dyn VolumeHost,
    pod: &Pod,
    volume: &Volume,
) -> Result<Option<ResolvedClaim>> {
    let Some((claim, read_only, ephemeral)) = claim_of(pod, volume) else {
        return Ok(None);
    };
    let namespace = kubelet_types::pod::namespace(pod);
    let pvc = bound_claim(host, namespace, &claim).await?;
    if ephemeral {
        check_claim_is_for_pod(pod, &pvc)?;
    }
    let pv = claimed_volume(host, namespace, &claim, &pvc).await?;
    Ok(Some(ResolvedClaim { pvc, pv, read_only }))
}

/// Sets up a claim volume whose bound PV is `pv` (local or hostPath).
pub async fn set_up_bound(
    host: &dyn VolumeHost,
    req: SetUpRequest<'_>,
    pv: &PersistentVolume,
    read_only: bool,
) -> Result<MountedVolume> {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(Error::Unsupported {
            volume: req.volume.name.clone(),
            kind: "block-mode PersistentVolume".into(),
        });
    }
    if let Err(e) = check_node_affinity(pv, &host.node_labels()) {
        return Err(Error::Phased(format!(
            "MountVolume.NodeAffinity check failed for volume {pv_name:?} : {e}"
        )));
    }
    if let Some(local) = spec.local.as_ref() {
        let dir = volume_dir(
            req.pods_dir,
            kubelet_types::pod::uid(req.pod),
            names::LOCAL_VOLUME,
            &pv_name,
        );
        set_up_local(&local.path, &pv_name, &dir, read_only, &req).await?;
        return Ok(MountedVolume {
            name: req.volume.name.clone(),
            plugin: names::LOCAL_VOLUME,
            host_path: dir,
            read_only,
            refresh: false,
            block: false,
        });
    }
    if let Some(hp) = spec.host_path.as_ref() {
        let path = crate::hostpath::check(hp).await?;
        return Ok(MountedVolume {
            name: req.volume.name.clone(),
            plugin: names::HOST_PATH,
            host_path: path,
            read_only,
            refresh: false,
            block: false,
        });
    }
    let kind = match serde_json::to_value(&spec) {
        Ok(serde_json::Value::Object(m)) => m
            .keys()
            .find(|k| !NOT_SOURCES.contains(&k.as_str()))
            .map_or("unknown".to_string(), Clone::clone),
        _ => "unknown".to_string(),
    };
    Err(Error::Unsupported {
        volume: req.volume.name.clone(),
        kind: format!("PersistentVolume {pv_name:?} source {kind}"),
    })
}

/// The PV bound to claim `namespace/claim` (upstream
/// `getPVCExtractPV` and `getPVSpec`, with the populator's messages).
pub async fn resolve(
    host: &dyn VolumeHost,
    namespace: &str,
    claim: &str,
) -> Result<PersistentVolume> {
    let pvc = bound_claim(host, namespace, claim).await?;
    claimed_volume(host, namespace, claim, &pvc).await
}

fn claim_error(namespace: &str, claim: &str, msg: String) -> Error {
    Error::Invalid(format!("error processing PVC {namespace}/{claim}: {msg}"))
}

/// The claim `namespace/claim`, which must be bound and not being deleted
/// (upstream `getPVCExtractPV`).
pub async fn bound_claim(
    host: &dyn VolumeHost,
    namespace: &str,
    claim: &str,
) -> Result<PersistentVolumeClaim> {
    let fail = |msg: String| claim_error(namespace, claim, msg);
    let pvc = host
        .get_persistent_volume_claim(namespace, claim)
        .await
        .map_err(|e| fail(format!("failed to fetch PVC from API server: {e}")))?;
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(fail(format!(
            "can't start pod because PVC {namespace}/{claim} is being deleted"
        )));
    }
    let phase = pvc
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let volume_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if phase != "Bound" || volume_name.is_empty() {
        return Err(fail(format!(
            "PVC {namespace}/{claim} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume_name:?})"
        )));
    }
    Ok(pvc)
}

/// The PV `pvc` is bound to, which must name the claim (upstream `getPVSpec`).
pub async fn claimed_volume(
    host: &dyn VolumeHost,
    namespace: &str,
    claim: &str,
    pvc: &PersistentVolumeClaim,
) -> Result<PersistentVolume> {
    let fail = |msg: String| claim_error(namespace, claim, msg);
    let volume_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let pv = host
        .get_persistent_volume(&volume_name)
        .await
        .map_err(|e| {
            fail(format!(
                "failed to fetch PV {volume_name} from API server: {e}"
            ))
        })?;
    let claim_uid = pvc.metadata.uid.clone().unwrap_or_default();
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(fail(format!(
            "found PV object {volume_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        )));
    };
    let ref_uid = claim_ref.uid.clone().unwrap_or_default();
    if ref_uid != claim_uid {
        return Err(fail(format!(
            "found PV object {volume_name} but its pv.Spec.ClaimRef.UID ({ref_uid}) does not point to claim.UID ({claim_uid})"
        )));
    }
    Ok(pv)
}

/// Upstream `localVolumeMounter.SetUpAt`: bind-mount the PV's path on the
/// pod's directory for it, then (writable only) apply the fsGroup.
async fn set_up_local(
    path: &str,
    pv_name: &str,
    dir: &std::path::Path,
    read_only: bool,
    req: &SetUpRequest<'_>,
) -> Result<()> {
    if path.is_empty() {
        return Err(Error::Invalid(format!(
            "LocalVolume volume {pv_name:?} path is empty"
        )));
    }
    if let Err(e) = validate_path_no_backsteps(path) {
        return Err(Error::Invalid(format!("invalid path: {path} {e}")));
    }
    let (source, d) = (std::path::PathBuf::from(path), dir.to_path_buf());
    let pods_dir = req.pods_dir.to_path_buf();
    let mounted = blocking(move || {
        if is_mount_point_blocking(&d)? {
            return Ok(None);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&d)
            .map_err(Error::io("create local volume directory", &d))?;
        bind_mount_blocking(&source, &d, read_only)?;
        // Other pods' mounts of the same directory (upstream
        // `filterPodMounts(GetMountRefs(...))`).
        let pods_dir = std::fs::canonicalize(&pods_dir).unwrap_or(pods_dir);
        let refs = mount_refs_blocking(&d)?
            .into_iter()
            .filter(|r| r.starts_with(&pods_dir))
            .count();
        let gid = std::fs::metadata(&source)
            .map_err(Error::io("stat", &source))?
            .gid();
        Ok(Some((refs, gid)))
    })
    .await?;
    let Some((refs, old_gid)) = mounted else {
        return Ok(());
    };
    tracing::info!(pv = pv_name, dir = %dir.display(), read_only, "bind-mounted local volume");
    if let Some(gid) = req.fs_group()
        && refs > 0
        && i64::from(old_gid) != gid
    {
        tracing::warn!(
            pv = pv_name,
            "the requested fsGroup is {gid}, but the volume {pv_name} has GID {old_gid}; the volume may not be shareable"
        );
    }
    // Ownership is written only by the first pod to mount the volume.
    if !read_only && refs == 0 {
        let policy = req
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group_change_policy.clone());
        crate::ownership::set_volume_ownership(dir, req.fs_group(), policy.as_deref()).await?;
    }
    Ok(())
}

/// Upstream `storagehelpers.CheckNodeAffinity`: the PV's required node
/// affinity must match a node with these labels (and no name, as upstream
/// builds it).
pub fn check_node_affinity(
    pv: &PersistentVolume,
    labels: &BTreeMap<String, String>,
) -> std::result::Result<(), String> {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return Ok(());
    };
    if required
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, labels))
    {
        Ok(())
    } else {
        Err("no matching NodeSelectorTerms".into())
    }
}

/// A term matches when it has requirements and all of them hold; an empty
/// term matches nothing.
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let node_fields = BTreeMap::from([("metadata.name".to_string(), String::new())]);
    exprs.iter().all(|r| requirement_matches(r, labels))
        && fields.iter().all(|r| {
            r.key == "metadata.name"
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && requirement_matches(r, &node_fields)
        })
}

/// One requirement against a label set (upstream
/// `NodeSelectorRequirementsAsSelector` and `labels.Requirement.Matches`);
/// an invalid requirement matches nothing.
fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => !values.is_empty() && value.is_some_and(|v| values.contains(v)),
        "NotIn" => !values.is_empty() && value.is_none_or(|v| !values.contains(v)),
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else {
                return false;
            };
            let (Ok(bound), Some(Ok(v))) = (bound.parse::<i64>(), value.map(|v| v.parse::<i64>()))
            else {
                return false;
            };
            if op == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Volume};
    use serde_json::{Value, json};

    use super::*;
    use crate::mount::is_mount_point;
    use crate::plugin::fake::FakeHost;

    fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    fn pvc(phase: &str, volume_name: &str) -> PersistentVolumeClaim {
        from(json!({
            "metadata": {"name": "claim", "namespace": "ns", "uid": "claim-uid"},
            "spec": {"volumeName": volume_name}, "status": {"phase": phase},
        }))
    }

    /// PV `pv-1` bound to the claim, with `source` merged into its spec.
    fn pv(source: Value) -> PersistentVolume {
        let mut spec = json!({"claimRef": {"uid": "claim-uid"}});
        if let (Some(spec), Value::Object(src)) = (spec.as_object_mut(), source) {
            spec.extend(src);
        }
        from(json!({"metadata": {"name": "pv-1"}, "spec": spec}))
    }

    fn local_pv(path: &Path, hostname: Option<&str>) -> PersistentVolume {
        let mut src = json!({"local": {"path": path}});
        if let Some(h) = hostname {
            src["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [h]}]}]}});
        }
        pv(src)
    }

    fn host(claim: PersistentVolumeClaim, volume: PersistentVolume) -> FakeHost {
        FakeHost {
            pvcs: BTreeMap::from([("claim".to_string(), claim)]),
            pvs: BTreeMap::from([("pv-1".to_string(), volume)]),
            labels: BTreeMap::from([("kubernetes.io/hostname".into(), "node-a".into())]),
            ..Default::default()
        }
    }

    fn pod(uid: &str, fs_group: Option<i64>) -> Pod {
        from(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"containers": [], "securityContext": {"fsGroup": fs_group}}}),
        )
    }

    fn volume(read_only: bool) -> Volume {
        from(json!({"name": "data",
            "persistentVolumeClaim": {"claimName": "claim", "readOnly": read_only}}))
    }

    fn req<'a>(pod: &'a Pod, volume: &'a Volume, pods_dir: &'a Path) -> SetUpRequest<'a> {
        SetUpRequest {
            pod,
            volume,
            pods_dir,
        }
    }

    async fn set_up_err(h: &FakeHost, pods: &Path) -> String {
        let (p, v) = (pod("pod-uid", None), volume(false));
        set_up(h, req(&p, &v, pods))
            .await
            .expect_err("refused")
            .to_string()
    }

    #[tokio::test]
    async fn local_pv_is_bind_mounted_under_the_pv_name_and_torn_down_keeping_the_source() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let source = tmp.path().join("disk");
        std::fs::create_dir(&source).expect("mkdir");
        std::fs::write(source.join("keep"), b"x").expect("write");
        let h = host(pvc("Bound", "pv-1"), local_pv(&source, Some("node-a")));
        let pods = tmp.path().join("pods");
        let (p, v) = (pod("pod-uid", None), volume(true));
        let m = set_up(&h, req(&p, &v, &pods)).await.expect("set up");
        let dir = pods.join("pod-uid/volumes/kubernetes.io~local-volume/pv-1");
        assert_eq!(
            (m.host_path.clone(), m.plugin, m.name.as_str()),
            (dir.clone(), names::LOCAL_VOLUME, "data")
        );
        assert!(m.read_only);
        assert!(is_mount_point(&dir).await.expect("mountinfo"));
        assert_eq!(
            std::fs::read(dir.join("keep")).expect("through the mount"),
            b"x"
        );
        let e = std::fs::write(dir.join("new"), b"y").expect_err("read-only mount");
        assert_eq!(e.raw_os_error(), Some(nix::errno::Errno::EROFS as i32));
        set_up(&h, req(&p, &v, &pods)).await.expect("idempotent");
        crate::plugin::tear_down(names::LOCAL_VOLUME, &dir)
            .await
            .expect("tear down");
        assert!(!dir.exists());
        assert_eq!(
            std::fs::read(source.join("keep")).expect("source kept"),
            b"x"
        );
    }

    #[tokio::test]
    async fn only_the_first_pod_mounting_a_local_pv_sets_its_fs_group() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let source = tmp.path().join("disk");
        std::fs::create_dir(&source).expect("mkdir");
        let h = host(pvc("Bound", "pv-1"), local_pv(&source, None));
        let (pods, v) = (tmp.path().join("pods"), volume(false));
        let (p1, p2) = (pod("one", Some(2001)), pod("two", Some(2002)));
        let gid = || std::fs::metadata(&source).expect("stat").gid();
        let m1 = set_up(&h, req(&p1, &v, &pods)).await.expect("first");
        assert_eq!(gid(), 2001);
        let m2 = set_up(&h, req(&p2, &v, &pods)).await.expect("second");
        assert_eq!(
            gid(),
            2001,
            "a volume mounted by another pod keeps its group"
        );
        for m in [m1, m2] {
            crate::plugin::tear_down(names::LOCAL_VOLUME, &m.host_path)
                .await
                .expect("tear down");
        }
        assert!(source.is_dir());
    }

    #[tokio::test]
    async fn node_affinity_mismatch_and_unbound_or_misbound_claims_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let h = host(pvc("Bound", "pv-1"), local_pv(tmp.path(), Some("node-b")));
        assert_eq!(
            set_up_err(&h, tmp.path()).await,
            "MountVolume.NodeAffinity check failed for volume \"pv-1\" : no matching NodeSelectorTerms"
        );
        assert!(!tmp.path().join("pod-uid").exists(), "nothing mounted");
        let h = host(pvc("Pending", ""), local_pv(tmp.path(), None));
        assert_eq!(
            set_up_err(&h, tmp.path()).await,
            "error processing PVC ns/claim: PVC ns/claim has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")"
        );
        let other = pv(json!({"local": {"path": "/x"}, "claimRef": {"uid": "someone-else"}}));
        assert_eq!(
            set_up_err(&host(pvc("Bound", "pv-1"), other), tmp.path()).await,
            "error processing PVC ns/claim: found PV object pv-1 but its pv.Spec.ClaimRef.UID (someone-else) does not point to claim.UID (claim-uid)"
        );
        assert_eq!(
            set_up_err(&FakeHost::default(), tmp.path()).await,
            "error processing PVC ns/claim: failed to fetch PVC from API server: persistentvolumeclaims \"claim\" not found"
        );
    }

    #[tokio::test]
    async fn host_path_pv_is_used_in_place_and_other_sources_are_unsupported() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("hp");
        let hp = pv(json!({"hostPath": {"path": path, "type": "DirectoryOrCreate"}}));
        let h = host(pvc("Bound", "pv-1"), hp);
        let (p, v) = (pod("pod-uid", None), volume(true));
        let m = set_up(&h, req(&p, &v, tmp.path())).await.expect("set up");
        assert_eq!((m.host_path.clone(), m.plugin), (path, names::HOST_PATH));
        assert!(m.read_only);
        assert!(m.host_path.is_dir(), "the type check created it");
        let nfs = pv(json!({"nfs": {"path": "/x", "server": "s"}}));
        let e = set_up(&host(pvc("Bound", "pv-1"), nfs), req(&p, &v, tmp.path()))
            .await
            .expect_err("nfs");
        assert!(
            matches!(&e, Error::Unsupported { kind, .. } if kind.contains("source nfs")),
            "{e}"
        );
    }

    #[test]
    fn node_selector_operators() {
        let labels = BTreeMap::from([("zone".into(), "a".into()), ("gen".into(), "5".into())]);
        let m = |key: &str, op: &str, values: &[&str]| {
            let values =
                (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect());
            let r = NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values,
            };
            requirement_matches(&r, &labels)
        };
        assert!(m("zone", "In", &["a", "b"]) && !m("zone", "In", &["b"]));
        assert!(
            m("zone", "NotIn", &["b"])
                && m("missing", "NotIn", &["b"])
                && !m("zone", "NotIn", &["a"])
        );
        assert!(m("zone", "Exists", &[]) && !m("missing", "Exists", &[]));
        assert!(!m("zone", "DoesNotExist", &[]) && m("missing", "DoesNotExist", &[]));
        assert!(m("gen", "Gt", &["4"]) && !m("gen", "Gt", &["5"]) && m("gen", "Lt", &["6"]));
        assert!(!m("zone", "Lt", &["6"]), "not a number");
        assert!(!m("zone", "Bogus", &["a"]));
        assert!(
            !term_matches(&NodeSelectorTerm::default(), &labels),
            "an empty term matches nothing"
        );
    }
}

#[cfg(test)]
mod ephemeral_tests {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Volume};
    use serde_json::json;

    use super::*;
    use crate::plugin::fake::FakeHost;

    fn claim(owner_uid: Option<&str>) -> PersistentVolumeClaim {
        let mut c = json!({
            "metadata": {"name": "p-scratch", "namespace": "ns", "uid": "claim-uid"},
            "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"},
        });
        if let Some(uid) = owner_uid {
            c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
                "name": "p", "uid": uid, "controller": true}]);
        }
        serde_json::from_value(c).expect("claim")
    }

    fn host(claim: PersistentVolumeClaim) -> FakeHost {
        let pv = serde_json::from_value(json!({"metadata": {"name": "pv-1"},
            "spec": {"claimRef": {"uid": "claim-uid"}, "csi": {"driver": "d", "volumeHandle": "h"}}}))
        .expect("pv");
        FakeHost {
            pvcs: BTreeMap::from([("p-scratch".to_string(), claim)]),
            pvs: BTreeMap::from([("pv-1".to_string(), pv)]),
            ..Default::default()
        }
    }

    fn pod_and_volume() -> (Pod, Volume) {
        let pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns",
            "uid": "pod-uid"}, "spec": {"containers": []}}))
        .expect("pod");
        let volume = serde_json::from_value(json!({"name": "scratch",
            "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}))
        .expect("volume");
        (pod, volume)
    }

    #[tokio::test]
    async fn a_generic_ephemeral_volume_uses_the_pods_own_claim() {
        let (pod, volume) = pod_and_volume();
        assert_eq!(
            claim_of(&pod, &volume),
            Some(("p-scratch".to_string(), false, true))
        );
        let r = resolve_volume(&host(claim(Some("pod-uid"))), &pod, &volume)
            .await
            .expect("resolved")
            .expect("a claim");
        assert_eq!(r.pv.metadata.name.as_deref(), Some("pv-1"));
        assert!(!r.read_only);

        for owner in [None, Some("another-pod")] {
            let e = resolve_volume(&host(claim(owner)), &pod, &volume)
                .await
                .expect_err("not the pod's");
            assert_eq!(
                e.to_string(),
                "PVC ns/p-scratch was not created for pod ns/p (pod is not owner)"
            );
        }
    }
}
