//! PersistentVolumeClaim volumes (upstream `volumemanager/populator`'s
//! claim resolution, `util.CheckNodeAffinity`, and the `local` and
//! `hostPath` PV plugins): the claim must be Bound to a PV that names it;
//! the PV's node affinity must match this node; a `local` PV is
//! bind-mounted onto `kubernetes.io~local-volume/<pv-name>` (read-only when
//! the pod's claim reference says so) and a `hostPath` PV is used in place.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume};

use crate::hostpath::validate_path_no_backsteps;
use crate::mount::{bind_mount, blocking, is_mount_point};
use crate::plugin::{MountedVolume, SetUpRequest, names, volume_dir};
use crate::{Error, Result, VolumeHost};

/// PV source fields, for naming an unsupported one.
const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// Sets up the pod volume `req.volume` (a `persistentVolumeClaim` source).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let Some(src) = req.volume.persistent_volume_claim.as_ref() else {
        return Err(Error::Invalid(format!(
            "volume {:?} is not a persistentVolumeClaim volume",
            req.volume.name
        )));
    };
    let read_only = src.read_only.unwrap_or(false);
    let pv = resolve(
        host,
        kubelet_types::pod::namespace(req.pod),
        &src.claim_name,
    )
    .await?;
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(Error::Unsupported {
            volume: req.volume.name.clone(),
            kind: "block-mode PersistentVolume".into(),
        });
    }
    if let Err(e) = check_node_affinity(&pv, &host.node_labels()) {
        return Err(Error::Invalid(format!(
            "MountVolume.NodeAffinity check failed for volume {pv_name:?}: {e}"
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
        });
    }
    let kind = match serde_json::to_value(&spec) {
        Ok(serde_json::Value::Object(m)) => PV_SOURCES
            .iter()
            .find(|k| m.contains_key(**k))
            .map_or("unknown", |k| *k)
            .to_string(),
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
    let fail =
        |msg: String| Error::Invalid(format!("error processing PVC {namespace}/{claim}: {msg}"));
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
    if is_mount_point(dir).await? {
        return Ok(());
    }
    let d = dir.to_path_buf();
    blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&d)
            .map_err(Error::io("create local volume directory", &d))
    })
    .await?;
    bind_mount(std::path::Path::new(path), dir, read_only).await?;
    tracing::info!(pv = pv_name, dir = %dir.display(), read_only, "bind-mounted local volume");
    let d = dir.to_path_buf();
    let pods_dir = req.pods_dir.to_path_buf();
    let refs = blocking(move || {
        Ok(crate::mount::mount_refs_blocking(&d)?
            .into_iter()
            .filter(|r| r.starts_with(std::fs::canonicalize(&pods_dir).unwrap_or(pods_dir.clone())))
            .collect::<Vec<_>>())
    })
    .await?;
    if let (Some(gid), false) = (req.fs_group(), refs.is_empty()) {
        let p = std::path::PathBuf::from(path);
        let old = blocking(move || {
            std::fs::metadata(&p)
                .map(|m| std::os::unix::fs::MetadataExt::gid(&m))
                .map_err(Error::io("stat", &p))
        })
        .await?;
        if i64::from(old) != gid {
            tracing::warn!(
                pv = pv_name,
                "the requested fsGroup is {gid}, but the volume {pv_name} has GID {old}; the volume may not be shareable"
            );
        }
    }
    // Ownership is written only by the first pod to mount the volume.
    if !read_only && refs.is_empty() {
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
    use super::*;
    use crate::plugin::fake::FakeHost;
    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, LocalVolumeSource, NFSVolumeSource, NodeSelector, ObjectReference,
        PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Volume,
        VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::path::Path;

    fn meta(name: &str, uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
    }

    fn pvc(phase: &str, volume_name: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: meta("claim", "claim-uid"),
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: (!volume_name.is_empty()).then(|| volume_name.into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn pv(spec: PersistentVolumeSpec) -> PersistentVolume {
        PersistentVolume {
            metadata: meta("pv-1", "pv-uid"),
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    uid: Some("claim-uid".into()),
                    ..Default::default()
                }),
                ..spec
            }),
            ..Default::default()
        }
    }

    fn local_pv(path: &Path, affinity: Option<NodeSelectorRequirement>) -> PersistentVolume {
        pv(PersistentVolumeSpec {
            local: Some(LocalVolumeSource {
                path: path.display().to_string(),
                fs_type: None,
            }),
            node_affinity: affinity.map(|r| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![r]),
                        match_fields: None,
                    }],
                }),
            }),
            ..Default::default()
        })
    }

    fn req_in(key: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: "In".into(),
            values: Some(values.iter().map(|v| (*v).to_string()).collect()),
        }
    }

    fn host(claim: PersistentVolumeClaim, volume: PersistentVolume) -> FakeHost {
        FakeHost {
            pvcs: BTreeMap::from([("claim".to_string(), claim)]),
            pvs: BTreeMap::from([("pv-1".to_string(), volume)]),
            labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), "node-a".to_string())]),
            ..Default::default()
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: meta("p", "pod-uid"),
            spec: Some(PodSpec::default()),
            ..Default::default()
        }
    }

    fn volume(read_only: bool) -> Volume {
        Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "claim".into(),
                read_only: Some(read_only),
            }),
            ..Default::default()
        }
    }

    async fn set_up_err(h: &FakeHost, pods: &Path) -> String {
        let (p, v) = (pod(), volume(false));
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: pods,
        };
        set_up(h, req).await.expect_err("refused").to_string()
    }

    #[tokio::test]
    async fn local_pv_is_bind_mounted_under_the_pv_name_and_torn_down_without_touching_the_source()
    {
        let tmp = tempfile::tempdir().expect("tempdir");
        let source = tmp.path().join("disk");
        std::fs::create_dir(&source).expect("mkdir");
        std::fs::write(source.join("keep"), b"x").expect("write");
        let h = host(
            pvc("Bound", "pv-1"),
            local_pv(&source, Some(req_in("kubernetes.io/hostname", &["node-a"]))),
        );
        let pods = tmp.path().join("pods");
        let (p, v) = (pod(), volume(true));
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: &pods,
        };
        let m = set_up(&h, req).await.expect("set up");
        let dir = pods.join("pod-uid/volumes/kubernetes.io~local-volume/pv-1");
        assert_eq!(m.host_path, dir);
        assert_eq!(m.plugin, names::LOCAL_VOLUME);
        assert_eq!(m.name, "data");
        assert!(m.read_only);
        assert!(is_mount_point(&dir).await.expect("mountinfo"));
        assert_eq!(
            std::fs::read(dir.join("keep")).expect("through the mount"),
            b"x"
        );
        let e = std::fs::write(dir.join("new"), b"y").expect_err("read-only mount");
        assert_eq!(e.raw_os_error(), Some(nix::errno::Errno::EROFS as i32));
        set_up(&h, req).await.expect("idempotent");
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
        let pods = tmp.path().join("pods");
        let v = volume(false);
        let with_group = |uid: &str, gid: i64| {
            let mut p = pod();
            p.metadata.uid = Some(uid.into());
            p.spec = Some(PodSpec {
                security_context: Some(k8s_openapi::api::core::v1::PodSecurityContext {
                    fs_group: Some(gid),
                    ..Default::default()
                }),
                ..Default::default()
            });
            p
        };
        let (p1, p2) = (with_group("one", 2001), with_group("two", 2002));
        let gid =
            || std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(&source).expect("stat"));
        let m1 = set_up(
            &h,
            SetUpRequest {
                pod: &p1,
                volume: &v,
                pods_dir: &pods,
            },
        )
        .await
        .expect("first");
        assert_eq!(gid(), 2001);
        let m2 = set_up(
            &h,
            SetUpRequest {
                pod: &p2,
                volume: &v,
                pods_dir: &pods,
            },
        )
        .await
        .expect("second");
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
    async fn node_affinity_mismatch_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let h = host(
            pvc("Bound", "pv-1"),
            local_pv(
                tmp.path(),
                Some(req_in("kubernetes.io/hostname", &["node-b"])),
            ),
        );
        assert_eq!(
            set_up_err(&h, tmp.path()).await,
            "MountVolume.NodeAffinity check failed for volume \"pv-1\": no matching NodeSelectorTerms"
        );
        assert!(!tmp.path().join("pod-uid").exists(), "nothing mounted");
    }

    #[tokio::test]
    async fn unbound_and_misbound_claims_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let h = host(pvc("Pending", ""), local_pv(tmp.path(), None));
        assert_eq!(
            set_up_err(&h, tmp.path()).await,
            "error processing PVC ns/claim: PVC ns/claim has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")"
        );
        let mut other = local_pv(tmp.path(), None);
        if let Some(s) = other.spec.as_mut() {
            s.claim_ref = Some(ObjectReference {
                uid: Some("someone-else".into()),
                ..Default::default()
            });
        }
        let h = host(pvc("Bound", "pv-1"), other);
        assert_eq!(
            set_up_err(&h, tmp.path()).await,
            "error processing PVC ns/claim: found PV object pv-1 but its pv.Spec.ClaimRef.UID (someone-else) does not point to claim.UID (claim-uid)"
        );
        let h = FakeHost::default();
        assert_eq!(
            set_up_err(&h, tmp.path()).await,
            "error processing PVC ns/claim: failed to fetch PVC from API server: persistentvolumeclaims \"claim\" not found"
        );
    }

    #[tokio::test]
    async fn host_path_pv_is_used_in_place_and_other_sources_are_unsupported() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let hp = pv(PersistentVolumeSpec {
            host_path: Some(HostPathVolumeSource {
                path: tmp.path().join("hp").display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        });
        let h = host(pvc("Bound", "pv-1"), hp);
        let (p, v) = (pod(), volume(true));
        let m = set_up(
            &h,
            SetUpRequest {
                pod: &p,
                volume: &v,
                pods_dir: tmp.path(),
            },
        )
        .await
        .expect("set up");
        assert_eq!(m.host_path, tmp.path().join("hp"));
        assert_eq!(m.plugin, names::HOST_PATH);
        assert!(m.read_only);
        assert!(m.host_path.is_dir(), "the type check created it");
        let nfs = pv(PersistentVolumeSpec {
            nfs: Some(NFSVolumeSource {
                path: "/x".into(),
                server: "s".into(),
                read_only: None,
            }),
            ..Default::default()
        });
        let h = host(pvc("Bound", "pv-1"), nfs);
        let e = set_up(
            &h,
            SetUpRequest {
                pod: &p,
                volume: &v,
                pods_dir: tmp.path(),
            },
        )
        .await
        .expect_err("nfs");
        assert!(
            matches!(&e, Error::Unsupported { kind, .. } if kind.contains("nfs")),
            "{e}"
        );
    }

    #[test]
    fn node_selector_operators() {
        let labels = BTreeMap::from([
            ("zone".to_string(), "a".to_string()),
            ("gen".to_string(), "5".to_string()),
        ]);
        let r = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_string()).collect()),
        };
        assert!(requirement_matches(&r("zone", "In", &["a", "b"]), &labels));
        assert!(!requirement_matches(&r("zone", "In", &["b"]), &labels));
        assert!(requirement_matches(&r("zone", "NotIn", &["b"]), &labels));
        assert!(requirement_matches(&r("missing", "NotIn", &["b"]), &labels));
        assert!(!requirement_matches(&r("zone", "NotIn", &["a"]), &labels));
        assert!(requirement_matches(&r("zone", "Exists", &[]), &labels));
        assert!(!requirement_matches(
            &r("zone", "DoesNotExist", &[]),
            &labels
        ));
        assert!(requirement_matches(
            &r("missing", "DoesNotExist", &[]),
            &labels
        ));
        assert!(requirement_matches(&r("gen", "Gt", &["4"]), &labels));
        assert!(!requirement_matches(&r("gen", "Gt", &["5"]), &labels));
        assert!(requirement_matches(&r("gen", "Lt", &["6"]), &labels));
        assert!(
            !requirement_matches(&r("zone", "Lt", &["6"]), &labels),
            "not a number"
        );
        assert!(!requirement_matches(&r("zone", "Bogus", &["a"]), &labels));
        let empty = NodeSelectorTerm::default();
        assert!(
            !term_matches(&empty, &labels),
            "an empty term matches nothing"
        );
    }
}
