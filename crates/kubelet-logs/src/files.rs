//! The file side of a rotation (upstream `rotateLog`, `cleanupUnusedLogs`,
//! `filterUnusedLogs`, `removeExcessLogs`, `compressLog`,
//! `rotateLatestLog`'s rename, `GetAllLogs`). Blocking: call these off the
//! async runtime.
//!
//! The rotated files of `<log>` are the files `<log>.<suffix>` beside it:
//! `<log>.<timestamp>` and `<log>.<timestamp>.gz`, whose names sort oldest
//! first. A `.tmp` file is what a failed compression left; an uncompressed
//! file next to its `.gz` is what a failed removal after a compression left.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::LogsError;

/// The rotated file's suffix, upstream's Go layout `20060102-150405` as a
/// `strftime` format (in UTC).
pub const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";
const GZ: &str = ".gz";
const TMP: &str = ".tmp";

/// What one rotation did to the files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rotation {
    /// Where the live file went.
    pub rotated: PathBuf,
    /// Leftovers removed (`.tmp` files, uncompressed files whose `.gz` exists).
    pub removed_unused: usize,
    /// The oldest rotated files removed to stay within the file limit.
    pub removed_excess: usize,
    /// Rotated files compressed now.
    pub compressed: usize,
    /// Rotated files there are now, the new one included.
    pub rotated_files: usize,
}

/// Files named `<log>.*` beside `log`, sorted by name (oldest first).
fn rotated_files(log: &Path) -> Result<Vec<PathBuf>, LogsError> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let Some(name) = log.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(LogsError::io("list logs in", dir))? {
        let entry = entry.map_err(LogsError::io("list logs in", dir))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix) && n.len() > prefix.len())
        {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

fn has_suffix(p: &Path, suffix: &str) -> bool {
    p.to_str().is_some_and(|s| s.ends_with(suffix))
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Upstream `filterUnusedLogs`: (in use, unused). Temporary files are
/// unused; compressed ones are in use; an uncompressed one is unused when
/// its compressed copy exists.
fn split_unused(logs: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let compressed: Vec<PathBuf> = logs.iter().filter(|l| has_suffix(l, GZ)).cloned().collect();
    logs.into_iter().partition(|l| {
        !has_suffix(l, TMP) && (has_suffix(l, GZ) || !compressed.contains(&with_suffix(l, GZ)))
    })
}

/// Removes `p`; one already gone is fine.
fn remove(op: &'static str, p: &Path) -> Result<(), LogsError> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LogsError::io(op, p)(e)),
        _ => Ok(()),
    }
}

/// Upstream `GetAllLogs`: the rotated files in use, oldest first, then the
/// live file.
pub fn all_logs(log: &Path) -> Result<Vec<PathBuf>, LogsError> {
    let (mut inuse, _) = split_unused(rotated_files(log)?);
    inuse.push(log.to_path_buf());
    Ok(inuse)
}

/// Upstream `compressLog`: `<l>` to `<l>.gz` through `<l>.gz.tmp` (synced,
/// with the original's permissions), then `<l>` removed.
pub fn compress(l: &Path) -> Result<PathBuf, LogsError> {
    let gz = with_suffix(l, GZ);
    let tmp = with_suffix(&gz, TMP);
    let write = || -> io::Result<()> {
        let mut src = fs::File::open(l)?;
        let perm = src.metadata()?.permissions();
        let dst = fs::File::create(&tmp)?;
        dst.set_permissions(perm)?;
        let mut enc = GzEncoder::new(io::BufWriter::new(dst), Compression::default());
        io::copy(&mut src, &mut enc)?;
        let mut buf = enc.finish()?;
        buf.flush()?;
        buf.into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(LogsError::io("compress log", l)(e));
    }
    if let Err(e) = fs::rename(&tmp, &gz) {
        let _ = fs::remove_file(&tmp);
        return Err(LogsError::io("rename compressed log", &tmp)(e));
    }
    remove("remove log after compress", l)?;
    Ok(gz)
}

/// Upstream `rotateLog` up to the reopen: clean up leftovers, remove the
/// oldest rotated files beyond `max_rotated_kept`, compress the rest, and
/// rename the live file to `<log>.<stamp>`.
pub fn rotate(log: &Path, max_rotated_kept: usize, stamp: &str) -> Result<Rotation, LogsError> {
    let (inuse, unused) = split_unused(rotated_files(log)?);
    for l in &unused {
        remove("remove unused log", l)?;
    }
    // Oldest first: an ongoing `kubectl logs` reads the newest.
    let excess = inuse.len().saturating_sub(max_rotated_kept);
    for l in &inuse[..excess] {
        remove("remove old log", l)?;
    }
    let mut compressed = 0;
    for l in inuse[excess..].iter().filter(|l| !has_suffix(l, GZ)) {
        compress(l)?;
        compressed += 1;
    }
    let rotated = with_suffix(log, &format!(".{stamp}"));
    // Two rotations within one second would overwrite (or, once one is
    // compressed, later remove as a leftover) the first one's file.
    if rotated.exists() || with_suffix(&rotated, GZ).exists() {
        return Err(LogsError::RotatedExists(rotated));
    }
    fs::rename(log, &rotated).map_err(LogsError::io("rotate log", log))?;
    Ok(Rotation {
        rotated,
        removed_unused: unused.len(),
        removed_excess: excess,
        compressed,
        rotated_files: inuse.len() - excess + 1,
    })
}

/// Upstream's rename back after a failed reopen, so the next round tries
/// again. Never over a live file: when the runtime did reopen the log after
/// all (our call timed out, its reopen went through), the rotated file stays
/// a rotated file instead of replacing the lines written since.
pub fn undo(log: &Path, rotated: &Path) -> Result<(), LogsError> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    match renameat2(
        AT_FDCWD,
        rotated,
        AT_FDCWD,
        log,
        RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST) => {
            tracing::info!(path = %log.display(), "The runtime reopened the log; keeping the rotated file");
            Ok(())
        }
        Err(e) => Err(LogsError::io("rename rotated log back", rotated)(
            std::io::Error::from(e),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn gunzip(p: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(fs::File::open(p).expect("open gz"))
            .read_to_end(&mut out)
            .expect("a valid gzip");
        out
    }

    #[test]
    fn compressed_copy_holds_the_original_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = dir.path().join("0.log.20240101-000000");
        let body: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        fs::write(&l, &body).expect("write");
        let gz = compress(&l).expect("compress");
        assert_eq!(names(dir.path()), ["0.log.20240101-000000.gz"]);
        assert_eq!(gunzip(&gz), body);
    }

    #[test]
    fn rotation_cleans_up_removes_the_oldest_and_compresses_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let log = d.join("0.log");
        for (name, body) in [
            ("0.log", "live"),
            ("0.log.20240101-000001.gz", "x"),
            ("0.log.20240101-000002", "old"),
            ("0.log.20240101-000002.gz", "old"),
            ("0.log.20240101-000003", "three"),
            ("0.log.20240101-000004", "four"),
            ("0.log.20240101-000004.gz.tmp", "half"),
            // Another container's log in the same directory is left alone.
            ("1.log.20240101-000001", "other"),
        ] {
            fs::write(d.join(name), body).expect("write");
        }
        // In use: ...01.gz, ...02.gz, ...03, ...04 (the unused are the .tmp
        // and ...02 whose .gz exists). Keep 2 of them (max files 4).
        let r = rotate(&log, 2, "20240101-000005").expect("rotate");
        assert_eq!(
            names(d),
            [
                "0.log.20240101-000003.gz",
                "0.log.20240101-000004.gz",
                "0.log.20240101-000005",
                "1.log.20240101-000001",
            ]
        );
        assert_eq!(
            r,
            Rotation {
                rotated: d.join("0.log.20240101-000005"),
                removed_unused: 2,
                removed_excess: 2,
                compressed: 2,
                rotated_files: 3,
            }
        );
        assert_eq!(gunzip(&d.join("0.log.20240101-000003.gz")), b"three");
        assert_eq!(
            fs::read(d.join("0.log.20240101-000005")).expect("rotated"),
            b"live"
        );
        assert!(!log.exists(), "the runtime reopens the live file");
    }

    #[test]
    fn undo_puts_the_live_file_back_and_all_logs_lists_what_is_in_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        fs::write(&log, "live").expect("write");
        let r = rotate(&log, 3, "20240101-000001").expect("rotate");
        assert!(!log.exists());
        undo(&log, &r.rotated).expect("undo");
        assert_eq!(fs::read(&log).expect("live again"), b"live");
        assert!(!r.rotated.exists());
        fs::write(dir.path().join("0.log.20240101-000000.gz"), "z").expect("write");
        fs::write(dir.path().join("0.log.20240101-000000.gz.tmp"), "t").expect("write");
        assert_eq!(
            all_logs(&log).expect("all"),
            vec![dir.path().join("0.log.20240101-000000.gz"), log.clone()]
        );
    }

    #[test]
    fn undo_never_replaces_a_live_file_the_runtime_reopened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        fs::write(&log, "old").expect("write");
        let r = rotate(&log, 3, "20240101-000001").expect("rotate");
        fs::write(&log, "new").expect("reopened by the runtime");
        undo(&log, &r.rotated).expect("undo");
        assert_eq!(fs::read(&log).expect("live"), b"new");
        assert_eq!(fs::read(&r.rotated).expect("rotated kept"), b"old");
    }

    #[test]
    fn a_taken_name_is_not_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        fs::write(&log, "new").expect("write");
        fs::write(dir.path().join("0.log.20240101-000001.gz"), "old").expect("write");
        let e = rotate(&log, 3, "20240101-000001").expect_err("taken");
        assert!(matches!(e, LogsError::RotatedExists(_)), "{e}");
        assert_eq!(fs::read(&log).expect("live"), b"new");
    }
}
