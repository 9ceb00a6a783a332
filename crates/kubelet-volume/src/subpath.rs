//! subPath mounts (upstream `pkg/volume/util/subpath/subpath_linux.go` and
//! the subPath part of `kubelet_pods.go makeMounts`): the subPath is
//! opened component by component below the volume without following
//! symlinks, and the opened file (`/proc/self/fd/N`, which the pod cannot
//! re-point) is bind-mounted on
//! `<pods>/<uid>/volume-subpaths/<volume>/<container>/<index>`, which the
//! container then mounts. A missing subPath directory is created the same
//! way (`SafeMakeDir`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, open, openat};
use nix::mount::MsFlags;
use nix::sys::stat::{Mode, SFlag, fchmod, fstat, mkdirat};

use crate::mount::{blocking, is_mount_point_blocking, unmount_blocking};
use crate::{Error, Result};

/// `<pod dir>/volume-subpaths`.
const SUBPATH_DIR: &str = "volume-subpaths";

fn invalid(msg: String) -> Error {
    Error::Invalid(msg)
}

/// Validates `subpath` as `makeMounts` does (relative, no `..`).
pub fn validate_subpath(subpath: &str) -> Result<()> {
    if Path::new(subpath).is_absolute() {
        return Err(invalid(format!(
            "error SubPath `{subpath}` must not be an absolute path"
        )));
    }
    if crate::hostpath::validate_path_no_backsteps(subpath).is_err() {
        return Err(invalid(format!(
            "unable to provision SubPath `{subpath}`: must not contain '..'"
        )));
    }
    Ok(())
}

/// Resolves `subpath` inside `volume_path` safely, creating it as a
/// directory (with the volume's mode) when missing, bind-mounts it on
/// `<pods_dir>/<pod_uid>/volume-subpaths/<volume_name>/<container_name>/<index>`
/// and returns that path. A subPath reaching outside the volume (through a
/// symlink) is refused with upstream's "not within volume path".
pub async fn prepare_safe_subpath(
    volume_path: &Path,
    subpath: &str,
    pods_dir: &Path,
    pod_uid: &str,
    volume_name: &str,
    container_name: &str,
    index: usize,
) -> Result<PathBuf> {
    validate_subpath(subpath)?;
    let volume = volume_path.to_path_buf();
    let sub = subpath.to_string();
    let target = pods_dir
        .join(pod_uid)
        .join(SUBPATH_DIR)
        .join(volume_name)
        .join(container_name)
        .join(index.to_string());
    let (volume_name, container_name) = (volume_name.to_string(), container_name.to_string());
    blocking(move || {
        let host_path = volume.join(&sub);
        if std::fs::metadata(&host_path).is_err() {
            let perm = std::fs::metadata(&volume)
                .map_err(Error::io("stat", &volume))?
                .mode()
                & 0o7777;
            if let Err(e) = safe_make_dir_blocking(&sub, &volume, perm) {
                tracing::error!(error = %e, container = %container_name, volume = %volume_name, "failed to create subPath directory");
                return Err(invalid(format!(
                    "failed to create subPath directory for volumeMount {volume_name:?} of container {container_name:?}"
                )));
            }
        }
        bind_subpath(&volume, &host_path, &target)
    })
    .await
}

/// Upstream `doBindSubPath`.
fn bind_subpath(volume: &Path, path: &Path, target: &Path) -> Result<PathBuf> {
    let volume = std::fs::canonicalize(volume).map_err(|e| {
        invalid(format!(
            "error resolving symlinks in {:?}: {e}",
            volume.display().to_string()
        ))
    })?;
    let path = std::fs::canonicalize(path).map_err(|e| {
        invalid(format!(
            "error resolving symlinks in {:?}: {e}",
            path.display().to_string()
        ))
    })?;
    if !path.starts_with(&volume) {
        return Err(invalid(format!(
            "subpath {:?} not within volume path {:?}",
            path.display().to_string(),
            volume.display().to_string()
        )));
    }
    let fd = safe_open(&path, &volume)
        .map_err(|e| invalid(format!("error opening subpath {}: {e}", path.display())))?;
    if prepare_target(&path, target)? {
        return Ok(target.to_path_buf());
    }
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if let Err(e) = nix::mount::mount(
        Some(source.as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        let _ = remove_target(target);
        return Err(invalid(format!("error mounting {}: {e}", path.display())));
    }
    tracing::debug!(subpath = %path.display(), target = %target.display(), "bound subPath");
    Ok(target.to_path_buf())
}

/// Upstream `prepareSubpathTarget`: true when `target` already has `path`
/// mounted; otherwise an empty directory (0750) or file (0640) to mount on.
fn prepare_target(path: &Path, target: &Path) -> Result<bool> {
    if is_mount_point_blocking(target)? {
        let same = match (
            std::fs::symlink_metadata(path),
            std::fs::symlink_metadata(target),
        ) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if same {
            return Ok(true);
        }
        unmount_blocking(target)?;
    }
    if let Some(parent) = target.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(Error::io("create directory", parent))?;
    }
    let md = std::fs::symlink_metadata(path).map_err(Error::io("lstat", path))?;
    if md.is_dir() {
        match std::fs::DirBuilder::new().mode(0o750).create(target) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(Error::io("create directory", target)(e));
            }
            _ => {}
        }
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o640)
            .open(target)
            .map_err(Error::io("create file", target))?;
    }
    Ok(false)
}

/// Upstream `doSafeOpen`: opens `path` (symlinks resolved, inside `base`)
/// one component at a time from `base`, refusing any symlink; the result
/// is an `O_PATH` descriptor.
fn safe_open(path: &Path, base: &Path) -> std::result::Result<OwnedFd, String> {
    let rel = path.strip_prefix(base).map_err(|_| {
        format!(
            "path {} is outside of allowed base {}",
            path.display(),
            base.display()
        )
    })?;
    let mut fd = open(
        base,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open directory {}: {e}", base.display()))?;
    let mut current = base.to_path_buf();
    for seg in rel.components() {
        let Component::Normal(seg) = seg else {
            return Err(format!(
                "path {} is outside of allowed base {}",
                path.display(),
                base.display()
            ));
        };
        current.push(seg);
        let child = openat(
            &fd,
            seg,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", current.display()))?;
        let st = fstat(&child)
            .map_err(|e| format!("error running fstat on {} with {e}", current.display()))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
            return Err(format!("unexpected symlink found {}", current.display()));
        }
        fd = child;
    }
    Ok(fd)
}

/// Creates `subdir` (relative) inside `base` with mode `perm`, each new
/// component made with `mkdirat` and opened without following symlinks so
/// the pod cannot redirect it (upstream `SafeMakeDir`).
pub async fn safe_make_dir(base: &Path, subdir: &str, perm: u32) -> Result<()> {
    validate_subpath(subdir)?;
    let (base, subdir) = (base.to_path_buf(), subdir.to_string());
    blocking(move || safe_make_dir_blocking(&subdir, &base, perm)).await
}

/// [`safe_make_dir`], on the calling thread.
fn safe_make_dir_blocking(subdir: &str, base: &Path, perm: u32) -> Result<()> {
    let base = std::fs::canonicalize(base).map_err(|e| {
        invalid(format!(
            "error resolving symlinks in {}: {e}",
            base.display()
        ))
    })?;
    let full = base.join(subdir);
    if let Ok(md) = std::fs::metadata(&full) {
        if md.is_dir() {
            return Ok(());
        }
        return Err(Error::io("mkdir", &full)(nix::errno::Errno::ENOTDIR.into()));
    }
    let (existing, to_create) = find_existing_prefix(&base, subdir)?;
    let existing_real = std::fs::canonicalize(&existing).map_err(|e| {
        invalid(format!(
            "error opening directory {}: {e}",
            existing.display()
        ))
    })?;
    if !existing_real.starts_with(&base) {
        return Err(invalid(format!(
            "path {} is outside of allowed base {}",
            existing_real.display(),
            base.display()
        )));
    }
    let mut parent = safe_open(&existing_real, &base)
        .map_err(|e| invalid(format!("cannot open directory {}: {e}", existing.display())))?;
    let mut current = existing_real;
    for dir in to_create {
        current.push(&dir);
        mkdirat(&parent, dir.as_str(), Mode::from_bits_truncate(perm)).map_err(|e| {
            invalid(format!(
                "cannot create directory {}: {e}",
                current.display()
            ))
        })?;
        let child = openat(
            &parent,
            dir.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| invalid(format!("cannot open {}: {e}", current.display())))?;
        fchmod(&child, Mode::from_bits_truncate(perm)).map_err(|e| {
            invalid(format!(
                "chmod {:?} failed: {e}",
                current.display().to_string()
            ))
        })?;
        parent = child;
    }
    Ok(())
}

/// Upstream `findExistingPrefix`: the longest existing prefix of
/// `base/subdir` (opened with symlinks followed, as upstream) and the
/// components still to create.
fn find_existing_prefix(base: &Path, subdir: &str) -> Result<(PathBuf, Vec<String>)> {
    let dirs: Vec<String> = Path::new(subdir)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    let mut fd = open(base, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| invalid(format!("error opening {}: {e}", base.display())))?;
    let mut current = base.to_path_buf();
    for (i, dir) in dirs.iter().enumerate() {
        match openat(
            &fd,
            dir.as_str(),
            OFlag::O_PATH | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(child) => fd = child,
            Err(nix::errno::Errno::ENOENT) => return Ok((current, dirs[i..].to_vec())),
            Err(e) => {
                return Err(invalid(format!(
                    "error opening directory {}: {e}",
                    current.join(dir).display()
                )));
            }
        }
        current.push(dir);
    }
    Ok((current, Vec::new()))
}

/// Unmounts and removes every subPath mount of pod `pod_uid`
/// (`<pods_dir>/<uid>/volume-subpaths`, upstream `CleanSubPaths` for all
/// volumes); never deletes through a mount.
pub async fn clean_subpaths(pods_dir: &Path, pod_uid: &str) -> Result<()> {
    let root = pods_dir.join(pod_uid).join(SUBPATH_DIR);
    blocking(move || {
        for volume in read_dir_or_empty(&root)? {
            clean_volume_blocking(&volume)?;
        }
        remove_dir_if_present(&root)
    })
    .await
}

/// Unmounts and removes the subPath mounts of one volume of pod `pod_uid`
/// (`<pods_dir>/<uid>/volume-subpaths/<volume_name>`, upstream
/// `CleanSubPaths`, run before the volume is torn down), and the
/// `volume-subpaths` directory when it is left empty.
pub async fn clean_volume_subpaths(
    pods_dir: &Path,
    pod_uid: &str,
    volume_name: &str,
) -> Result<()> {
    let root = pods_dir.join(pod_uid).join(SUBPATH_DIR);
    let volume = root.join(volume_name);
    blocking(move || {
        clean_volume_blocking(&volume)?;
        match std::fs::remove_dir(&root) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", root)(e)),
            _ => Ok(()),
        }
    })
    .await
}

/// `volume-subpaths/<volume>`: each container's targets, then the
/// directories.
fn clean_volume_blocking(volume: &Path) -> Result<()> {
    for container in read_dir_or_empty(volume)? {
        if !container.is_dir() || is_mount_point_blocking(&container)? {
            continue;
        }
        for entry in read_dir_or_empty(&container)? {
            remove_target(&entry)?;
        }
        std::fs::remove_dir(&container).map_err(Error::io("remove", &container))?;
    }
    remove_dir_if_present(volume)
}

fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", dir)(e)),
        _ => Ok(()),
    }
}

fn read_dir_or_empty(dir: &Path) -> Result<Vec<PathBuf>> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io("read directory", dir)(e)),
        Ok(it) => it
            .map(|e| {
                e.map(|e| e.path())
                    .map_err(Error::io("read directory", dir))
            })
            .collect(),
    }
}

/// Unmounts one subPath target and removes the (then empty) mount point.
fn remove_target(target: &Path) -> Result<()> {
    unmount_blocking(target)?;
    if is_mount_point_blocking(target)? {
        return Err(invalid(format!("{} is still mounted", target.display())));
    }
    let Ok(md) = std::fs::symlink_metadata(target) else {
        return Ok(());
    };
    if md.is_dir() {
        std::fs::remove_dir(target).map_err(Error::io("remove", target))
    } else {
        std::fs::remove_file(target).map_err(Error::io("remove", target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Setup {
        _tmp: tempfile::TempDir,
        volume: PathBuf,
        pods: PathBuf,
        outside: PathBuf,
    }

    fn setup() -> Setup {
        let tmp = tempfile::tempdir().expect("tempdir");
        let volume = tmp
            .path()
            .join("pods/uid/volumes/kubernetes.io~empty-dir/v");
        std::fs::create_dir_all(volume.join("dir")).expect("mkdir");
        std::fs::write(volume.join("dir/file"), b"inside").expect("write");
        let outside = tmp.path().join("secret");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("file"), b"outside").expect("write");
        Setup {
            pods: tmp.path().join("pods"),
            volume,
            outside,
            _tmp: tmp,
        }
    }

    async fn prepare(s: &Setup, sub: &str, index: usize) -> Result<PathBuf> {
        prepare_safe_subpath(&s.volume, sub, &s.pods, "uid", "v", "c", index).await
    }

    #[tokio::test]
    async fn a_directory_and_a_file_are_bind_mounted_then_cleaned() {
        let s = setup();
        let d = prepare(&s, "dir", 0).await.expect("dir");
        assert_eq!(d, s.pods.join("uid/volume-subpaths/v/c/0"));
        assert!(is_mount_point_blocking(&d).expect("mountinfo"));
        assert_eq!(std::fs::read(d.join("file")).expect("read"), b"inside");
        assert_eq!(
            prepare(&s, "dir", 0).await.expect("again"),
            d,
            "already mounted"
        );
        let f = prepare(&s, "dir/file", 1).await.expect("file");
        assert_eq!(std::fs::read(&f).expect("read"), b"inside");
        let other = prepare_safe_subpath(&s.volume, "dir", &s.pods, "uid", "w", "c", 0)
            .await
            .expect("another volume");
        clean_volume_subpaths(&s.pods, "uid", "w")
            .await
            .expect("clean one volume");
        assert!(!other.exists() && !s.pods.join("uid/volume-subpaths/w").exists());
        assert!(
            is_mount_point_blocking(&d).expect("mountinfo"),
            "other volumes untouched"
        );
        clean_subpaths(&s.pods, "uid").await.expect("clean");
        assert!(!s.pods.join("uid/volume-subpaths").exists());
        assert_eq!(
            std::fs::read(s.volume.join("dir/file")).expect("kept"),
            b"inside"
        );
    }

    #[tokio::test]
    async fn a_symlink_out_of_the_volume_is_refused() {
        let s = setup();
        std::os::unix::fs::symlink(&s.outside, s.volume.join("escape")).expect("symlink");
        let e = prepare(&s, "escape", 0)
            .await
            .expect_err("escape")
            .to_string();
        assert!(e.contains("not within volume path"), "{e}");
        let e = prepare(&s, "escape/file", 1)
            .await
            .expect_err("escape")
            .to_string();
        assert!(e.contains("not within volume path"), "{e}");
        assert!(
            !s.pods.join("uid/volume-subpaths/v/c/0").exists(),
            "no target made"
        );
    }

    #[test]
    fn a_symlink_component_is_refused_by_the_safe_open() {
        let s = setup();
        std::os::unix::fs::symlink("dir", s.volume.join("inner")).expect("symlink");
        let e = safe_open(&s.volume.join("inner/file"), &s.volume).expect_err("symlink");
        assert!(e.starts_with("unexpected symlink found"), "{e}");
    }

    #[tokio::test]
    async fn absolute_and_backstep_subpaths_are_refused() {
        let s = setup();
        assert_eq!(
            prepare(&s, "/etc", 0)
                .await
                .expect_err("absolute")
                .to_string(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            prepare(&s, "dir/../../x", 0)
                .await
                .expect_err("backstep")
                .to_string(),
            "unable to provision SubPath `dir/../../x`: must not contain '..'"
        );
    }

    #[tokio::test]
    async fn a_missing_subpath_is_created_with_the_volume_mode() {
        let s = setup();
        std::fs::set_permissions(&s.volume, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let d = prepare(&s, "new/deeper", 0).await.expect("created");
        assert!(is_mount_point_blocking(&d).expect("mountinfo"));
        let md = std::fs::metadata(s.volume.join("new/deeper")).expect("created");
        assert_eq!(md.permissions().mode() & 0o7777, 0o777);
        clean_subpaths(&s.pods, "uid").await.expect("clean");
    }

    #[tokio::test]
    async fn safe_make_dir_does_not_create_through_a_symlink() {
        let s = setup();
        std::os::unix::fs::symlink(&s.outside, s.volume.join("escape")).expect("symlink");
        let e = safe_make_dir(&s.volume, "escape/new", 0o755)
            .await
            .expect_err("escape")
            .to_string();
        assert!(e.contains("outside of allowed base"), "{e}");
        assert!(!s.outside.join("new").exists());
        safe_make_dir(&s.volume, "a/b", 0o750)
            .await
            .expect("inside");
        assert!(s.volume.join("a/b").is_dir());
    }
}
