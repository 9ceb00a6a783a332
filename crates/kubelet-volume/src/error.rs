//! The crate's one error type.

use std::path::PathBuf;

/// A volume could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The volume's type has no plugin here (CSI, NFS, ...). The pod is not
    /// started; the message names the type, as upstream's
    /// "no volume plugin matched".
    #[error("no volume plugin matched for volume {volume:?} of type {kind}")]
    Unsupported {
        /// The pod's name for the volume.
        volume: String,
        /// The volume source's field name (`csi`, `nfs`, ...).
        kind: String,
    },
    /// An object the volume needs could not be read.
    #[error(transparent)]
    Object(#[from] crate::host::ObjectError),
    /// The volume's spec is invalid for this node (a hostPath type check, a
    /// PV bound elsewhere, a subPath escaping the volume, ...); the message
    /// is upstream's.
    #[error("{0}")]
    Invalid(String),
    /// A step of the operation other than the set-up itself failed (upstream
    /// `GenerateError` with its own prefix, e.g. `MountVolume.NodeAffinity
    /// check failed for volume "pv-1" : ...`): the message is the whole
    /// event text, used as is.
    #[error("{0}")]
    Phased(String),
    /// A file system operation failed; the OS error is spelled as Go
    /// spells it (`no space left on device`), as in upstream's events.
    #[error("{context} {path}: {}", go_io_error(source))]
    Io {
        /// What was being done.
        context: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A plugin outside this crate (CSI) failed; its `Display` is already
    /// upstream's whole event text (`MountVolume.SetUp failed for volume
    /// "pv-1" : ...`), used as is.
    #[error(transparent)]
    Plugin(Box<dyn std::error::Error + Send + Sync>),
    /// A mount or unmount failed.
    #[error("{context} {path}: {}", go_io_error(&std::io::Error::from(*source)))]
    Mount {
        /// What was being done.
        context: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
}

impl Error {
    /// An IO error while `context` on `path`.
    pub fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            context,
            path,
            source,
        }
    }
}

/// An OS error as Go's `syscall.Errno` spells it (`no space left on
/// device`), not as Rust's `Display` does (`No space left on device (os
/// error 28)`): the events and statuses carrying it are upstream's texts.
pub fn go_io_error(e: &std::io::Error) -> String {
    let s = e.to_string();
    if e.raw_os_error().is_none() {
        return s;
    }
    let s = match s.find(" (os error") {
        Some(i) => &s[..i],
        None => s.as_str(),
    };
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_read_as_in_upstreams_events() {
        let e = Error::io("write", "/v/key")(std::io::Error::from_raw_os_error(28));
        assert_eq!(e.to_string(), "write /v/key: no space left on device");
        let e = Error::Mount {
            context: "mount",
            path: "/v".into(),
            source: nix::Error::EPERM,
        };
        assert_eq!(e.to_string(), "mount /v: operation not permitted");
        let custom = std::io::Error::other("Kept as is");
        assert_eq!(go_io_error(&custom), "Kept as is", "not an OS error");
    }
}
