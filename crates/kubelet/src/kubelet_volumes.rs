//! Removal of pod directories (upstream `kubelet_volumes.go`
//! `cleanupOrphanedPodDirs` and `removeOrphanedPodVolumeDirs`): the
//! directory `<root-dir>/pods/<uid>` of a pod that is gone is removed only
//! when nothing is mounted under it and its `volume-subpaths` directory is
//! gone; its `volumes` directory may hold only empty directories, and
//! nothing is ever removed across a file system boundary
//! (`kubelet_volume::removeall`). The volume manager calls this once a
//! pod's volumes are torn down, and for directories of unknown pods it
//! finds on disk (its housekeeping).
//!
//! Everything here is blocking: run it on the blocking pool.

use std::path::{Path, PathBuf};

use kubelet_volume::Error;
use kubelet_volume::removeall::{
    remove_all_one_filesystem_blocking, remove_dirs_one_filesystem_blocking,
};

/// `<pod dir>/volumes`.
const VOLUMES_DIR: &str = "volumes";
/// `<pod dir>/volume-subpaths`.
const SUBPATHS_DIR: &str = "volume-subpaths";

/// The UIDs of the pod directories under `pods_dir` (upstream
/// `listPodsFromDisk`); a missing `pods_dir` has none.
pub fn list_pods_from_disk_blocking(pods_dir: &Path) -> Result<Vec<String>, Error> {
    let entries = match std::fs::read_dir(pods_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.map_err(Error::io("read directory", pods_dir))?,
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(Error::io("read directory", pods_dir))?;
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Removes the directory `pod_dir` of a pod that is gone, if that is safe;
/// otherwise says why not and removes nothing that could be a volume's.
/// A missing directory is fine.
pub fn remove_pod_dir_blocking(pod_dir: &Path) -> Result<(), Error> {
    if std::fs::symlink_metadata(pod_dir).is_err() {
        return Ok(());
    }
    let mounted = kubelet_volume::mount::mounts_under_blocking(pod_dir)?;
    if !mounted.is_empty() {
        return Err(Error::Invalid(format!(
            "orphaned pod directory {} found, but volumes are still mounted at {}",
            pod_dir.display(),
            mounted
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    remove_orphaned_pod_volume_dirs(pod_dir)?;
    for entry in read_dir(pod_dir)? {
        // The volumes directory went above, or it stays.
        if entry.file_name().is_some_and(|n| n == VOLUMES_DIR) {
            continue;
        }
        remove_all_one_filesystem_blocking(&entry)?;
    }
    match std::fs::remove_dir(pod_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io("remove pod directory", pod_dir)(e))
        }
        _ => Ok(()),
    }
}

/// Upstream `removeOrphanedPodVolumeDirs`: nothing while subPath mounts may
/// be left; then the `volumes` directory, which may hold only (empty)
/// directories by now.
fn remove_orphaned_pod_volume_dirs(pod_dir: &Path) -> Result<(), Error> {
    let subpaths = pod_dir.join(SUBPATHS_DIR);
    if std::fs::symlink_metadata(&subpaths).is_ok() {
        return Err(Error::Invalid(format!(
            "orphaned pod directory {} found, but volume subpaths are still present on disk",
            pod_dir.display()
        )));
    }
    remove_dirs_one_filesystem_blocking(&pod_dir.join(VOLUMES_DIR)).map_err(|e| {
        Error::Invalid(format!(
            "orphaned pod directory {} found, but error occurred when trying to remove the volumes dir: {e}",
            pod_dir.display()
        ))
    })
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.map_err(Error::io("read directory", dir))?,
    };
    entries
        .map(|e| {
            e.map(|e| e.path())
                .map_err(Error::io("read directory", dir))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_dir(tmp: &Path) -> PathBuf {
        let dir = tmp.join("pods/u1");
        std::fs::create_dir_all(dir.join("volumes/kubernetes.io~secret")).expect("mkdir");
        std::fs::create_dir_all(dir.join("containers/c")).expect("mkdir");
        std::fs::write(dir.join("containers/c/0123"), b"log").expect("write");
        std::fs::write(dir.join("etc-hosts"), b"hosts").expect("write");
        dir
    }

    #[test]
    fn an_unmounted_pod_directory_is_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = pod_dir(tmp.path());
        assert_eq!(
            list_pods_from_disk_blocking(&tmp.path().join("pods")).expect("list"),
            vec!["u1"]
        );
        remove_pod_dir_blocking(&dir).expect("removed");
        assert!(!dir.exists());
        remove_pod_dir_blocking(&dir).expect("gone already");
    }

    #[test]
    fn volume_data_and_subpath_directories_keep_the_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = pod_dir(tmp.path());
        std::fs::create_dir_all(dir.join("volume-subpaths/data/c")).expect("mkdir");
        let e = remove_pod_dir_blocking(&dir).expect_err("subpaths left");
        assert!(
            e.to_string().contains("volume subpaths are still present"),
            "{e}"
        );
        assert!(dir.join("etc-hosts").exists(), "nothing removed");
        std::fs::remove_dir_all(dir.join("volume-subpaths")).expect("rm");
        let data = dir.join("volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&data).expect("mkdir");
        std::fs::write(data.join("f"), b"data").expect("write");
        let e = remove_pod_dir_blocking(&dir).expect_err("volume data left");
        assert!(e.to_string().contains("remove the volumes dir"), "{e}");
        assert_eq!(std::fs::read(data.join("f")).expect("kept"), b"data");
    }

    #[test]
    fn a_mount_under_the_directory_keeps_everything() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = pod_dir(tmp.path());
        let host = tmp.path().join("host");
        std::fs::create_dir(&host).expect("mkdir");
        std::fs::write(host.join("f"), b"host").expect("write");
        // A bind mount outside volume-subpaths: still never crossed.
        let target = dir.join("plugins/x");
        kubelet_volume::mount::bind_mount_blocking(&host, &target, false).expect("bind");
        let r = remove_pod_dir_blocking(&dir);
        kubelet_volume::mount::unmount_blocking(&target).expect("unmount");
        let e = r.expect_err("mounted");
        assert!(e.to_string().contains("still mounted"), "{e}");
        assert_eq!(std::fs::read(host.join("f")).expect("kept"), b"host");
        remove_pod_dir_blocking(&dir).expect("removed once unmounted");
        assert!(!dir.exists() && host.join("f").exists());
    }
}
