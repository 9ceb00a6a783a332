//! Plugin dispatch (upstream `VolumePluginMgr.FindPluginBySpec` and each
//! plugin's `NewMounter(...).SetUp`): which plugin serves a pod volume,
//! where its directory is, and setting it up or tearing it down.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::{Error, Result, VolumeHost};

/// Upstream plugin names, as they appear escaped (`/` → `~`) in paths.
pub mod names {
    /// `kubernetes.io/empty-dir`.
    pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
    /// `kubernetes.io/host-path` (no directory of its own).
    pub const HOST_PATH: &str = "kubernetes.io~host-path";
    /// `kubernetes.io/configmap`.
    pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
    /// `kubernetes.io/secret`.
    pub const SECRET: &str = "kubernetes.io~secret";
    /// `kubernetes.io/downward-api`.
    pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
    /// `kubernetes.io/projected`.
    pub const PROJECTED: &str = "kubernetes.io~projected";
    /// `kubernetes.io/local-volume` (a PVC bound to a local PV).
    pub const LOCAL_VOLUME: &str = "kubernetes.io~local-volume";
    /// `kubernetes.io/csi` (inline `csi:` volumes and CSI PersistentVolumes;
    /// served by `kubelet-csi` through the kubelet).
    pub const CSI: &str = "kubernetes.io~csi";
}

/// What a set-up volume gives the containers that mount it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The pod's name for the volume.
    pub name: String,
    /// The plugin's escaped name ([`names`]).
    pub plugin: &'static str,
    /// The host path containers bind-mount (the volume directory, or the
    /// hostPath / hostPath PV's path).
    pub host_path: PathBuf,
    /// Forced read-only (a PVC with `readOnly`, a read-only PV).
    pub read_only: bool,
    /// The content comes from apiserver objects or the pod itself and is
    /// rewritten when they change (configMap, secret, downwardAPI, projected).
    pub refresh: bool,
    /// A raw block volume (upstream `BlockVolumeMapper`): `host_path` is
    /// the pod's device link, which containers get through `volumeDevices`
    /// as a device node, never as a mount.
    pub block: bool,
}

/// A request to set up one volume of one pod.
#[derive(Debug, Clone, Copy)]
pub struct SetUpRequest<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The volume, from `spec.volumes`.
    pub volume: &'a Volume,
    /// `<root-dir>/pods`.
    pub pods_dir: &'a Path,
}

impl SetUpRequest<'_> {
    /// `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`.
    pub fn dir(&self, plugin: &str) -> PathBuf {
        volume_dir(
            self.pods_dir,
            kubelet_types::pod::uid(self.pod),
            plugin,
            &self.volume.name,
        )
    }

    /// The pod's `securityContext.fsGroup`.
    pub fn fs_group(&self) -> Option<i64> {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
    }
}

/// `<pods_dir>/<uid>/volumes/<plugin>/<name>`.
pub fn volume_dir(pods_dir: &Path, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pods_dir.join(uid).join("volumes").join(plugin).join(name)
}

/// The plugin serving `v`, or [`Error::Unsupported`] naming its type.
pub fn plugin_for(v: &Volume) -> Result<&'static str> {
    use names::*;
    let unsupported = |kind: &str| Error::Unsupported {
        volume: v.name.clone(),
        kind: kind.to_string(),
    };
    Ok(if v.empty_dir.is_some() {
        EMPTY_DIR
    } else if v.host_path.is_some() {
        HOST_PATH
    } else if v.config_map.is_some() {
        CONFIG_MAP
    } else if v.secret.is_some() {
        SECRET
    } else if v.downward_api.is_some() {
        DOWNWARD_API
    } else if v.projected.is_some() {
        PROJECTED
    } else if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
        // Resolved to the bound PV's plugin by `pvc` (a generic ephemeral
        // volume is its claim `<pod>-<volume>`).
        LOCAL_VOLUME
    } else if v.csi.is_some() {
        CSI
    } else {
        return Err(unsupported(&source_kind(v)));
    })
}

/// The name of the volume source field that is set (`csi`, `nfs`, ...).
pub fn source_kind(v: &Volume) -> String {
    let Ok(serde_json::Value::Object(m)) = serde_json::to_value(v) else {
        return "unknown".into();
    };
    m.keys()
        .find(|k| k.as_str() != "name")
        .cloned()
        .unwrap_or_else(|| "unknown".into())
}

/// Sets up `req.volume` (idempotent: called again to refresh content),
/// then applies the pod's fsGroup where upstream does: emptyDir and local
/// PVs apply it inside their set-up (only when freshly set up, with the
/// pod's `fsGroupChangePolicy` for local PVs); configMap, secret,
/// downwardAPI and projected get it here after every set-up, read-only
/// attributes and no change policy, as upstream; hostPath never.
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    use names::*;
    let plugin = plugin_for(req.volume)?;
    match plugin {
        EMPTY_DIR => crate::emptydir::set_up(host, req).await,
        HOST_PATH => crate::hostpath::set_up(host, req).await,
        LOCAL_VOLUME => crate::pvc::set_up(host, req).await,
        CONFIG_MAP => with_fs_group(req, crate::configmap::set_up(host, req).await?).await,
        SECRET => with_fs_group(req, crate::secret::set_up(host, req).await?).await,
        DOWNWARD_API => with_fs_group(req, crate::downwardapi::set_up(host, req).await?).await,
        PROJECTED => with_fs_group(req, crate::projected::set_up(host, req).await?).await,
        _ => Err(Error::Unsupported {
            volume: req.volume.name.clone(),
            kind: source_kind(req.volume),
        }),
    }
}

/// Applies the pod's fsGroup to a volume written from apiserver objects
/// (configMap, secret, downwardAPI, projected): read-only attributes, no
/// change policy, after every set-up (upstream's `SetUpAt` of those
/// plugins).
pub async fn with_fs_group(req: SetUpRequest<'_>, mounted: MountedVolume) -> Result<MountedVolume> {
    crate::ownership::set_volume_ownership_with(&mounted.host_path, req.fs_group(), None, true)
        .await?;
    Ok(mounted)
}

/// Tears down the volume directory `dir` of plugin `plugin`: unmounts it
/// (tmpfs, bind), checks nothing is mounted there or below any more, then
/// removes it (a local PV's mount point only with a non-recursive remove,
/// as upstream's `CleanupMountPoint`). A missing directory is fine;
/// hostPath has nothing to tear down.
pub async fn tear_down(plugin: &str, dir: &Path) -> Result<()> {
    if plugin == names::HOST_PATH {
        return Ok(());
    }
    let (plugin, dir) = (plugin.to_string(), dir.to_path_buf());
    crate::mount::blocking(move || {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match plugin.as_str() {
            names::EMPTY_DIR => crate::emptydir::remove_ready_blocking(&dir, &name)?,
            names::CONFIG_MAP | names::SECRET | names::DOWNWARD_API | names::PROJECTED => {
                crate::emptydir::remove_ready_blocking(&dir, &format!("wrapped_{name}"))?;
            }
            _ => {}
        }
        if std::fs::symlink_metadata(&dir).is_err() {
            return Ok(());
        }
        crate::mount::unmount_blocking(&dir)?;
        let left = crate::mount::mounts_under_blocking(&dir)?;
        if !left.is_empty() {
            return Err(Error::Invalid(format!(
                "cannot remove volume directory {}: still mounted at {}",
                dir.display(),
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if plugin == names::LOCAL_VOLUME {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io("remove volume directory", &dir)(e));
                }
                _ => {}
            }
        } else {
            // Never through a mount that appears meanwhile.
            crate::removeall::remove_all_one_filesystem_blocking(&dir)?;
        }
        tracing::debug!(plugin, dir = %dir.display(), "tore down volume");
        Ok(())
    })
    .await
}

/// A volume directory found on disk: `(plugin dir name, volume name, path)`.
pub type OnDiskVolume = (String, String, PathBuf);

/// The volume directories of pod `uid` on disk
/// (`<pods_dir>/<uid>/volumes/<plugin>/<name>`), for adopting them after a
/// restart (upstream `getVolumesFromPodDir`). A pod without volumes gives
/// an empty list.
pub async fn reconstruct(pods_dir: &Path, uid: &str) -> Result<Vec<OnDiskVolume>> {
    let root = pods_dir.join(uid).join("volumes");
    crate::mount::blocking(move || {
        let list = |dir: &Path| -> Result<Vec<(String, PathBuf)>> {
            let entries = match std::fs::read_dir(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                r => r.map_err(Error::io("read directory", dir))?,
            };
            let mut out = Vec::new();
            for e in entries {
                let e = e.map_err(Error::io("read directory", dir))?;
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push((e.file_name().to_string_lossy().into_owned(), e.path()));
                }
            }
            out.sort();
            Ok(out)
        };
        let mut found = Vec::new();
        for (plugin, pdir) in list(&root)? {
            for (name, path) in list(&pdir)? {
                found.push((plugin.clone(), name, path));
            }
        }
        Ok(found)
    })
    .await
}

/// A [`VolumeHost`] over fixed objects, for tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use crate::host::TokenRequest;
    use crate::{ObjectError, VolumeHost};

    /// Objects by name; labels and allocatable as given.
    #[derive(Default)]
    pub(crate) struct FakeHost {
        pub(crate) pvcs: BTreeMap<String, PersistentVolumeClaim>,
        pub(crate) pvs: BTreeMap<String, PersistentVolume>,
        pub(crate) labels: BTreeMap<String, String>,
        pub(crate) allocatable: BTreeMap<String, Quantity>,
    }

    fn not_found(resource: &'static str, name: &str) -> ObjectError {
        ObjectError::NotFound {
            resource,
            name: name.to_string(),
        }
    }

    #[async_trait::async_trait]
    impl VolumeHost for FakeHost {
        async fn get_config_map(&self, _: &str, name: &str) -> Result<ConfigMap, ObjectError> {
            Err(not_found("configmaps", name))
        }
        async fn get_secret(&self, _: &str, name: &str) -> Result<Secret, ObjectError> {
            Err(not_found("secrets", name))
        }
        async fn get_service_account_token(&self, _: &TokenRequest) -> Result<String, ObjectError> {
            Err(ObjectError::Other("no tokens".into()))
        }
        async fn get_persistent_volume_claim(
            &self,
            _: &str,
            name: &str,
        ) -> Result<PersistentVolumeClaim, ObjectError> {
            self.pvcs
                .get(name)
                .cloned()
                .ok_or_else(|| not_found("persistentvolumeclaims", name))
        }
        async fn get_persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
            self.pvs
                .get(name)
                .cloned()
                .ok_or_else(|| not_found("persistentvolumes", name))
        }
        fn node_name(&self) -> String {
            "node-a".into()
        }
        fn node_labels(&self) -> BTreeMap<String, String> {
            self.labels.clone()
        }
        fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
            self.allocatable.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use k8s_openapi::api::core::v1::{
        EmptyDirVolumeSource, NFSVolumeSource, PodSecurityContext, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::fake::FakeHost;
    use super::*;

    fn pod(fs_group: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some("u".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                security_context: Some(PodSecurityContext {
                    fs_group,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn empty_dir_gets_the_fs_group_and_unknown_types_are_unsupported() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = pod(Some(4321));
        let v = Volume {
            name: "e".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        };
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: tmp.path(),
        };
        let m = set_up(&FakeHost::default(), req).await.expect("set up");
        let md = std::fs::metadata(&m.host_path).expect("dir");
        assert_eq!(md.gid(), 4321);
        assert_eq!(md.permissions().mode() & 0o7777, 0o2777);

        let v = Volume {
            name: "n".into(),
            nfs: Some(NFSVolumeSource {
                path: "/".into(),
                server: "s".into(),
                read_only: None,
            }),
            ..Default::default()
        };
        let req = SetUpRequest {
            pod: &p,
            volume: &v,
            pods_dir: tmp.path(),
        };
        let e = set_up(&FakeHost::default(), req).await.expect_err("nfs");
        assert_eq!(
            e.to_string(),
            "no volume plugin matched for volume \"n\" of type nfs"
        );
    }

    #[tokio::test]
    async fn tear_down_never_deletes_through_a_mount_and_tolerates_missing_dirs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let source = tmp.path().join("source");
        std::fs::create_dir(&source).expect("mkdir");
        std::fs::write(source.join("keep"), b"x").expect("write");
        let dir = volume_dir(tmp.path(), "u", names::EMPTY_DIR, "e");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let nested = dir.join("nested");
        crate::mount::bind_mount(&source, &nested, false)
            .await
            .expect("bind");

        let e = tear_down(names::EMPTY_DIR, &dir)
            .await
            .expect_err("nested mount");
        assert!(e.to_string().contains("still mounted"), "{e}");
        assert!(
            source.join("keep").exists(),
            "nothing deleted through the mount"
        );
        crate::mount::unmount(&nested).await.expect("unmount");
        tear_down(names::EMPTY_DIR, &dir).await.expect("tear down");
        assert!(!dir.exists());
        tear_down(names::EMPTY_DIR, &dir)
            .await
            .expect("missing is fine");
        tear_down(names::HOST_PATH, &source)
            .await
            .expect("hostPath: nothing");
        assert!(source.join("keep").exists());
    }

    #[tokio::test]
    async fn tear_down_unmounts_a_tmpfs_and_removes_the_wrapped_ready_marker() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = volume_dir(tmp.path(), "u", names::SECRET, "s");
        crate::mount::mount_tmpfs(&dir, Some(1 << 20), 0o755)
            .await
            .expect("tmpfs");
        std::fs::write(dir.join("token"), b"t").expect("write");
        let marker = tmp
            .path()
            .join("u/plugins/kubernetes.io~empty-dir/wrapped_s");
        std::fs::create_dir_all(&marker).expect("mkdir");
        std::fs::write(marker.join("ready"), b"").expect("write");
        tear_down(names::SECRET, &dir).await.expect("tear down");
        assert!(!dir.exists() && !marker.exists());
        assert!(!crate::mount::is_mount_point(&dir).await.expect("mountinfo"));
    }

    #[tokio::test]
    async fn reconstruct_lists_volume_directories() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(reconstruct(tmp.path(), "u").await.expect("none").is_empty());
        for (plugin, name) in [
            (names::EMPTY_DIR, "b"),
            (names::EMPTY_DIR, "a"),
            (names::SECRET, "s"),
        ] {
            std::fs::create_dir_all(volume_dir(tmp.path(), "u", plugin, name)).expect("mkdir");
        }
        std::fs::write(tmp.path().join("u/volumes/stray-file"), b"").expect("write");
        let found = reconstruct(tmp.path(), "u").await.expect("list");
        let names: Vec<_> = found
            .iter()
            .map(|(p, n, _)| (p.as_str(), n.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                (names::EMPTY_DIR, "a"),
                (names::EMPTY_DIR, "b"),
                (names::SECRET, "s")
            ]
        );
        assert_eq!(found[2].2, volume_dir(tmp.path(), "u", names::SECRET, "s"));
    }
}
