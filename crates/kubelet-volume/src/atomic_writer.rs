//! The atomic writer (upstream `pkg/volume/util/atomic_writer.go`): projects
//! a set of files into a volume directory so that readers see either the
//! old set or the new one, never a mix.
//!
//! Layout of a target directory:
//!
//! ```text
//! <target>/..2024_01_02_03_04_05.123456789/   the real files (mode 0755)
//! <target>/..data -> ..2024_01_02_03_04_05.123456789
//! <target>/<key>  -> ..data/<key>            one per top-level entry
//! ```
//!
//! A write puts the payload in a new timestamped directory, points a
//! `..data_tmp` symlink at it and renames that over `..data` (rename is
//! atomic), then adds the user-visible links, prunes the ones no longer in
//! the payload and removes the old timestamped directory. Nothing is written
//! when the content on disk already equals the payload. Names starting with
//! `..` are reserved for the writer. Callers serialize writes to one target.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Upstream `maxFileNameLength`.
const MAX_FILE_NAME_LENGTH: usize = 255;
/// Upstream `maxPathLength`.
const MAX_PATH_LENGTH: usize = 4096;
/// The symlink to the current timestamped directory.
pub const DATA_DIR_NAME: &str = "..data";
/// The symlink renamed over [`DATA_DIR_NAME`].
pub const NEW_DATA_DIR_NAME: &str = "..data_tmp";

/// One file of a payload (upstream `FileProjection`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// The content.
    pub data: Vec<u8>,
    /// Permission bits (only `0o777` is applied, as Go's `os.FileMode`).
    pub mode: u32,
    /// Owner to give the file (projected service-account tokens when every
    /// container runs as one user); `None` leaves it to the kubelet.
    pub fs_user: Option<i64>,
}

/// Files by path relative to the volume directory.
pub type Payload = BTreeMap<String, FileProjection>;

/// Called with the new timestamped directory once the payload is written
/// there and before it becomes visible (upstream's `setPerms`, used for
/// fsGroup ownership).
pub type SetPerms = Box<dyn FnOnce(&Path) -> Result<()> + Send>;

/// Writes payloads into one target directory (upstream `AtomicWriter`).
#[derive(Debug, Clone)]
pub struct AtomicWriter {
    target_dir: PathBuf,
    log_context: String,
}

impl AtomicWriter {
    /// A writer for `target_dir`; `log_context` prefixes its log lines
    /// (upstream: `pod <ns>/<name> volume <volume>`).
    pub fn new(target_dir: impl Into<PathBuf>, log_context: impl Into<String>) -> Self {
        Self {
            target_dir: target_dir.into(),
            log_context: log_context.into(),
        }
    }

    /// [`Self::write_blocking`] on the blocking pool.
    pub async fn write(&self, payload: Payload, set_perms: Option<SetPerms>) -> Result<()> {
        let writer = self.clone();
        blocking(move || writer.write_blocking(&payload, set_perms)).await
    }

    /// Projects `payload` into the target directory, which must exist
    /// (upstream `Write`).
    pub fn write_blocking(&self, payload: &Payload, set_perms: Option<SetPerms>) -> Result<()> {
        let ctx = &self.log_context;
        let target = &self.target_dir;
        std::fs::metadata(target).map_err(Error::io("stat target directory", target))?;
        let payload = validate_payload(payload).inspect_err(|e| {
            tracing::error!("{ctx}: invalid payload: {e}");
        })?;

        let data_dir = target.join(DATA_DIR_NAME);
        let mut old_ts_dir = match std::fs::read_link(&data_dir) {
            Ok(p) => p,
            Err(e) if e.kind() == ErrorKind::NotFound => PathBuf::new(),
            Err(e) => {
                tracing::error!("{ctx}: error reading link for data directory: {e}");
                return Err(Error::io("read link", &data_dir)(e));
            }
        };
        let old_ts_path = target.join(&old_ts_dir);

        let mut to_remove = BTreeSet::new();
        let mut should_write = true;
        if !old_ts_dir.as_os_str().is_empty() {
            to_remove = paths_to_remove(&payload, &old_ts_path)?;
            if !should_write_payload(&payload, &old_ts_path)? && to_remove.is_empty() {
                tracing::debug!(
                    "{ctx}: write not required for data directory {}",
                    old_ts_dir.display()
                );
                // The user-visible links are still (re)created below.
                should_write = false;
                old_ts_dir = PathBuf::new();
            } else {
                tracing::debug!(
                    "{ctx}: write required for target directory {}",
                    target.display()
                );
            }
        }

        if should_write {
            let ts_dir = self.new_timestamp_dir()?;
            let ts_name = ts_dir.file_name().map(PathBuf::from).unwrap_or_default();
            if let Err(e) = write_payload_to_dir(&payload, &ts_dir) {
                tracing::error!(
                    "{ctx}: error writing payload to ts data directory {}: {e}",
                    ts_dir.display()
                );
                // Upstream leaves the partial directory behind; on a full
                // disk each retry would leave another, holding the space
                // the next attempt needs.
                let _ = crate::removeall::remove_all_one_filesystem_blocking(&ts_dir);
                return Err(e);
            }
            tracing::debug!(
                "{ctx}: performed write of new data to ts data directory: {}",
                ts_dir.display()
            );
            if let Some(set_perms) = set_perms
                && let Err(e) = set_perms(&ts_dir)
            {
                tracing::error!("{ctx}: error applying ownership settings: {e}");
                let _ = crate::removeall::remove_all_one_filesystem_blocking(&ts_dir);
                return Err(e);
            }
            let new_data_dir = target.join(NEW_DATA_DIR_NAME);
            // A link left by a write that died here would fail every later
            // write; it never is `..data`, so it is safe to drop.
            let _ = std::fs::remove_file(&new_data_dir);
            if let Err(e) = std::os::unix::fs::symlink(&ts_name, &new_data_dir) {
                let _ = crate::removeall::remove_all_one_filesystem_blocking(&ts_dir);
                tracing::error!("{ctx}: error creating symbolic link for atomic update: {e}");
                return Err(Error::io("create symlink", &new_data_dir)(e));
            }
            if let Err(e) = std::fs::rename(&new_data_dir, &data_dir) {
                let _ = std::fs::remove_file(&new_data_dir);
                let _ = crate::removeall::remove_all_one_filesystem_blocking(&ts_dir);
                tracing::error!(
                    "{ctx}: error renaming symbolic link for data directory {}: {e}",
                    new_data_dir.display()
                );
                return Err(Error::io("rename symlink", &new_data_dir)(e));
            }
        }

        self.create_user_visible_files(&payload).inspect_err(|e| {
            tracing::error!(
                "{ctx}: error creating visible symlinks in {}: {e}",
                target.display()
            );
        })?;
        self.remove_user_visible_paths(&to_remove)
            .inspect_err(|e| {
                tracing::error!("{ctx}: error removing old visible symlinks: {e}");
            })?;
        if !old_ts_dir.as_os_str().is_empty() {
            // Gone already is fine, as Go's `os.RemoveAll`: the swap succeeded.
            // Never through a mount someone made inside the volume.
            crate::removeall::remove_all_one_filesystem_blocking(&old_ts_path).inspect_err(
                |e| {
                    tracing::error!(
                        "{ctx}: error removing old data directory {}: {e}",
                        old_ts_dir.display()
                    );
                },
            )?;
        }
        Ok(())
    }

    /// A new `..<UTC timestamp>.<random>` directory with mode 0755 (upstream
    /// `newTimestampDir`, named as Go's `os.MkdirTemp` names).
    fn new_timestamp_dir(&self) -> Result<PathBuf> {
        let prefix = jiff::Timestamp::now()
            .strftime("..%Y_%m_%d_%H_%M_%S.")
            .to_string();
        let mut last = None;
        for _ in 0..10_000 {
            let dir = self
                .target_dir
                .join(format!("{prefix}{}", rand::random::<u32>()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    // Group and others must be able to walk the tree,
                    // whatever the umask.
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                        .map_err(Error::io("chmod", &dir))?;
                    return Ok(dir);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => last = Some((dir, e)),
                Err(e) => {
                    tracing::error!(
                        "{}: unable to create new temp directory: {e}",
                        self.log_context
                    );
                    return Err(Error::io("create directory", dir)(e));
                }
            }
        }
        let (dir, e) = last.unwrap_or_else(|| {
            (
                self.target_dir.clone(),
                std::io::Error::from(ErrorKind::AlreadyExists),
            )
        });
        Err(Error::io("create directory", dir)(e))
    }

    /// Links `<target>/<first element>` to `..data/<first element>` for each
    /// payload path that has none yet (upstream `createUserVisibleFiles`).
    fn create_user_visible_files(&self, payload: &Payload) -> Result<()> {
        for path in payload.keys() {
            let link_name = path.split('/').next().unwrap_or(path);
            let visible = self.target_dir.join(link_name);
            match std::fs::read_link(&visible) {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let to = Path::new(DATA_DIR_NAME).join(link_name);
                    std::os::unix::fs::symlink(&to, &visible)
                        .map_err(Error::io("create symlink", &visible))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes the top-level entries of `paths` from the target directory
    /// (upstream `removeUserVisiblePaths`: deeper paths go with the old
    /// timestamped directory). Every path is tried; the last error is kept.
    fn remove_user_visible_paths(&self, paths: &BTreeSet<String>) -> Result<()> {
        let mut last = Ok(());
        for p in paths.iter().filter(|p| !p.contains('/')) {
            let path = self.target_dir.join(p);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::error!(
                    "{}: error pruning old user-visible path {p}: {e}",
                    self.log_context
                );
                last = Err(Error::io("remove", path)(e));
            }
        }
        last
    }
}

/// Runs `f` on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io {
            context: "blocking task",
            path: PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        })?
}

/// Validates every path and returns the payload keyed by cleaned paths
/// (upstream `validatePayload`).
pub fn validate_payload(payload: &Payload) -> Result<Payload> {
    payload
        .iter()
        .map(|(k, v)| {
            validate_path(k)?;
            Ok((clean(k), v.clone()))
        })
        .collect()
}

/// Upstream `validatePath`: a payload path is relative, has no `..`
/// element, does not start with `..`, and fits the length limits. Errors
/// carry upstream's messages.
pub fn validate_path(target: &str) -> Result<()> {
    let invalid = |m: String| Err(Error::Invalid(m));
    if target.is_empty() {
        return invalid(format!("invalid path: must not be empty: {target:?}"));
    }
    if target.starts_with('/') {
        return invalid(format!("invalid path: must be relative path: {target}"));
    }
    if target.len() > MAX_PATH_LENGTH {
        return invalid(format!(
            "invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    for item in target.split('/') {
        if item == ".." {
            return invalid(format!("invalid path: must not contain '..': {target}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return invalid(format!(
                "invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    let first = target.split('/').next().unwrap_or("");
    if first.starts_with("..") && first.len() > 2 {
        return invalid(format!("invalid path: must not start with '..': {target}"));
    }
    Ok(())
}

use kubelet_types::path::clean;

/// Whether any payload file differs from (or is missing in) the old
/// timestamped directory (upstream `shouldWritePayload`; modes are not
/// compared, as upstream).
fn should_write_payload(payload: &Payload, old_ts_dir: &Path) -> Result<bool> {
    for (path, file) in payload {
        let full = old_ts_dir.join(path);
        match std::fs::symlink_metadata(&full) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
            _ => {}
        }
        let on_disk = std::fs::read(&full).map_err(Error::io("read", &full))?;
        if on_disk != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Paths in the old timestamped directory that neither a payload path nor a
/// parent directory of one (upstream `pathsToRemove`).
fn paths_to_remove(payload: &Payload, old_ts_dir: &Path) -> Result<BTreeSet<String>> {
    let mut current = BTreeSet::new();
    if let Err(e) = walk(old_ts_dir, "", &mut current) {
        return match e {
            Error::Io { ref source, .. } if source.kind() == ErrorKind::NotFound => {
                Ok(BTreeSet::new())
            }
            e => Err(e),
        };
    }
    let mut new = BTreeSet::new();
    for file in payload.keys() {
        let mut sub = file.as_str();
        loop {
            new.insert(sub.to_string());
            match sub.rfind('/') {
                Some(i) => sub = &sub[..i],
                None => break,
            }
        }
    }
    Ok(current.difference(&new).cloned().collect())
}

/// Every entry under `dir` (not following symlinks), relative, `/`-joined.
fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(Error::io("read directory", dir))? {
        let entry = entry.map_err(Error::io("read directory", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let is_dir = entry
            .file_type()
            .map_err(Error::io("stat", entry.path()))?
            .is_dir();
        out.insert(rel.clone());
        if is_dir {
            walk(&entry.path(), &rel, out)?;
        }
    }
    Ok(())
}

/// Writes each file under `dir`, with its mode set explicitly (whatever the
/// umask) and its owner when given (upstream `writePayloadToDir`).
/// Intermediate directories get 0755.
fn write_payload_to_dir(payload: &Payload, dir: &Path) -> Result<()> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(Error::io("create directory", parent))?;
        }
        let mode = file.mode & 0o777;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&full)
            .map_err(Error::io("create file", &full))?;
        f.write_all(&file.data).map_err(Error::io("write", &full))?;
        drop(f);
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode))
            .map_err(Error::io("chmod", &full))?;
        if let Some(uid) = file.fs_user {
            let uid = u32::try_from(uid).map_err(|_| {
                Error::Invalid(format!(
                    "unable to change file {} with owner {uid}: invalid user",
                    full.display()
                ))
            })?;
            std::os::unix::fs::chown(&full, Some(uid), None).map_err(Error::io("chown", &full))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
