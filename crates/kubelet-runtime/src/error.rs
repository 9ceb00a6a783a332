//! Errors of the runtime manager, carrying the upstream reason strings that end
//! up in pod status (`waiting.reason`) and events, and the CRI error behind
//! them, so a caller can tell a runtime outage (retry soon) from a refusal
//! (retry after the pod's backoff) without reading strings.

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
        /// The runtime's error, when a CRI call failed.
        #[source]
        source: Option<CriError>,
    },
    /// The pod sandbox could not be created (`FailedCreatePodSandBox`).
    #[error("FailedCreatePodSandBox: Failed to create pod sandbox: {}", .0.message())]
    CreateSandbox(#[source] CriError),
    /// Containers were to start in a sandbox the pod does not have (a bug in
    /// the computed actions; the next sync recomputes them).
    #[error("FailedCreatePodSandBox: no ready sandbox to start containers in")]
    NoSandbox,
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

/// How a failed step is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryClass {
    /// The runtime is down or slow (CRI `Unavailable`, a deadline): the pod's
    /// spec is not at fault; retry soon.
    Transient,
    /// The runtime or the node refused the step, or the container crash-loops:
    /// retry on the pod's backoff.
    Backoff,
    /// The kubelet is shutting down: do not retry.
    Never,
}

impl Error {
    /// The upstream reason for pod status and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Container { reason, .. } => reason,
            Self::CreateSandbox(_) | Self::NoSandbox => "FailedCreatePodSandBox",
            Self::Cri(_) | Self::Io { .. } | Self::Shutdown { .. } => "FailedSync",
        }
    }

    /// The CRI error behind this one, if a runtime call failed.
    pub fn cri_error(&self) -> Option<&CriError> {
        match self {
            Self::Cri(e) | Self::CreateSandbox(e) => Some(e),
            Self::Container { source, .. } => source.as_ref(),
            Self::NoSandbox | Self::Io { .. } | Self::Shutdown { .. } => None,
        }
    }

    /// How the step should be retried, from the CRI error's class.
    pub fn retry_class(&self) -> RetryClass {
        match self {
            Self::Shutdown { .. } => RetryClass::Never,
            Self::NoSandbox => RetryClass::Transient,
            _ if self.cri_error().is_some_and(CriError::is_retryable) => RetryClass::Transient,
            _ => RetryClass::Backoff,
        }
    }

    /// True when the runtime was unreachable or slow rather than refusing:
    /// [`RetryClass::Transient`].
    pub fn is_retryable(&self) -> bool {
        self.retry_class() == RetryClass::Transient
    }
}

/// Result of a runtime manager step.
pub type Result<T, E = Error> = std::result::Result<T, E>;
