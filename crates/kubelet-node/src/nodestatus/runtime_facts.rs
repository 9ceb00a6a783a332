//! What node status reads from the container runtime (upstream `VersionInfo`
//! and `Images` setters in `pkg/kubelet/nodestatus/setters.go`, and
//! `runtimeState` for readiness).
//!
//! Upstream's setters read the runtime version and the image manager's cached
//! image list; neither can hold up a status report, and the heartbeat timeout
//! covers only the GET and PATCH of the Node. Here `Version` and `ListImages`
//! are CRI calls, so each gets a short deadline of its own
//! ([`RUNTIME_READ_TIMEOUT`]); when one fails or times out (containerd hung),
//! the last value read is reported instead, so the status (and the NotReady
//! condition that [`RuntimeState`] drives) is still posted every interval.

use std::time::Duration;

use cri::{ImageService, RuntimeService, pb};
use tracing::warn;

use super::setters;
use crate::RuntimeState;

/// Deadline for each of the runtime reads one status computation makes.
pub const RUNTIME_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Runtime facts for one status computation.
pub(super) struct RuntimeFacts {
    /// `nodeInfo.containerRuntimeVersion`; `None`: never read.
    pub version: Option<String>,
    /// Why the node is not ready (runtime, network and shutdown errors);
    /// empty: ready.
    pub not_ready: Vec<String>,
    /// The runtime's images; `None`: never read (the server's are kept).
    pub images: Option<Vec<pb::Image>>,
}

/// The last runtime version and image list read, reported while the runtime
/// does not answer.
#[derive(Default)]
pub(super) struct LastKnown {
    version: Option<String>,
    images: Option<Vec<pb::Image>>,
}

impl LastKnown {
    /// Reads the runtime's version and images (each within
    /// [`RUNTIME_READ_TIMEOUT`], concurrently) and its health as the agent
    /// last saw it; a read that fails keeps the last known value.
    pub async fn read(
        &mut self,
        runtime: &dyn RuntimeService,
        images: &dyn ImageService,
        state: &dyn RuntimeState,
    ) -> RuntimeFacts {
        // The runtime's state as the health check last saw it (upstream
        // `runtimeState`): no second status call to the runtime.
        // Upstream's order: runtime, network, (storage), shutdown.
        let mut not_ready = state.runtime_errors();
        not_ready.extend(state.network_errors());
        not_ready.extend(state.shutdown_errors());
        let (version, list) = tokio::join!(
            tokio::time::timeout(RUNTIME_READ_TIMEOUT, runtime.version()),
            tokio::time::timeout(RUNTIME_READ_TIMEOUT, images.list_images()),
        );
        match version {
            Ok(Ok(v)) => {
                self.version = Some(setters::container_runtime_version(
                    &v.runtime_name,
                    &v.runtime_version,
                ));
            }
            Ok(Err(e)) => {
                warn!(error = %e, "Runtime version unavailable; reporting the last known")
            }
            Err(_) => warn!(
                timeout = ?RUNTIME_READ_TIMEOUT,
                "Runtime version timed out; reporting the last known"
            ),
        }
        match list {
            Ok(Ok(list)) => self.images = Some(list),
            Ok(Err(e)) => warn!(error = %e, "Image list unavailable; reporting the last known"),
            Err(_) => warn!(
                timeout = ?RUNTIME_READ_TIMEOUT,
                "Image list timed out; reporting the last known"
            ),
        }
        RuntimeFacts {
            version: self.version.clone(),
            not_ready,
            images: self.images.clone(),
        }
    }
}
