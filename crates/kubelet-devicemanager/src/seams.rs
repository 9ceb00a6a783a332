//! What the device manager reads from the rest of the kubelet (upstream
//! `ActivePodsFunc` and `config.SourcesReady`) and the clock it measures the
//! endpoint stop grace period with. The kubelet adapts its pod manager to
//! [`ActivePods`]; tests use fakes.

use std::collections::HashSet;

use tokio::time::Instant;

/// The pods that may still hold devices.
pub trait ActivePods: Send + Sync + 'static {
    /// UIDs of the pods that are admitted and not yet terminated.
    fn active_pod_uids(&self) -> HashSet<String>;

    /// Whether the kubelet has handled the first update of every pod source
    /// (upstream `sourcesReady.AllReady()`): until then no allocation is
    /// freed, since a pod missing from the list may just not be admitted yet,
    /// and containers found running at start keep their devices.
    fn sources_ready(&self) -> bool;
}

/// An [`ActivePods`] with no pods whose sources are never ready: nothing is
/// freed. The manager's default until the kubelet hands its own over.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoActivePods;

impl ActivePods for NoActivePods {
    fn active_pod_uids(&self) -> HashSet<String> {
        HashSet::new()
    }

    fn sources_ready(&self) -> bool {
        false
    }
}

/// The time source for the endpoint stop grace period.
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> Instant;
}

/// [`Clock`] reading tokio's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}
