//! Container probes for kubelet-rs (upstream `pkg/kubelet/prober` and
//! `pkg/probe/{exec,http,tcp,grpc}`).
//!
//! The [`Manager`] (upstream `prober_manager.go`) runs one worker task per
//! container and probe type (liveness, readiness, startup); each worker
//! (upstream `worker.go`) probes its container every `periodSeconds` through
//! the [`probe`] implementations and records results in the shared
//! [`kubelet_runtime::ProbeResults`]. The runtime manager reads liveness and
//! startup results to restart containers; status generation calls
//! [`Manager::update_pod_status`] for `started` and `ready`.

mod clock;
pub mod grpc_health;
mod manager;
pub mod probe;
mod prober;
#[cfg(test)]
mod test_support;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod worker;

pub use manager::{Manager, StatusProvider};
pub use probe::{ProbeError, ProbeOutcome};

/// The kind of probe a worker runs (upstream `probeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeType {
    /// `livenessProbe`: a failure restarts the container.
    Liveness,
    /// `readinessProbe`: drives the container's `ready`.
    Readiness,
    /// `startupProbe`: gates the other two; a failure restarts the container.
    Startup,
}

impl ProbeType {
    /// Upstream `probeType.String()`, used in event messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeType::Liveness => "Liveness",
            ProbeType::Readiness => "Readiness",
            ProbeType::Startup => "Startup",
        }
    }
}

impl std::fmt::Display for ProbeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The User-Agent of HTTP and gRPC probes (upstream `kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.33";
