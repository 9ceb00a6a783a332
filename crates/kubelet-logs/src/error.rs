//! The crate's errors.

use std::path::PathBuf;

/// Why a rotation (or building the manager) failed.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// A file operation on a container's logs failed.
    #[error("failed to {op} {path:?}: {source}")]
    Io {
        /// What was being done (`remove unused log`, `compress log`, ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The rotated name is taken (two rotations within one second).
    #[error("rotated log {0:?} already exists")]
    RotatedExists(PathBuf),
    /// A runtime call failed or missed its deadline.
    #[error(transparent)]
    Runtime(#[from] cri::CriError),
    /// The blocking file task did not finish (it panicked or was cancelled).
    #[error("log file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The settings cannot make a policy (`NewContainerLogManager`).
    #[error("{0}")]
    Policy(String),
}

impl LogsError {
    /// An IO error with its operation and path.
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }
}
