//! Removing a directory tree without ever leaving its file system (upstream
//! `pkg/util/removeall`: `RemoveAllOneFilesystem`, `RemoveDirsOneFilesystem`).
//!
//! A plain recursive delete walks into whatever is mounted below the
//! directory (a subPath bind mount of a hostPath, a local PV) and deletes
//! the host's files. Here nothing is removed when anything is mounted at or
//! under the directory (`/proc/self/mountinfo`, which also sees bind mounts
//! of the same file system), and the walk itself refuses anything on
//! another device (`st_dev`), should a mount appear meanwhile. Symlinks are
//! removed, never followed. All of it is blocking.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::{Error, Result};

/// Removes `path` and everything under it, on the same file system only
/// (upstream `RemoveAllOneFilesystem`). A missing `path` is fine.
pub fn remove_all_one_filesystem_blocking(path: &Path) -> Result<()> {
    remove_tree(path, false)
}

/// Removes `path` and the directories under it, failing on any other kind
/// of file, on the same file system only (upstream `RemoveDirsOneFilesystem`,
/// for a pod's `volumes` directory: what is left there may be a volume's
/// data, which is never deleted). A missing `path` is fine.
pub fn remove_dirs_one_filesystem_blocking(path: &Path) -> Result<()> {
    remove_tree(path, true)
}

fn remove_tree(path: &Path, dirs_only: bool) -> Result<()> {
    let md = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.map_err(Error::io("lstat", path))?,
    };
    if !md.is_dir() {
        return remove_leaf(path, dirs_only);
    }
    // Walk the canonical path: mountinfo lists canonical mount points.
    let root = std::fs::canonicalize(path).map_err(Error::io("resolve", path))?;
    let left = crate::mount::mounts_under_blocking(&root)?;
    if !left.is_empty() {
        return Err(Error::Invalid(format!(
            "cannot remove {}: still mounted at {}",
            path.display(),
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    walk(&root, md.dev(), dirs_only)
}

fn walk(path: &Path, dev: u64, dirs_only: bool) -> Result<()> {
    let md = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.map_err(Error::io("lstat", path))?,
    };
    if md.dev() != dev {
        return Err(Error::Invalid(format!(
            "cannot delete {}: it is on another file system",
            path.display()
        )));
    }
    if !md.is_dir() {
        return remove_leaf(path, dirs_only);
    }
    let entries = match std::fs::read_dir(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.map_err(Error::io("read directory", path))?,
    };
    for entry in entries {
        let entry = entry.map_err(Error::io("read directory", path))?;
        walk(&entry.path(), dev, dirs_only)?;
    }
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", path)(e)),
        _ => Ok(()),
    }
}

fn remove_leaf(path: &Path, dirs_only: bool) -> Result<()> {
    if dirs_only {
        return Err(Error::Invalid(format!(
            "cannot remove {}: not a directory",
            path.display()
        )));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_removed_and_symlinks_are_not_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), b"host").expect("write");
        let dir = tmp.path().join("pod");
        std::fs::create_dir_all(dir.join("a/b")).expect("mkdir");
        std::fs::write(dir.join("a/b/f"), b"x").expect("write");
        std::os::unix::fs::symlink(&outside, dir.join("a/link")).expect("symlink");
        remove_all_one_filesystem_blocking(&dir).expect("removed");
        assert!(!dir.exists());
        assert_eq!(std::fs::read(outside.join("keep")).expect("kept"), b"host");
        remove_all_one_filesystem_blocking(&dir).expect("missing is fine");
    }

    #[test]
    fn dirs_only_refuses_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("volumes");
        std::fs::create_dir_all(dir.join("kubernetes.io~empty-dir/data")).expect("mkdir");
        std::fs::write(dir.join("kubernetes.io~empty-dir/data/f"), b"x").expect("write");
        let e = remove_dirs_one_filesystem_blocking(&dir).expect_err("a file");
        assert!(e.to_string().contains("not a directory"), "{e}");
        assert!(dir.join("kubernetes.io~empty-dir/data/f").exists());
        std::fs::remove_file(dir.join("kubernetes.io~empty-dir/data/f")).expect("rm");
        remove_dirs_one_filesystem_blocking(&dir).expect("only directories left");
        assert!(!dir.exists());
    }

    #[test]
    fn nothing_is_removed_through_a_bind_mount() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let host = tmp.path().join("host");
        std::fs::create_dir(&host).expect("mkdir");
        std::fs::write(host.join("data"), b"precious").expect("write");
        let dir = tmp.path().join("pod");
        let target = dir.join("volume-subpaths/v/c/0");
        std::fs::create_dir_all(&target).expect("mkdir");
        std::fs::write(dir.join("etc-hosts"), b"x").expect("write");
        crate::mount::bind_mount_blocking(&host, &target, false).expect("bind");
        let e = remove_all_one_filesystem_blocking(&dir).expect_err("mounted");
        let unmounted = crate::mount::unmount_blocking(&target);
        assert!(e.to_string().contains("still mounted"), "{e}");
        unmounted.expect("unmount");
        assert_eq!(std::fs::read(host.join("data")).expect("kept"), b"precious");
        assert!(dir.join("etc-hosts").exists(), "nothing removed at all");
        remove_all_one_filesystem_blocking(&dir).expect("removed once unmounted");
        assert!(!dir.exists());
    }
}
