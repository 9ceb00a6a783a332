//! fsGroup ownership of a volume (upstream `pkg/volume/volume_linux.go`
//! `SetVolumeOwnership`): every file and directory under the volume gets
//! the pod's `fsGroup` as its group and group read/write (read-only
//! volumes: group read), directories also group search and the setgid bit
//! so that new files inherit the group. Symlinks are re-grouped but never
//! followed or chmod-ed. `fsGroupChangePolicy: OnRootMismatch` skips the
//! walk when the root already has the group and the bits.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::mount::blocking;
use crate::{Error, Result};

/// Group read/write, for writable volumes (upstream `rwMask`).
const RW_MASK: u32 = 0o660;
/// Group read, for read-only volumes (upstream `roMask`).
const RO_MASK: u32 = 0o440;
/// Search on directories (upstream `execMask`).
const EXEC_MASK: u32 = 0o110;
/// The setgid bit.
const SETGID: u32 = 0o2000;

/// After this long a warning says the volume has many files (as upstream's
/// timer, pointing at kubernetes/kubernetes#69699).
const SLOW_WARNING: Duration = Duration::from_secs(30);

/// The `fsGroupChangePolicy` that skips the walk when the root matches.
pub const ON_ROOT_MISMATCH: &str = "OnRootMismatch";

/// Sets the group of everything under `dir` to `fs_group` with group
/// read/write (a writable volume: emptyDir, local PV). Nothing is done
/// without an fsGroup.
pub async fn set_volume_ownership(
    dir: &Path,
    fs_group: Option<i64>,
    change_policy: Option<&str>,
) -> Result<()> {
    set_volume_ownership_with(dir, fs_group, change_policy, false).await
}

/// [`set_volume_ownership`], for a volume whose attributes are `read_only`
/// (upstream `GetAttributes().ReadOnly`: configMap, secret, downwardAPI,
/// projected and read-only local PVs), which gets group read only.
pub async fn set_volume_ownership_with(
    dir: &Path,
    fs_group: Option<i64>,
    change_policy: Option<&str>,
    read_only: bool,
) -> Result<()> {
    let Some(gid) = fs_group else {
        return Ok(());
    };
    let gid = u32::try_from(gid)
        .map_err(|_| Error::Invalid(format!("invalid fsGroup {gid}: not a group id")))?;
    let on_root_mismatch = change_policy == Some(ON_ROOT_MISMATCH);
    let root = dir.to_path_buf();
    let work = blocking(move || {
        if on_root_mismatch && !requires_permission_change(&root, gid, read_only) {
            tracing::debug!(path = %root.display(), "skipping permission and ownership change for volume");
            return Ok(());
        }
        walk(&root, gid, read_only)
    });
    tokio::pin!(work);
    tokio::select! {
        r = &mut work => return r,
        () = tokio::time::sleep(SLOW_WARNING) => {
            tracing::warn!(
                path = %dir.display(),
                "setting volume ownership for {} and fsGroup set; if the volume has a lot of files then \
                 setting volume ownership could be slow, see https://github.com/kubernetes/kubernetes/issues/69699",
                dir.display()
            );
        }
    }
    work.await
}

/// Whether the root lacks the group or the bits (upstream
/// `requiresPermissionChange`); any doubt means yes.
fn requires_permission_change(root: &Path, gid: u32, read_only: bool) -> bool {
    let Ok(md) = std::fs::metadata(root) else {
        return true;
    };
    if md.gid() != gid || !md.is_dir() {
        return true;
    }
    let want = if read_only { RO_MASK } else { RW_MASK } | EXEC_MASK;
    let mode = md.mode();
    mode & want != want || mode & SETGID == 0
}

/// Walks `root` depth-first without following symlinks, changing each
/// entry. Failures to chown or chmod one entry are logged and skipped, as
/// upstream; failures to read a directory end the walk.
fn walk(root: &Path, gid: u32, read_only: bool) -> Result<()> {
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let md = std::fs::symlink_metadata(&path).map_err(Error::io("lstat", &path))?;
        change_file_permission(&path, &md, gid, read_only);
        if md.is_dir() {
            let entries = std::fs::read_dir(&path).map_err(Error::io("read directory", &path))?;
            for entry in entries {
                let entry = entry.map_err(Error::io("read directory", &path))?;
                stack.push(entry.path());
            }
        }
    }
    Ok(())
}

/// Upstream `changeFilePermission`: lchown the group, then (not for
/// symlinks, whose chmod would change their target) add the mask to the
/// mode read before the chown (which may clear setuid/setgid).
fn change_file_permission(path: &Path, md: &std::fs::Metadata, gid: u32, read_only: bool) {
    if let Err(e) = std::os::unix::fs::lchown(path, None, Some(gid)) {
        tracing::error!(path = %path.display(), error = %e, "lchown failed");
    }
    if md.file_type().is_symlink() {
        return;
    }
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if md.is_dir() {
        mask |= SETGID | EXEC_MASK;
    }
    let mode = (md.mode() & 0o7777) | mask;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        tracing::error!(path = %path.display(), error = %e, "chmod failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).expect("lstat").mode() & 0o7777
    }
    fn gid(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).expect("lstat").gid()
    }

    #[tokio::test]
    async fn files_and_dirs_get_the_group_and_bits_symlink_targets_do_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("vol");
        std::fs::create_dir_all(vol.join("sub")).expect("mkdir");
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::set_permissions(vol.join("sub"), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let file = vol.join("sub/f");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"y").expect("write");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::symlink(&outside, vol.join("link")).expect("symlink");

        set_volume_ownership(&vol, Some(1234), None)
            .await
            .expect("ownership");

        assert_eq!(gid(&vol), 1234);
        assert_eq!(mode(&vol), 0o2770);
        assert_eq!(mode(&vol.join("sub")), 0o2770);
        assert_eq!(gid(&file), 1234);
        assert_eq!(mode(&file), 0o660);
        assert_eq!(
            gid(&vol.join("link")),
            1234,
            "the symlink itself is re-grouped"
        );
        assert_eq!(gid(&outside), 0, "the symlink's target is untouched");
        assert_eq!(mode(&outside), 0o600);
    }

    #[tokio::test]
    async fn read_only_volumes_get_group_read_and_none_without_fs_group() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).expect("mkdir");
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let file = vol.join("f");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");

        set_volume_ownership(&vol, None, None).await.expect("no-op");
        assert_eq!(mode(&file), 0o600);

        set_volume_ownership_with(&vol, Some(55), None, true)
            .await
            .expect("ownership");
        assert_eq!(mode(&vol), 0o2750);
        assert_eq!(mode(&file), 0o640);
        assert_eq!(gid(&file), 55);
    }

    #[tokio::test]
    async fn on_root_mismatch_skips_when_the_root_matches() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).expect("mkdir");
        let file = vol.join("f");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::lchown(&vol, None, Some(77)).expect("chown");
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o2770)).expect("chmod");

        set_volume_ownership(&vol, Some(77), Some(ON_ROOT_MISMATCH))
            .await
            .expect("skip");
        assert_eq!(gid(&file), 0, "root matched: nothing below is changed");

        set_volume_ownership(&vol, Some(78), Some(ON_ROOT_MISMATCH))
            .await
            .expect("walk");
        assert_eq!(gid(&file), 78, "root mismatched: the walk ran");
        assert_eq!(mode(&file), 0o660);
    }
}
