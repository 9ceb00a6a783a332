//! Removing a directory tree without ever leaving its file system (upstream
//! `pkg/util/removeall`: `RemoveAllOneFilesystem`, `RemoveDirsOneFilesystem`).
//!
//! A plain recursive delete walks into whatever is mounted below the
//! directory (a subPath bind mount of a hostPath, a local PV) and deletes
//! the host's files. Here nothing is removed when anything is mounted at or
//! under the directory (`/proc/self/mountinfo`, which also sees bind mounts
//! of the same file system). Should a mount or a symlink appear meanwhile,
//! the walk still never crosses it: it goes by file descriptor, opening each
//! child directory relative to its parent with `openat2(RESOLVE_NO_XDEV |
//! RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` (any mount point, a same-file-system
//! bind mount included, is refused with `EXDEV`), reading entries from the
//! descriptor and removing them with `unlinkat` relative to it. Without
//! `openat2` (kernels before 5.6) a child is opened `O_NOFOLLOW` and refused
//! when its mount id differs from its parent's. Symlinks are removed, never
//! followed. All of it is blocking.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

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
        return remove_leaf_path(path, dirs_only);
    }
    // Check the canonical path: mountinfo lists canonical mount points.
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
    walk(&root, dirs_only)
}

/// How many directory levels below the root the walk descends. Each level
/// holds its directory open, so this also bounds the descriptors one walk
/// holds. Names are relative, so nothing else stops the walk at `PATH_MAX`,
/// and a container can `mkdir -p` far deeper: such a tree is refused with an
/// error, nothing below the limit removed (the tear-down fails and retries).
const MAX_DEPTH: usize = 512;

/// Removes the directory `root` (already resolved, not a symlink) and
/// everything below it by descriptor, refusing any mount crossing.
fn walk(root: &Path, dirs_only: bool) -> Result<()> {
    walk_limited(root, dirs_only, MAX_DEPTH)
}

fn walk_limited(root: &Path, dirs_only: bool, max_depth: usize) -> Result<()> {
    let fd = match nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Err(Errno::ENOENT) => return Ok(()),
        r => r.map_err(mount_err("open", root))?,
    };
    clear_tree(fd, root, dirs_only, max_depth)?;
    match std::fs::remove_dir(root) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", root)(e)),
        _ => Ok(()),
    }
}

/// A directory's entries (name, `readdir`'s type hint), the next one last.
type Entries = Vec<(CString, Option<Type>)>;

/// One open directory of the walk.
struct Frame {
    dir: Dir,
    /// Its name in the directory below it on the stack (empty for the root).
    name: CString,
    /// Its entries not yet removed.
    entries: Entries,
}

/// Removes everything in the directory open at `fd` (`root` names it),
/// never leaving its mount and never more than `max_depth` levels down.
/// Depth first, with the open directories on a heap stack rather than the
/// call stack; a path is built only for an error.
fn clear_tree(fd: OwnedFd, root: &Path, dirs_only: bool, max_depth: usize) -> Result<()> {
    let (dir, entries) = read_dir(fd, &|| root.to_path_buf())?;
    let mut stack = vec![Frame {
        dir,
        name: CString::default(),
        entries,
    }];
    while let Some(top) = stack.last_mut() {
        let Some((name, kind)) = top.entries.pop() else {
            // Emptied: remove it from its parent (the root is the caller's).
            if let (Some(done), Some(parent)) = (stack.pop(), stack.last()) {
                match nix::unistd::unlinkat(
                    &parent.dir,
                    done.name.as_c_str(),
                    UnlinkatFlags::RemoveDir,
                ) {
                    Err(Errno::ENOENT) => {}
                    r => r.map_err(mount_err_at("remove", &|| {
                        path_of(root, &stack, &done.name)
                    }))?,
                }
            }
            continue;
        };
        let path = || path_of(root, &stack, &name);
        let Some(parent) = stack.last() else { break };
        let Some(child) = remove_entry(&parent.dir, &name, kind, dirs_only, &path)? else {
            continue;
        };
        if stack.len() > max_depth {
            return Err(Error::Invalid(format!(
                "cannot remove {}: directories nested more than {max_depth} levels deep",
                root.display()
            )));
        }
        let (dir, entries) = read_dir(child, &path)?;
        stack.push(Frame { dir, name, entries });
    }
    Ok(())
}

/// The entries of the directory open at `fd`, but `.` and `..`.
fn read_dir(fd: OwnedFd, path: &dyn Fn() -> PathBuf) -> Result<(Dir, Entries)> {
    let mut dir = Dir::from_fd(fd).map_err(mount_err_at("open directory", path))?;
    let mut entries = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(mount_err_at("read directory", path))?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        entries.push((name.to_owned(), entry.file_type()));
    }
    entries.reverse();
    Ok((dir, entries))
}

/// The path of `name` in the directory on top of `stack` (for errors only).
fn path_of(root: &Path, stack: &[Frame], name: &CStr) -> PathBuf {
    let mut path = root.to_path_buf();
    for frame in stack.iter().skip(1) {
        path.push(OsStr::from_bytes(frame.name.to_bytes()));
    }
    path.push(OsStr::from_bytes(name.to_bytes()));
    path
}

/// Removes the entry `name` of the directory `parent`, but a directory:
/// that is opened and returned, for the caller to empty and then remove.
/// `kind` is only a hint (what `readdir` said); the entry may have changed
/// since, so every step is relative to `parent` and checked again. `path`
/// names the entry in errors.
fn remove_entry(
    parent: &Dir,
    name: &CStr,
    kind: Option<Type>,
    dirs_only: bool,
    path: &dyn Fn() -> PathBuf,
) -> Result<Option<OwnedFd>> {
    if !dirs_only && matches!(kind, Some(k) if k != Type::Directory) {
        match unlink_leaf(parent, name, path) {
            // A directory took its place: remove it as one.
            Err(Error::Mount {
                source: Errno::EISDIR,
                ..
            }) => {}
            r => return r.map(|()| None),
        }
    }
    match open_child_dir(parent, name) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        // Not a directory, or a symlink (never followed): remove the entry
        // itself, which for a symlink is the link.
        Err(Errno::ENOTDIR | Errno::ELOOP) if dirs_only => Err(not_a_directory(&path())),
        Err(Errno::ENOTDIR | Errno::ELOOP) => unlink_leaf(parent, name, path).map(|()| None),
        Err(Errno::EXDEV) => Err(Error::Invalid(format!(
            "cannot delete {}: it is a mount point or on another file system",
            path().display()
        ))),
        Err(e) => Err(mount_err_at("open", path)(e)),
    }
}

fn unlink_leaf(parent: &Dir, name: &CStr, path: &dyn Fn() -> PathBuf) -> Result<()> {
    match nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
        Err(Errno::ENOENT) => Ok(()),
        r => r.map_err(mount_err_at("remove", path)),
    }
}

/// Opens the directory `name` of `parent` without following a symlink and
/// without crossing into a mount (`EXDEV`), a bind mount of the same file
/// system included.
fn open_child_dir(parent: &impl AsFd, name: &CStr) -> std::result::Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_NO_XDEV
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_BENEATH,
        );
    match nix::fcntl::openat2(parent.as_fd(), name, how) {
        // No openat2 here (or a seccomp profile refusing it).
        Err(Errno::ENOSYS | Errno::EPERM) => open_child_dir_fallback(parent, name),
        r => r,
    }
}

/// [`open_child_dir`] without `openat2`: `O_NOFOLLOW`, then the child's
/// mount id (`/proc/self/fdinfo`) must be its parent's.
fn open_child_dir_fallback(parent: &impl AsFd, name: &CStr) -> std::result::Result<OwnedFd, Errno> {
    let fd = nix::fcntl::openat(
        parent.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if mount_id(&fd)? != mount_id(parent)? {
        return Err(Errno::EXDEV);
    }
    Ok(fd)
}

/// The mount id of the file open at `fd` (`mnt_id:` in
/// `/proc/self/fdinfo/<fd>`, Linux 3.15+). Unreadable is an error: the
/// caller then refuses to descend.
fn mount_id(fd: &impl AsFd) -> std::result::Result<u64, Errno> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd()))
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(Errno::EIO as i32)))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(Errno::EXDEV)
}

fn remove_leaf_path(path: &Path, dirs_only: bool) -> Result<()> {
    if dirs_only {
        return Err(not_a_directory(path));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", path)(e)),
        _ => Ok(()),
    }
}

fn not_a_directory(path: &Path) -> Error {
    Error::Invalid(format!("cannot remove {}: not a directory", path.display()))
}

fn mount_err(context: &'static str, path: &Path) -> impl FnOnce(Errno) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Mount {
        context,
        path,
        source,
    }
}

/// [`mount_err`] with the path built only on an error.
fn mount_err_at<'a>(
    context: &'static str,
    path: &'a dyn Fn() -> PathBuf,
) -> impl FnOnce(Errno) -> Error + 'a {
    move |source| Error::Mount {
        context,
        path: path(),
        source,
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

    /// A same-file-system bind mount that appears after the mountinfo check
    /// (the hostPath subPath case): the walk refuses it and nothing of the
    /// bind's source goes. `st_dev` alone cannot tell it apart.
    #[test]
    fn the_walk_refuses_a_bind_mount_of_the_same_file_system() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let host = tmp.path().join("host");
        std::fs::create_dir_all(host.join("sub")).expect("mkdir");
        std::fs::write(host.join("data"), b"precious").expect("write");
        std::fs::write(host.join("sub/more"), b"precious").expect("write");
        let dir = tmp.path().join("pod");
        let target = dir.join("volume-subpaths/v/c/0");
        std::fs::create_dir_all(&target).expect("mkdir");
        crate::mount::bind_mount_blocking(&host, &target, false).expect("bind");
        let root = std::fs::canonicalize(&dir).expect("canonical");
        let r = walk(&root, false);
        let unmounted = crate::mount::unmount_blocking(&target);
        let e = r.expect_err("a mount point");
        unmounted.expect("unmount");
        assert!(e.to_string().contains("mount point"), "{e}");
        assert_eq!(std::fs::read(host.join("data")).expect("kept"), b"precious");
        assert_eq!(
            std::fs::read(host.join("sub/more")).expect("kept"),
            b"precious"
        );
        walk(&root, false).expect("removed once unmounted");
        assert!(!dir.exists());
    }

    #[test]
    fn the_fallback_refuses_a_bind_mount_too() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let host = tmp.path().join("host");
        let dir = tmp.path().join("pod");
        std::fs::create_dir(&host).expect("mkdir");
        std::fs::create_dir_all(dir.join("m")).expect("mkdir");
        std::fs::create_dir_all(dir.join("plain")).expect("mkdir");
        crate::mount::bind_mount_blocking(&host, &dir.join("m"), false).expect("bind");
        let parent = std::fs::File::open(&dir).expect("open");
        let m = open_child_dir_fallback(&parent, c"m");
        let plain = open_child_dir_fallback(&parent, c"plain");
        crate::mount::unmount_blocking(&dir.join("m")).expect("unmount");
        assert_eq!(m.err(), Some(Errno::EXDEV));
        plain.expect("same mount");
        open_child_dir_fallback(&parent, c"m").expect("unmounted");
    }

    /// A directory swapped for a symlink after `readdir` said "directory":
    /// the link goes, its target stays.
    #[test]
    fn a_directory_swapped_for_a_symlink_is_removed_as_a_link() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), b"host").expect("write");
        let dir = tmp.path().join("pod");
        std::fs::create_dir(&dir).expect("mkdir");
        std::os::unix::fs::symlink(&outside, dir.join("d")).expect("symlink");
        let parent = Dir::open(
            &dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .expect("open");
        let path = || dir.join("d");
        let child =
            remove_entry(&parent, c"d", Some(Type::Directory), false, &path).expect("link removed");
        assert!(child.is_none(), "not descended into");
        assert!(std::fs::symlink_metadata(dir.join("d")).is_err());
        assert_eq!(std::fs::read(outside.join("keep")).expect("kept"), b"host");
        std::os::unix::fs::symlink(&outside, dir.join("d")).expect("symlink");
        let e =
            remove_entry(&parent, c"d", Some(Type::Directory), true, &path).expect_err("dirs only");
        assert!(e.to_string().contains("not a directory"), "{e}");
        assert_eq!(std::fs::read(outside.join("keep")).expect("kept"), b"host");
    }

    const DIR: OFlag = OFlag::O_RDONLY
        .union(OFlag::O_DIRECTORY)
        .union(OFlag::O_CLOEXEC);

    /// Nests `levels` directories `name` under `dir` by descriptor (so past
    /// `PATH_MAX` too), with a file `f` in the deepest.
    fn nest(dir: &Path, name: &CStr, levels: usize) {
        let mut fd = nix::fcntl::open(dir, DIR, Mode::empty()).expect("open");
        for _ in 0..levels {
            nix::sys::stat::mkdirat(&fd, name, Mode::from_bits_truncate(0o755)).expect("mkdirat");
            fd = nix::fcntl::openat(&fd, name, DIR, Mode::empty()).expect("openat");
        }
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC;
        nix::fcntl::openat(&fd, c"f", flags, Mode::from_bits_truncate(0o644)).expect("create");
    }

    /// How many levels of `name` are left under `dir`, and whether the
    /// deepest holds `f`.
    fn depth_left(dir: &Path, name: &CStr) -> (usize, bool) {
        let mut fd = nix::fcntl::open(dir, DIR, Mode::empty()).expect("open");
        let mut levels = 0;
        while let Ok(child) = nix::fcntl::openat(&fd, name, DIR, Mode::empty()) {
            fd = child;
            levels += 1;
        }
        let f = nix::sys::stat::fstatat(&fd, c"f", nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
        (levels, f.is_ok())
    }

    /// Deeper than the limit (and than `PATH_MAX`): an error, no crash, and
    /// nothing below the limit removed; the tree can still go later.
    #[test]
    fn a_tree_deeper_than_the_limit_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pod");
        std::fs::create_dir(&dir).expect("mkdir");
        let name = c"dddddddddddddddddddddddddddddd";
        let levels = MAX_DEPTH + 20;
        assert!(levels * (name.to_bytes().len() + 1) > 4096, "past PATH_MAX");
        nest(&dir, name, levels);
        std::fs::write(dir.join("etc-hosts"), b"x").expect("write");
        let e = remove_all_one_filesystem_blocking(&dir).expect_err("too deep");
        assert!(e.to_string().contains("more than 512 levels"), "{e}");
        assert!(e.to_string().len() < 4096, "short message: {e}");
        assert_eq!(
            depth_left(&dir, name),
            (levels, true),
            "nothing removed below"
        );
        walk_limited(&dir, false, levels).expect("removed with a higher limit");
        assert!(!dir.exists());
    }

    /// A deep tree within the limit goes, on a small stack: the walk does
    /// not recurse. A limit of 2 refuses the third level below the root.
    #[test]
    fn a_deep_tree_within_the_limit_is_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pod");
        std::fs::create_dir(&dir).expect("mkdir");
        nest(&dir, c"d", 300);
        std::fs::create_dir_all(dir.join("d/d/e")).expect("mkdir");
        std::fs::write(dir.join("d/d/e/g"), b"x").expect("write");
        let root = dir.clone();
        std::thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || remove_all_one_filesystem_blocking(&root))
            .expect("spawn")
            .join()
            .expect("no overflow")
            .expect("removed");
        assert!(!dir.exists());

        nest(tmp.path(), c"s", 4);
        let top = tmp.path().join("s");
        let e = walk_limited(&top, false, 2).expect_err("limit 3 below the root");
        assert!(e.to_string().contains("more than 2 levels"), "{e}");
        assert_eq!(depth_left(&top, c"s"), (3, true));
        walk_limited(&top, true, 3).expect_err("dirs only still refuses f");
        walk_limited(&top, false, 3).expect("three levels below the root");
        assert!(!top.exists());
    }
}
