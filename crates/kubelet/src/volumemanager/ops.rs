//! The volume operations the reconciler runs (upstream
//! `operationexecutor.OperationGenerator`'s mount and unmount functions),
//! behind a trait so the reconciler is tested with a fake.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_volume::plugin::names;
use kubelet_volume::{MountedVolume, SetUpRequest, VolumeHost};

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
    /// Unmounts and removes the pod's subPath bind mounts (upstream
    /// `CleanSubPaths`), before its volumes are torn down.
    async fn clean_subpaths(&self, pods_dir: &Path, uid: &str)
    -> Result<(), kubelet_volume::Error>;
    /// Volume directories under `pods_dir` (upstream's reconstruction).
    async fn reconstruct(&self, pods_dir: &Path) -> Vec<OnDisk>;
    /// Removes a pod's directory once nothing is mounted under it (upstream
    /// `cleanupOrphanedPodDirs`).
    async fn remove_pod_dir(&self, dir: &Path) -> Result<(), kubelet_volume::Error>;
}

/// The real operations, through `kubelet-volume`'s plugins.
pub struct KubeletVolumeOps {
    host: Arc<dyn VolumeHost>,
}

impl KubeletVolumeOps {
    /// Operations reading objects through `host`.
    pub fn new(host: Arc<dyn VolumeHost>) -> Self {
        Self { host }
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
        kubelet_volume::tear_down(plugin, dir).await
    }

    async fn clean_subpaths(
        &self,
        pods_dir: &Path,
        uid: &str,
    ) -> Result<(), kubelet_volume::Error> {
        kubelet_volume::subpath::clean_subpaths(pods_dir, uid).await
    }

    async fn reconstruct(&self, pods_dir: &Path) -> Vec<OnDisk> {
        let pods_dir = pods_dir.to_path_buf();
        tokio::task::spawn_blocking(move || scan(&pods_dir))
            .await
            .unwrap_or_default()
    }

    async fn remove_pod_dir(&self, dir: &Path) -> Result<(), kubelet_volume::Error> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || remove_unmounted(&dir))
            .await
            .map_err(|e| kubelet_volume::Error::Io {
                context: "remove pod directory",
                path: PathBuf::new(),
                source: std::io::Error::other(e.to_string()),
            })?
    }
}

fn read_dir(p: &Path) -> Vec<(String, PathBuf)> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default()
}

/// `<pods>/<uid>/volumes/<plugin>/<name>` directories.
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
    }
    out
}

/// Removes `dir` unless anything is still mounted at or under it.
fn remove_unmounted(dir: &Path) -> Result<(), kubelet_volume::Error> {
    let Ok(canonical) = std::fs::canonicalize(dir) else {
        return Ok(());
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(kubelet_volume::Error::io("read", "/proc/self/mountinfo"))?;
    let busy = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| Path::new(mp).starts_with(&canonical));
    if busy {
        return Err(kubelet_volume::Error::Invalid(format!(
            "pod directory {} still has mounts under it",
            dir.display()
        )));
    }
    std::fs::remove_dir_all(dir).map_err(kubelet_volume::Error::io("remove", dir))
}
