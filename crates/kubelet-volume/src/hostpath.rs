//! hostPath volumes (upstream `pkg/volume/hostpath`): the host path itself
//! is what containers mount; set-up only refuses paths with `..` and runs
//! the `type` check (upstream `checkType`), creating the directory or file
//! for the `...OrCreate` types. Also used for PersistentVolumes with a
//! `hostPath` source.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::HostPathVolumeSource;

use crate::mount::blocking;
use crate::plugin::{MountedVolume, SetUpRequest, names};
use crate::{Error, Result, VolumeHost};

/// Sets up the pod volume `req.volume` (a `hostPath` source).
pub async fn set_up(host: &dyn VolumeHost, req: SetUpRequest<'_>) -> Result<MountedVolume> {
    let _ = host;
    let Some(src) = req.volume.host_path.as_ref() else {
        return Err(Error::Invalid(format!(
            "volume {:?} is not a hostPath volume",
            req.volume.name
        )));
    };
    let path = check(src).await?;
    Ok(MountedVolume {
        name: req.volume.name.clone(),
        plugin: names::HOST_PATH,
        host_path: path,
        read_only: false,
        refresh: false,
        block: false,
    })
}

/// Validates a hostPath source and runs its type check (upstream
/// `hostPathMounter.SetUp`); returns the path.
pub async fn check(src: &HostPathVolumeSource) -> Result<PathBuf> {
    let path = src.path.clone();
    if let Err(e) = validate_path_no_backsteps(&path) {
        return Err(Error::Invalid(format!("invalid HostPath `{path}`: {e}")));
    }
    let kind = src.type_.clone().unwrap_or_default();
    if kind.is_empty() {
        return Ok(PathBuf::from(path));
    }
    let checked = path.clone();
    blocking(move || check_type(Path::new(&checked), &kind)).await?;
    Ok(PathBuf::from(path))
}

/// Upstream `validation.ValidatePathNoBacksteps`: no `..` element.
pub fn validate_path_no_backsteps(path: &str) -> std::result::Result<(), &'static str> {
    if path.split('/').any(|p| p == "..") {
        return Err("must not contain '..'");
    }
    Ok(())
}

/// Upstream `checkType`, on the calling thread.
fn check_type(path: &Path, kind: &str) -> Result<()> {
    match kind {
        "DirectoryOrCreate" => {
            if !exists(path) {
                return make_dir(path);
            }
            type_matched_or_error(path, "Directory", "directory")
        }
        "Directory" => type_matched_or_error(path, "Directory", "directory"),
        "FileOrCreate" => {
            if !exists(path) {
                return make_file(path);
            }
            type_matched_or_error(path, "File", "file")
        }
        "File" => type_matched_or_error(path, "File", "file"),
        "Socket" => type_matched_or_error(path, "Socket", "socket file"),
        "CharDevice" => type_matched_or_error(path, "CharDevice", "character device"),
        "BlockDevice" => type_matched_or_error(path, "BlockDevice", "block device"),
        other => Err(Error::Invalid(format!("{other} is an invalid volume type"))),
    }
}

/// Whether the path exists, following symlinks (upstream `PathExists`).
fn exists(path: &Path) -> bool {
    std::fs::metadata(path).is_ok()
}

/// The path's type as upstream's `GetFileType` names it.
fn file_type(path: &Path) -> std::result::Result<&'static str, String> {
    let md = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let ft = md.file_type();
    Ok(if ft.is_socket() {
        "Socket"
    } else if ft.is_char_device() {
        "CharDevice"
    } else if ft.is_block_device() {
        "BlockDevice"
    } else if ft.is_dir() {
        "Directory"
    } else if ft.is_file() {
        "File"
    } else {
        return Err(
            "only recognise file, directory, socket, block device and character device".into(),
        );
    })
}

/// Upstream `typeMatchedOrError`.
fn type_matched_or_error(path: &Path, expected: &str, description: &str) -> Result<()> {
    if !exists(path) {
        return Err(Error::Invalid(format!(
            "hostPath {} doesn't exist",
            path.display()
        )));
    }
    match file_type(path) {
        Err(e) => Err(Error::Invalid(format!(
            "hostPath type check failed, {} is not a {description}, unable to determine its type: {e}",
            path.display()
        ))),
        Ok(actual) if actual != expected => Err(Error::Invalid(format!(
            "hostPath type check failed: {} is not a {description}, it's a {actual}",
            path.display()
        ))),
        Ok(_) => Ok(()),
    }
}

/// Upstream `makeDir`: `MkdirAll` with 0755 (before the umask).
fn make_dir(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(Error::io("create hostPath directory", path))
}

/// Upstream `makeFile`: an empty file, 0644 (before the umask); the parent
/// must exist.
fn make_file(path: &Path) -> Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io("create hostPath file", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn src(path: &Path, kind: &str) -> HostPathVolumeSource {
        HostPathVolumeSource {
            path: path.display().to_string(),
            type_: (!kind.is_empty()).then(|| kind.to_string()),
        }
    }

    async fn err(path: &Path, kind: &str) -> String {
        check(&src(path, kind)).await.expect_err(kind).to_string()
    }

    #[tokio::test]
    async fn directory_types() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b");
        assert_eq!(
            err(&dir, "Directory").await,
            format!("hostPath {} doesn't exist", dir.display())
        );
        check(&src(&dir, "DirectoryOrCreate"))
            .await
            .expect("create");
        let md = std::fs::metadata(&dir).expect("created");
        assert!(md.is_dir());
        assert_eq!(md.permissions().mode() & 0o7777, 0o755 & !umask());
        check(&src(&dir, "Directory"))
            .await
            .expect("is a directory");
        check(&src(&dir, "DirectoryOrCreate"))
            .await
            .expect("exists");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").expect("write");
        assert_eq!(
            err(&file, "DirectoryOrCreate").await,
            format!(
                "hostPath type check failed: {} is not a directory, it's a File",
                file.display()
            )
        );
    }

    fn umask() -> u32 {
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        nix::sys::stat::umask(old);
        old.bits()
    }

    #[tokio::test]
    async fn file_types() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        assert!(err(&file, "File").await.contains("doesn't exist"));
        check(&src(&file, "FileOrCreate")).await.expect("create");
        let md = std::fs::metadata(&file).expect("created");
        assert!(md.is_file());
        assert_eq!(md.len(), 0);
        assert_eq!(md.permissions().mode() & 0o777, 0o644 & !umask());
        std::fs::write(&file, b"keep").expect("write");
        check(&src(&file, "FileOrCreate")).await.expect("exists");
        assert_eq!(
            std::fs::read(&file).expect("read"),
            b"keep",
            "not truncated"
        );
        check(&src(&file, "File")).await.expect("is a file");
        assert!(
            err(&tmp.path().join("missing/f"), "FileOrCreate")
                .await
                .contains("create hostPath file")
        );
        assert_eq!(
            err(tmp.path(), "File").await,
            format!(
                "hostPath type check failed: {} is not a file, it's a Directory",
                tmp.path().display()
            )
        );
    }

    #[tokio::test]
    async fn socket_and_device_types() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sock = tmp.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        check(&src(&sock, "Socket")).await.expect("a socket");
        assert_eq!(
            err(&sock, "CharDevice").await,
            format!(
                "hostPath type check failed: {} is not a character device, it's a Socket",
                sock.display()
            )
        );
        check(&src(Path::new("/dev/null"), "CharDevice"))
            .await
            .expect("a char device");
        assert_eq!(
            err(Path::new("/dev/null"), "BlockDevice").await,
            "hostPath type check failed: /dev/null is not a block device, it's a CharDevice"
        );
        assert_eq!(
            err(Path::new("/dev/null"), "Socket").await,
            "hostPath type check failed: /dev/null is not a socket file, it's a CharDevice"
        );
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        assert!(
            err(&fifo, "File")
                .await
                .contains("unable to determine its type")
        );
    }

    #[tokio::test]
    async fn untyped_paths_are_not_checked_and_backsteps_and_bad_types_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("nope");
        assert_eq!(check(&src(&missing, "")).await.expect("no check"), missing);
        assert!(!missing.exists());
        assert_eq!(
            err(Path::new("/var/../etc"), "").await,
            "invalid HostPath `/var/../etc`: must not contain '..'"
        );
        assert_eq!(
            err(tmp.path(), "Fifo").await,
            "Fifo is an invalid volume type"
        );
    }
}
