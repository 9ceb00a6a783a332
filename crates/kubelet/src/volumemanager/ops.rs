//! The volume operations the reconciler runs (upstream
//! `operationexecutor.OperationGenerator`'s mount and unmount functions),
//! behind a trait so the reconciler is tested with a fake.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_volume::plugin::names;
use kubelet_volume::{MountedVolume, SetUpRequest, VolumeHost};

use super::csi::CsiVolumes;

/// A volume directory found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDisk {
    /// The pod's UID.
    pub uid: String,
    /// The plugin's escaped name.
    pub plugin: &'static str,
    /// The volume's name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
}

/// The deadline on one operation of a plugin that bounds its own API calls.
pub(crate) const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

/// Setting up and tearing down volumes.
#[async_trait::async_trait]
pub trait VolumeOps: Send + Sync + 'static {
    /// Sets up `volume` of `pod` (idempotent; called again to refresh).
    async fn set_up(
        &self,
        pod: &Pod,
        volume: &Volume,
        pods_dir: &Path,
    ) -> Result<MountedVolume, kubelet_volume::Error>;
    /// Tears down a volume directory.
    async fn tear_down(&self, plugin: &str, dir: &Path) -> Result<(), kubelet_volume::Error>;
    /// Unmounts and removes the subPath bind mounts of one volume of the
    /// pod (upstream `CleanSubPaths`), before the volume is torn down; an
    /// error fails the tear-down.
    async fn clean_subpaths(
        &self,
        pods_dir: &Path,
        uid: &str,
        volume: &str,
    ) -> Result<(), kubelet_volume::Error>;
    /// Volume directories and subPath mounts under `pods_dir` (upstream's
    /// reconstruction).
    async fn reconstruct(&self, pods_dir: &Path) -> Vec<OnDisk>;
    /// The UIDs of the pod directories under `pods_dir` (upstream
    /// `listPodsFromDisk`).
    async fn list_pod_dirs(&self, pods_dir: &Path) -> Result<Vec<String>, kubelet_volume::Error>;
    /// Removes a pod's directory once nothing is mounted under it and its
    /// subPath mounts are gone (upstream `cleanupOrphanedPodDirs`).
    async fn remove_pod_dir(&self, dir: &Path) -> Result<(), kubelet_volume::Error>;
    /// The outer deadline on one set-up of `volume`.
    fn set_up_timeout(&self, _volume: &Volume) -> Duration {
        OPERATION_TIMEOUT
    }
    /// The outer deadline on one tear-down of `dir` by `plugin`.
    fn tear_down_timeout(&self, _plugin: &str, _dir: &Path) -> Duration {
        OPERATION_TIMEOUT
    }
    /// The directory of volume `name` of pod `uid` whose set-up failed
    /// after it may have changed the node (staged a device, written a
    /// directory): the volume is torn down through it when the pod goes.
    fn set_up_dir(&self, _uid: &str, _name: &str) -> Option<PathBuf> {
        None
    }
}

/// Whether `dir` is a CSI volume directory (`.../kubernetes.io~csi/<name>`).
fn is_csi_dir(dir: &Path) -> bool {
    dir.parent()
        .and_then(Path::file_name)
        .is_some_and(|n| n == names::CSI)
}

/// The plugin of a volume found on disk only as `volume-subpaths/<name>`
/// (a hostPath, or a volume torn down before a crash): it has no directory
/// of its own; its tear-down is the clean-up of its subPath mounts.
pub(crate) const SUBPATHS_ONLY: &str = "volume-subpaths";

/// The real operations, through `kubelet-volume`'s plugins and, in
/// cluster mode, the CSI plugin.
pub struct KubeletVolumeOps {
    host: Arc<dyn VolumeHost>,
    csi: Option<Arc<CsiVolumes>>,
}

impl KubeletVolumeOps {
    /// Operations reading objects through `host`.
    pub fn new(host: Arc<dyn VolumeHost>) -> Self {
        Self { host, csi: None }
    }

    /// CSI volumes (inline, and claims bound to CSI PVs) through `csi`.
    pub fn with_csi(mut self, csi: Arc<CsiVolumes>) -> Self {
        self.csi = Some(csi);
        self
    }
}

/// The `&'static` plugin name for an escaped directory name.
pub(crate) fn plugin_from_dir(name: &str) -> &'static str {
    [
        names::EMPTY_DIR,
        names::HOST_PATH,
        names::CONFIG_MAP,
        names::SECRET,
        names::DOWNWARD_API,
        names::PROJECTED,
        names::LOCAL_VOLUME,
        names::CSI,
    ]
    .into_iter()
    .find(|n| *n == name)
    .unwrap_or("unknown")
}

#[async_trait::async_trait]
impl VolumeOps for KubeletVolumeOps {
    async fn set_up(
        &self,
        pod: &Pod,
        volume: &Volume,
        pods_dir: &Path,
    ) -> Result<MountedVolume, kubelet_volume::Error> {
        if let Some(csi) = &self.csi
            && let Some(r) = csi.set_up(self.host.as_ref(), pod, volume, pods_dir).await
        {
            return r;
        }
        kubelet_volume::set_up(
            self.host.as_ref(),
            SetUpRequest {
                pod,
                volume,
                pods_dir,
            },
        )
        .await
    }

    async fn tear_down(&self, plugin: &str, dir: &Path) -> Result<(), kubelet_volume::Error> {
        // A claim whose set-up failed is known by its directory only.
        if (plugin == names::CSI || is_csi_dir(dir))
            && let Some(csi) = &self.csi
        {
            return csi.tear_down(dir).await;
        }
        kubelet_volume::tear_down(plugin, dir).await
    }

    async fn clean_subpaths(
        &self,
        pods_dir: &Path,
        uid: &str,
        volume: &str,
    ) -> Result<(), kubelet_volume::Error> {
        kubelet_volume::subpath::clean_volume_subpaths(pods_dir, uid, volume).await
    }

    async fn reconstruct(&self, pods_dir: &Path) -> Vec<OnDisk> {
        let pods_dir = pods_dir.to_path_buf();
        let found = tokio::task::spawn_blocking(move || scan(&pods_dir))
            .await
            .unwrap_or_default();
        if let Some(csi) = &self.csi {
            let mut uids: Vec<&str> = found
                .iter()
                .filter(|d| d.plugin == names::CSI)
                .map(|d| d.uid.as_str())
                .collect();
            uids.dedup();
            for uid in uids {
                csi.reconstruct(uid).await;
            }
        }
        found
    }

    fn set_up_timeout(&self, volume: &Volume) -> Duration {
        match &self.csi {
            // Possibly CSI: the CSI plugin's own deadlines are longer.
            Some(csi)
                if volume.csi.is_some()
                    || volume.persistent_volume_claim.is_some()
                    || volume.ephemeral.is_some() =>
            {
                csi.operation_timeout().max(OPERATION_TIMEOUT)
            }
            _ => OPERATION_TIMEOUT,
        }
    }

    fn tear_down_timeout(&self, plugin: &str, dir: &Path) -> Duration {
        match &self.csi {
            Some(csi) if plugin == names::CSI || is_csi_dir(dir) => {
                csi.operation_timeout().max(OPERATION_TIMEOUT)
            }
            _ => OPERATION_TIMEOUT,
        }
    }

    fn set_up_dir(&self, uid: &str, name: &str) -> Option<PathBuf> {
        self.csi.as_ref()?.set_up_dir(uid, name)
    }

    async fn list_pod_dirs(&self, pods_dir: &Path) -> Result<Vec<String>, kubelet_volume::Error> {
        let pods_dir = pods_dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            crate::kubelet_volumes::list_pods_from_disk_blocking(&pods_dir)
        })
        .await
        .map_err(joined)?
    }

    async fn remove_pod_dir(&self, dir: &Path) -> Result<(), kubelet_volume::Error> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || crate::kubelet_volumes::remove_pod_dir_blocking(&dir))
            .await
            .map_err(joined)?
    }
}

fn joined(e: tokio::task::JoinError) -> kubelet_volume::Error {
    kubelet_volume::Error::Io {
        context: "blocking task",
        path: PathBuf::new(),
        source: std::io::Error::other(e.to_string()),
    }
}

fn read_dir(p: &Path) -> Vec<(String, PathBuf)> {
    read_entries(p, |t| t.is_dir())
}

fn read_entries(p: &Path, keep: impl Fn(std::fs::FileType) -> bool) -> Vec<(String, PathBuf)> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(&keep))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default()
}

/// `<pods>/<uid>/volumes/<plugin>/<name>` directories, the raw block links
/// `<pods>/<uid>/volumeDevices/<plugin>/<name>`, then
/// `<pods>/<uid>/volume-subpaths/<name>` (subPath mounts a pod removed while
/// the kubelet was down may have left).
fn scan(pods_dir: &Path) -> Vec<OnDisk> {
    let mut out = Vec::new();
    for (uid, pod_dir) in read_dir(pods_dir) {
        for (plugin, plugin_dir) in read_dir(&pod_dir.join("volumes")) {
            for (name, dir) in read_dir(&plugin_dir) {
                out.push(OnDisk {
                    uid: uid.clone(),
                    plugin: plugin_from_dir(&plugin),
                    name,
                    dir,
                });
            }
        }
        // Raw block volumes: `<pods>/<uid>/volumeDevices/<plugin>/<name>`
        // links to the published devices.
        for (plugin, plugin_dir) in read_dir(&pod_dir.join("volumeDevices")) {
            for (name, dir) in read_entries(&plugin_dir, |t| t.is_symlink()) {
                out.push(OnDisk {
                    uid: uid.clone(),
                    plugin: plugin_from_dir(&plugin),
                    name,
                    dir,
                });
            }
        }
        for (name, dir) in read_dir(&pod_dir.join("volume-subpaths")) {
            out.push(OnDisk {
                uid: uid.clone(),
                plugin: SUBPATHS_ONLY,
                name,
                dir,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconstruction_finds_volume_directories_and_subpath_mounts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pod = tmp.path().join("u1");
        std::fs::create_dir_all(pod.join("volumes/kubernetes.io~secret/token")).expect("mkdir");
        std::fs::create_dir_all(pod.join("volume-subpaths/data/c/0")).expect("mkdir");
        std::fs::create_dir_all(pod.join("volumeDevices/kubernetes.io~csi")).expect("mkdir");
        std::os::unix::fs::symlink(
            "/nowhere/published",
            pod.join("volumeDevices/kubernetes.io~csi/pv-b"),
        )
        .expect("link");
        let found = scan(tmp.path());
        assert_eq!(
            found,
            vec![
                OnDisk {
                    uid: "u1".into(),
                    plugin: names::SECRET,
                    name: "token".into(),
                    dir: pod.join("volumes/kubernetes.io~secret/token"),
                },
                OnDisk {
                    uid: "u1".into(),
                    plugin: names::CSI,
                    name: "pv-b".into(),
                    dir: pod.join("volumeDevices/kubernetes.io~csi/pv-b"),
                },
                OnDisk {
                    uid: "u1".into(),
                    plugin: SUBPATHS_ONLY,
                    name: "data".into(),
                    dir: pod.join("volume-subpaths/data"),
                },
            ]
        );
    }
}
