//! Probe results (upstream `pkg/kubelet/prober/results`): the latest result
//! of one kind of probe (liveness, readiness or startup) per container ID,
//! and a stream of changes. The prober's workers write here; the runtime
//! manager reads liveness and startup results when it computes a pod's
//! actions, status generation reads readiness and startup, and the sync loop
//! consumes the updates so a changed result syncs the pod at once.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;

/// The result of one probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The probe succeeded (or the container has no such probe).
    Success,
    /// The probe failed past its threshold.
    Failure,
    /// Not known yet (the worker has not probed, or the result was reset).
    Unknown,
}

impl ProbeResult {
    /// Upstream `Result.String()`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Success => "Success",
            ProbeResult::Failure => "Failure",
            ProbeResult::Unknown => "UNKNOWN",
        }
    }
}

/// A changed result (upstream `results.Update`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// The container's runtime ID.
    pub container_id: String,
    /// Its new result.
    pub result: ProbeResult,
    /// The pod's UID, so the sync loop can find the pod.
    pub pod_uid: String,
}

/// The results of one kind of probe (upstream `results.Manager`). Cheap to
/// clone; clones share the same cache and update stream.
#[derive(Clone, Default)]
pub struct ResultsManager {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    cache: RwLock<HashMap<String, ProbeResult>>,
    updates: Mutex<Option<mpsc::UnboundedSender<Update>>>,
}

impl ResultsManager {
    /// A manager with no subscriber yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached result for a container, if any.
    pub fn get(&self, container_id: &str) -> Option<ProbeResult> {
        self.inner.cache.read().get(container_id).copied()
    }

    /// Records a result; an update is sent only when it changed.
    pub fn set(&self, container_id: &str, result: ProbeResult, pod_uid: &str) {
        let changed = {
            let mut cache = self.inner.cache.write();
            cache.insert(container_id.to_string(), result) != Some(result)
        };
        if changed && let Some(tx) = self.inner.updates.lock().as_ref() {
            // A receiver that went away (the loop stopped) is not an error.
            let _ = tx.send(Update {
                container_id: container_id.to_string(),
                result,
                pod_uid: pod_uid.to_string(),
            });
        }
    }

    /// Forgets a container's result (its worker stopped).
    pub fn remove(&self, container_id: &str) {
        self.inner.cache.write().remove(container_id);
    }

    /// The stream of changed results. A second call replaces the first
    /// subscriber (there is one consumer: the sync loop).
    pub fn updates(&self) -> mpsc::UnboundedReceiver<Update> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.inner.updates.lock() = Some(tx);
        rx
    }
}

/// The three result managers the kubelet shares between the prober, the
/// runtime manager, status generation and the sync loop.
#[derive(Clone, Default)]
pub struct ProbeResults {
    /// Liveness results: a Failure restarts the container.
    pub liveness: ResultsManager,
    /// Readiness results: drive the container's `ready`.
    pub readiness: ResultsManager,
    /// Startup results: gate liveness and readiness, a Failure restarts.
    pub startup: ResultsManager,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_changes_are_sent() {
        let m = ResultsManager::new();
        let mut rx = m.updates();
        assert_eq!(m.get("c1"), None);
        m.set("c1", ProbeResult::Success, "u");
        m.set("c1", ProbeResult::Success, "u");
        m.set("c1", ProbeResult::Failure, "u");
        assert_eq!(m.get("c1"), Some(ProbeResult::Failure));
        let a = rx.recv().await.expect("first");
        assert_eq!(a.result, ProbeResult::Success);
        let b = rx.recv().await.expect("second");
        assert_eq!(
            (b.container_id.as_str(), b.result, b.pod_uid.as_str()),
            ("c1", ProbeResult::Failure, "u")
        );
        assert!(rx.try_recv().is_err(), "no update for an unchanged result");
        m.remove("c1");
        assert_eq!(m.get("c1"), None);
    }
}
