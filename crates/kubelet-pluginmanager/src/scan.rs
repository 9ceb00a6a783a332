//! The plugin watcher's view of the registry directory (upstream
//! `pluginwatcher.Watcher`: `init`, `traversePluginDir`, `handleCreateEvent`):
//! the directory is created when missing, walked with its subdirectories,
//! and every unix socket whose name does not start with `.` is a plugin
//! registration socket. Each socket is known by its identity (device, inode,
//! change time), so a socket removed and created again at the same path (a
//! restarted plugin) is a new registration, as upstream's timestamp in the
//! desired state of the world.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tracing::{debug, warn};

use crate::error::Error;

/// Mode of the registry directory when the kubelet creates it.
pub const REGISTRY_DIR_MODE: u32 = 0o750;

/// Which file a registration socket path names right now: a plugin that
/// binds its socket again gets a new identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketIdentity {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl SocketIdentity {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

/// Creates the registry directory (with its parents) when it is missing.
/// Blocking: call it off the async runtime.
pub fn ensure_dir(dir: &Path) -> Result<(), Error> {
    let created = !dir.exists();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(REGISTRY_DIR_MODE)
        .create(dir)
        .map_err(|error| Error::CreateRoot {
            path: dir.to_path_buf(),
            error,
        })?;
    if created {
        // The umask may have taken bits away; the mode is the kubelet's.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(REGISTRY_DIR_MODE)).map_err(
            |error| Error::CreateRoot {
                path: dir.to_path_buf(),
                error,
            },
        )?;
    }
    Ok(())
}

/// Walks `dir` and its subdirectories (never following symbolic links) and
/// returns every registration socket in it, calling `entering` with each
/// directory before listing it (the watch adds it there). `Err` only when
/// `dir` itself cannot be read; an unreadable subdirectory is logged and
/// skipped. Blocking: call it off the async runtime.
pub fn scan(
    dir: &Path,
    entering: impl Fn(&Path),
) -> std::io::Result<HashMap<PathBuf, SocketIdentity>> {
    let mut found = HashMap::new();
    let mut pending = vec![dir.to_path_buf()];
    let mut root = true;
    while let Some(current) = pending.pop() {
        entering(&current);
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(e) if root => return Err(e),
            Err(error) => {
                warn!(path = %current.display(), %error, "Error accessing path");
                continue;
            }
        };
        root = false;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.as_encoded_bytes().starts_with(b".") {
                debug!(path = %entry.path().display(), "Ignoring file (starts with '.')");
                continue;
            }
            let path = entry.path();
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                // Gone between the listing and the stat.
                Err(_) => continue,
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_socket() {
                found.insert(path, SocketIdentity::of(&meta));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sockets_in_subdirectories_and_skips_dot_files_and_regular_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("plugins_registry");
        ensure_dir(&root).expect("ensure");
        let mode = std::fs::metadata(&root).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        std::fs::create_dir(root.join(".hidden")).expect("mkdir");
        let _a = std::os::unix::net::UnixListener::bind(root.join("a.sock")).expect("bind");
        let _b = std::os::unix::net::UnixListener::bind(root.join("sub/b.sock")).expect("bind");
        let _c = std::os::unix::net::UnixListener::bind(root.join(".c.sock")).expect("bind");
        let _d = std::os::unix::net::UnixListener::bind(root.join(".hidden/d.sock")).expect("bind");
        std::fs::write(root.join("e.sock"), b"not a socket").expect("write");

        let found = scan(&root, |_| {}).expect("scan");
        let mut paths: Vec<_> = found.keys().cloned().collect();
        paths.sort();
        assert_eq!(paths, vec![root.join("a.sock"), root.join("sub/b.sock")]);
    }

    #[test]
    fn a_socket_bound_again_has_a_new_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.sock");
        let first = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let before = scan(dir.path(), |_| {}).expect("scan")[&path];
        assert_eq!(scan(dir.path(), |_| {}).expect("scan")[&path], before);
        drop(first);
        std::fs::remove_file(&path).expect("rm");
        std::thread::sleep(std::time::Duration::from_millis(10));
        let _second = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        assert_ne!(scan(dir.path(), |_| {}).expect("scan")[&path], before);
    }

    #[test]
    fn a_missing_root_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(scan(&dir.path().join("absent"), |_| {}).is_err());
    }
}
