//! The kubelet's view of the prober (upstream `prober.Manager`, the
//! `Kubelet.probeManager` field): the calls the sync loop, the pod workers
//! and status generation make. `kubelet-prober` implements it with one
//! worker per container and probe; [`NoProbes`] is the manager of a kubelet
//! without probes (upstream `prober/testing.FakeManager`'s rules: a running
//! container is started and ready).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus};
use kubelet_types::pod;

use crate::status::conditions::is_restartable_init_container;

/// What the kubelet asks of the prober.
pub trait ProbeManager: Send + Sync {
    /// A pod was admitted: start its probe workers (upstream `AddPod`).
    fn add_pod(&self, pod: &Pod);
    /// The pod is terminating: stop liveness and startup probing (upstream
    /// `StopLivenessAndStartup`); readiness goes on until it is gone.
    fn stop_liveness_and_startup(&self, pod: &Pod);
    /// The pod is gone (upstream `RemovePod`).
    fn remove_pod(&self, pod: &Pod);
    /// Stops the workers of pods not in `desired` (upstream `CleanupPods`).
    fn cleanup_pods(&self, desired: &HashSet<String>);
    /// Sets `started` and `ready` of each container status from the probe
    /// results (upstream `UpdatePodStatus`).
    fn update_pod_status(&self, pod: &Pod, status: &mut PodStatus);
}

fn running(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.running.is_some())
}

/// A kubelet without probes: running containers are started and ready,
/// regular init containers ready once they succeeded.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbes;

impl ProbeManager for NoProbes {
    fn add_pod(&self, _: &Pod) {}
    fn stop_liveness_and_startup(&self, _: &Pod) {}
    fn remove_pod(&self, _: &Pod) {}
    fn cleanup_pods(&self, _: &HashSet<String>) {}

    fn update_pod_status(&self, p: &Pod, status: &mut PodStatus) {
        for s in status.container_statuses.iter_mut().flatten() {
            let started = running(s);
            s.started = Some(started);
            s.ready = started;
        }
        let inits: &[Container] = pod::init_containers(p);
        for s in status.init_container_statuses.iter_mut().flatten() {
            let started = running(s);
            s.started = Some(started);
            let sidecar = inits
                .iter()
                .find(|c| c.name == s.name)
                .is_some_and(is_restartable_init_container);
            s.ready = if sidecar {
                started
            } else {
                s.state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
            };
        }
    }
}

impl ProbeManager for kubelet_prober::Manager {
    fn add_pod(&self, pod: &Pod) {
        kubelet_prober::Manager::add_pod(self, pod);
    }
    fn stop_liveness_and_startup(&self, pod: &Pod) {
        kubelet_prober::Manager::stop_liveness_and_startup(self, pod);
    }
    fn remove_pod(&self, pod: &Pod) {
        kubelet_prober::Manager::remove_pod(self, pod);
    }
    fn cleanup_pods(&self, desired: &HashSet<String>) {
        kubelet_prober::Manager::cleanup_pods(self, desired);
    }
    fn update_pod_status(&self, pod: &Pod, status: &mut PodStatus) {
        kubelet_prober::Manager::update_pod_status(self, pod, status);
    }
}

/// Probe workers read the pod's latest generated status (container IDs,
/// start times, the pod IP) from the status cache, as upstream's
/// `statusManager.GetPodStatus`.
impl kubelet_prober::StatusProvider for crate::status::StatusManager {
    fn get_pod_status(&self, uid: &str) -> Option<PodStatus> {
        crate::status::StatusManager::get_pod_status(self, uid)
    }
}
