//! One error type for every CRI call, classified from the gRPC status once
//! (upstream kubelet inspects `status.Code(err)` at each call site instead).

use tonic::Code;

/// Errors from a CRI call. `Unavailable` and `Timeout` are retryable: the
/// runtime is down, restarting or slow; the next sync will try again.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The sandbox, container or image does not exist (gRPC `NotFound`).
    #[error("{op}: not found: {message}")]
    NotFound {
        /// The CRI method.
        op: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime cannot be reached (socket missing, connection refused).
    #[error("{op}: container runtime unavailable: {message}")]
    Unavailable {
        /// The CRI method.
        op: &'static str,
        /// What the transport said.
        message: String,
    },
    /// The call did not finish before its deadline: ours passed, or the
    /// runtime answered `DeadlineExceeded` for the deadline we sent it.
    #[error("{op}: no answer within {timeout:?}")]
    Timeout {
        /// The CRI method.
        op: &'static str,
        /// The deadline of the call (zero when not known).
        timeout: std::time::Duration,
    },
    /// Any other gRPC error, carrying the runtime's code and message.
    #[error("{op}: rpc error: code = {code:?} desc = {message}")]
    Rpc {
        /// The CRI method.
        op: &'static str,
        /// gRPC status code.
        code: Code,
        /// The runtime's message.
        message: String,
    },
    /// The endpoint flag is not a unix socket address this client can dial.
    #[error("invalid container runtime endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was refused.
        reason: &'static str,
    },
}

impl CriError {
    /// Classifies a gRPC status returned by `op` when its deadline is not
    /// known; prefer [`CriError::from_status_with_deadline`].
    pub fn from_status(op: &'static str, status: tonic::Status) -> Self {
        Self::from_status_with_deadline(op, status, std::time::Duration::ZERO)
    }

    /// Classifies a gRPC status returned by `op`, called with `deadline`: a
    /// `DeadlineExceeded` reports that deadline.
    pub fn from_status_with_deadline(
        op: &'static str,
        status: tonic::Status,
        deadline: std::time::Duration,
    ) -> Self {
        let message = status.message().to_string();
        match status.code() {
            Code::NotFound => Self::NotFound { op, message },
            Code::Unavailable => Self::Unavailable { op, message },
            Code::DeadlineExceeded => Self::Timeout {
                op,
                timeout: deadline,
            },
            code => Self::Rpc { op, code, message },
        }
    }

    /// True for errors that mean "the object is gone": callers treat them as success
    /// when removing, as upstream does for idempotent stop/remove.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// True when the runtime is unreachable or slow rather than refusing the request.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout { .. })
    }

    /// The runtime's own message, for pod status messages and events.
    pub fn message(&self) -> String {
        match self {
            Self::NotFound { message, .. }
            | Self::Unavailable { message, .. }
            | Self::Rpc { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// Result of a CRI call.
pub type Result<T, E = CriError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_grpc_codes() {
        let nf = CriError::from_status("ContainerStatus", tonic::Status::not_found("no such"));
        assert!(nf.is_not_found() && !nf.is_retryable());
        let un = CriError::from_status("Version", tonic::Status::unavailable("refused"));
        assert!(un.is_retryable() && !un.is_not_found());
        let dl = CriError::from_status("Version", tonic::Status::deadline_exceeded("slow"));
        assert!(dl.is_retryable());
        let dl = CriError::from_status_with_deadline(
            "RunPodSandbox",
            tonic::Status::deadline_exceeded("slow"),
            std::time::Duration::from_secs(4),
        );
        assert!(dl.to_string().contains("4s"), "{dl}");
        let other = CriError::from_status("PullImage", tonic::Status::unknown("401"));
        assert!(!other.is_retryable() && !other.is_not_found());
        assert_eq!(other.message(), "401");
        assert!(other.to_string().contains("PullImage"));
    }
}
