//! Mount helpers (upstream `k8s.io/mount-utils` on Linux): tmpfs, bind
//! mounts, unmount, and whether a path is a mount point, from
//! `/proc/self/mountinfo`. All of it is blocking and runs on the blocking pool.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::{Error, Result};

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

/// Mounts a tmpfs on `path` (created if missing), of `size_bytes` when
/// given, with `mode` on its root (upstream mounts Memory emptyDirs and
/// secret volumes this way).
pub async fn mount_tmpfs(path: &Path, size_bytes: Option<u64>, mode: u32) -> Result<()> {
    let path = path.to_path_buf();
    blocking(move || {
        std::fs::create_dir_all(&path).map_err(Error::io("create mount point", &path))?;
        if is_mount_point_blocking(&path)? {
            return Ok(());
        }
        let mut data = format!("mode={mode:o}");
        if let Some(size) = size_bytes {
            data.push_str(&format!(",size={size}"));
        }
        // Memory-backed volumes never go to swap (upstream adds `noswap`
        // where the kernel knows it).
        if tmpfs_noswap_supported() {
            data.push_str(",noswap");
        }
        nix::mount::mount(
            Some("tmpfs"),
            &path,
            Some("tmpfs"),
            MsFlags::empty(),
            Some(data.as_str()),
        )
        .map_err(|source| Error::Mount {
            context: "mount tmpfs on",
            path: path.clone(),
            source,
        })
    })
    .await
}

/// Whether tmpfs takes `noswap` (Linux 6.4 and later), as upstream's
/// `IsTmpfsNoswapOptionSupported`.
pub(crate) fn tmpfs_noswap_supported() -> bool {
    let Ok(uts) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = uts.release().to_string_lossy().into_owned();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 4)
}

/// Bind-mounts `source` on `target` (created if missing), read-only when
/// asked (a second remount, as Linux needs).
pub async fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<()> {
    let (source, target) = (source.to_path_buf(), target.to_path_buf());
    blocking(move || bind_mount_blocking(&source, &target, read_only)).await
}

/// [`bind_mount`], on the calling thread.
pub fn bind_mount_blocking(source: &Path, target: &Path, read_only: bool) -> Result<()> {
    if !target.exists() {
        if source.is_dir() {
            std::fs::create_dir_all(target).map_err(Error::io("create mount point", target))?;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(Error::io("create directory", parent))?;
            }
            std::fs::File::create(target).map_err(Error::io("create mount point", target))?;
        }
    }
    if is_mount_point_blocking(target)? {
        return Ok(());
    }
    let mount = |flags: MsFlags| {
        nix::mount::mount(Some(source), target, None::<&str>, flags, None::<&str>).map_err(|e| {
            Error::Mount {
                context: "bind mount on",
                path: target.to_path_buf(),
                source: e,
            }
        })
    };
    mount(MsFlags::MS_BIND)?;
    if read_only {
        mount(MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY)?;
    }
    Ok(())
}

/// Unmounts `path` if it is a mount point (all stacked mounts); a path that
/// is not mounted, or does not exist, is fine.
pub async fn unmount(path: &Path) -> Result<()> {
    let path = path.to_path_buf();
    blocking(move || unmount_blocking(&path)).await
}

/// [`unmount`], on the calling thread.
pub fn unmount_blocking(path: &Path) -> Result<()> {
    while path.exists() && is_mount_point_blocking(path)? {
        nix::mount::umount2(path, MntFlags::empty()).map_err(|source| Error::Mount {
            context: "unmount",
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// Mounts a file system of type `fstype` from `source` on `target` with
/// the option string `data` (upstream `mounter.MountSensitiveWithoutSystemd`),
/// on the calling thread.
pub fn mount_blocking(source: &str, target: &Path, fstype: &str, data: &str) -> Result<()> {
    nix::mount::mount(
        Some(source),
        target,
        Some(fstype),
        MsFlags::empty(),
        (!data.is_empty()).then_some(data),
    )
    .map_err(|source| Error::Mount {
        context: "mount",
        path: target.to_path_buf(),
        source,
    })
}

/// The mount points at `dir` or below it, from `/proc/self/mountinfo`
/// (what a recursive delete of `dir` would reach through). A missing `dir`
/// has none; any other failure to resolve it (`EACCES`, `ELOOP`) is an
/// error, never "nothing mounted".
pub fn mounts_under_blocking(dir: &Path) -> Result<Vec<PathBuf>> {
    let canonical = match std::fs::canonicalize(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.map_err(Error::io("resolve", dir))?,
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(Error::io("read", "/proc/self/mountinfo"))?;
    Ok(mount_points(&info)
        .map(PathBuf::from)
        .filter(|m| m.starts_with(&canonical))
        .collect())
}

/// The other mount points showing the same directory of the same file
/// system as the mount point `path` (upstream `GetMountRefs`: same
/// `major:minor` and root in `/proc/self/mountinfo`), e.g. other pods'
/// bind mounts of one local PV.
pub fn mount_refs_blocking(path: &Path) -> Result<Vec<PathBuf>> {
    let Ok(canonical) = std::fs::canonicalize(path) else {
        return Ok(Vec::new());
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(Error::io("read", "/proc/self/mountinfo"))?;
    let entries: Vec<(String, String, PathBuf)> = info
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?.to_string();
            let root = unescape(f.next()?);
            let mp = PathBuf::from(unescape(f.next()?));
            Some((dev, root, mp))
        })
        .collect();
    let Some((dev, root, _)) = entries.iter().rev().find(|e| e.2 == canonical) else {
        return Ok(Vec::new());
    };
    Ok(entries
        .iter()
        .filter(|e| &e.0 == dev && &e.1 == root && e.2 != canonical)
        .map(|e| e.2.clone())
        .collect())
}

/// [`fs_type`], on the calling thread.
pub fn fs_type_blocking(path: &Path) -> Result<Option<String>> {
    let Ok(canonical) = std::fs::canonicalize(path) else {
        return Ok(None);
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(Error::io("read", "/proc/self/mountinfo"))?;
    Ok(info.lines().rev().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mp = unescape(pre.split(' ').nth(4)?);
        (Path::new(&mp) == canonical).then(|| post.split(' ').next().unwrap_or("").to_string())
    }))
}

/// Whether `path` is a mount point, from `/proc/self/mountinfo`.
pub async fn is_mount_point(path: &Path) -> Result<bool> {
    let path = path.to_path_buf();
    blocking(move || is_mount_point_blocking(&path)).await
}

/// [`is_mount_point`], on the calling thread.
pub fn is_mount_point_blocking(path: &Path) -> Result<bool> {
    let Ok(canonical) = std::fs::canonicalize(path) else {
        return Ok(false);
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(Error::io("read", "/proc/self/mountinfo"))?;
    Ok(mount_points(&info).any(|m| Path::new(&m) == canonical))
}

/// The file system type mounted at `path`, if it is a mount point.
pub async fn fs_type(path: &Path) -> Result<Option<String>> {
    let path = path.to_path_buf();
    blocking(move || fs_type_blocking(&path)).await
}

/// Mount points listed in a mountinfo text (field 5, octal escapes undone).
fn mount_points(info: &str) -> impl Iterator<Item = String> + '_ {
    info.lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape))
}

/// Undoes mountinfo's `\040`-style octal escapes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        let info = "36 35 98:0 /mnt1 /mnt\\040two rw,noatime master:1 - ext3 /dev/root rw\n";
        assert_eq!(mount_points(info).collect::<Vec<_>>(), vec!["/mnt two"]);
    }

    #[test]
    fn mounts_under_an_unresolvable_directory_is_an_error_not_none() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::os::unix::fs::symlink(&b, &a).expect("symlink");
        std::os::unix::fs::symlink(&a, &b).expect("symlink");
        let e = mounts_under_blocking(&a.join("pods")).expect_err("a symlink loop");
        assert!(e.to_string().starts_with("resolve"), "{e}");
        let none = mounts_under_blocking(&tmp.path().join("missing")).expect("missing");
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn tmpfs_mounts_and_unmounts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t");
        mount_tmpfs(&p, Some(1 << 20), 0o777).await.expect("mount");
        assert!(is_mount_point(&p).await.expect("mountinfo"));
        assert_eq!(fs_type(&p).await.expect("type").as_deref(), Some("tmpfs"));
        unmount(&p).await.expect("unmount");
        assert!(!is_mount_point(&p).await.expect("mountinfo"));
    }
}
