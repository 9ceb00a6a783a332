//! The host-path driver's mount work: bind mounts (read-only by a
//! remount, as `mount --bind -o ro` does), unmounts, mount-point checks
//! from `/proc/self/mountinfo`, and usage from `statvfs`. Blocking calls;
//! the services run them on the blocking pool.

use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// Bind-mounts `source` on `target`, read-only when asked.
pub(crate) fn bind(source: &Path, target: &Path, readonly: bool) -> std::io::Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    if readonly {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        if let Err(e) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
            let _ = umount2(target, MntFlags::MNT_DETACH);
            return Err(e.into());
        }
    }
    Ok(())
}

/// Unmounts `target`.
pub(crate) fn unmount(target: &Path) -> std::io::Result<()> {
    umount2(target, MntFlags::empty()).map_err(Into::into)
}

/// Decodes the octal escapes of a mountinfo path (`\040` for a space).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(v) = field
                .get(i + 1..i + 4)
                .and_then(|oct| u8::from_str_radix(oct, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` is a mount point (some mount's target in this mount
/// namespace).
pub(crate) fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    let want = match want.trim_end_matches('/') {
        "" => "/",
        w => w,
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape(m) == want)
}

/// Usage of the filesystem holding `path`: (total, available, used) bytes
/// and (total, free, used) inodes.
pub(crate) fn usage(path: &Path) -> std::io::Result<([i64; 3], [i64; 3])> {
    let s = nix::sys::statvfs::statvfs(path)?;
    let frsize = s.fragment_size() as i64;
    let total = s.blocks() as i64 * frsize;
    let available = s.blocks_available() as i64 * frsize;
    let free = s.blocks_free() as i64 * frsize;
    let inodes = s.files() as i64;
    let ifree = s.files_free() as i64;
    Ok((
        [total, available, total - free],
        [inodes, ifree, inodes - ifree],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_decode() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert!(is_mount_point(Path::new("/")));
        assert!(!is_mount_point(Path::new("/no/such/dir/here")));
    }
}
