//! Errors of the agent's pod pipeline, typed so that a worker can tell a
//! retryable runtime failure from a user-visible container error (upstream
//! keeps the `SyncResult` per step for the same reason).

/// Why a pod sync or kill failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime's view of the pod could not be read.
    #[error("cannot read pod status from the runtime: {0}")]
    PodStatus(#[source] std::sync::Arc<kubelet_runtime::Error>),
    /// Steps of a sync failed; the pod is retried.
    #[error("{}", join(.0))]
    Sync(Vec<kubelet_runtime::Error>),
    /// Stopping or removing the pod failed.
    #[error("killing pod: {0}")]
    Kill(#[source] kubelet_runtime::Error),
}

fn join(errors: &[kubelet_runtime::Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Error {
    /// The runtime errors behind this one, each with its upstream reason.
    pub fn runtime_errors(&self) -> Vec<&kubelet_runtime::Error> {
        match self {
            Self::PodStatus(e) => vec![e.as_ref()],
            Self::Kill(e) => vec![e],
            Self::Sync(v) => v.iter().collect(),
        }
    }

    /// The upstream reason of the first failed step (`FailedSync` by default).
    pub fn reason(&self) -> &'static str {
        self.runtime_errors()
            .first()
            .map_or("FailedSync", |e| e.reason())
    }
}
