//! Errors of the runtime manager, carrying the upstream reason strings that end
//! up in pod status (`waiting.reason`) and events.

use cri::CriError;

/// A step of a pod sync that failed. The `reason` strings are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The container runtime refused or failed a call.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// A container could not start for a reason the user sees in its waiting state.
    #[error("{reason}: {message}")]
    Container {
        /// Upstream reason: `CrashLoopBackOff`, `ErrImagePull`, `ImagePullBackOff`,
        /// `ErrImageNeverPull`, `InvalidImageName`, `CreateContainerError`, `RunContainerError`.
        reason: &'static str,
        /// Human-readable detail.
        message: String,
    },
    /// The pod sandbox could not be created (`FailedCreatePodSandBox`).
    #[error("FailedCreatePodSandBox: {0}")]
    CreateSandbox(String),
    /// The kubelet is shutting down: the step (an image pull) was cancelled.
    #[error("{op} cancelled: the kubelet is shutting down")]
    Shutdown {
        /// What was cancelled.
        op: &'static str,
    },
    /// A local file or directory the runtime needs could not be made.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The upstream reason for pod status and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Container { reason, .. } => reason,
            Self::CreateSandbox(_) => "FailedCreatePodSandBox",
            Self::Cri(_) | Self::Io { .. } | Self::Shutdown { .. } => "FailedSync",
        }
    }
}

/// Result of a runtime manager step.
pub type Result<T, E = Error> = std::result::Result<T, E>;
