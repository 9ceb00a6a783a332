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
    /// A file system operation failed.
    #[error("{context} {path}: {source}")]
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
    #[error("{context} {path}: {source}")]
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

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
