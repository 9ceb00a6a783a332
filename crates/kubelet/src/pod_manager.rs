//! The pod manager (upstream `pkg/kubelet/pod` `pod.Manager`): the pods the
//! sources want, by UID, and the mirror pods the apiserver holds for static
//! pods, by pod full name. The sync loop writes desired pods; the API source
//! writes mirror pods; the status manager and the mirror client read both.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::pod;
use parking_lot::RwLock;
use tokio::sync::watch;

/// Desired pods as the sync loop reads and writes them (upstream `pod.Manager`).
pub trait Manager: Send + Sync {
    /// The desired pod with `uid`.
    fn get_pod_by_uid(&self, uid: &str) -> Option<Arc<Pod>>;
    /// Whether a pod with `uid` is desired.
    fn contains(&self, uid: &str) -> bool;
    /// Adds or replaces a desired pod.
    fn add_pod(&self, p: Arc<Pod>);
    /// Forgets a desired pod.
    fn remove_pod(&self, uid: &str);
    /// Every desired pod.
    fn get_pods(&self) -> Vec<Arc<Pod>>;
    /// Desired pods by UID, copied.
    fn snapshot(&self) -> HashMap<String, Arc<Pod>>;
}

impl Manager for PodManager {
    fn get_pod_by_uid(&self, uid: &str) -> Option<Arc<Pod>> {
        PodManager::get_pod_by_uid(self, uid)
    }
    fn contains(&self, uid: &str) -> bool {
        PodManager::contains(self, uid)
    }
    fn add_pod(&self, p: Arc<Pod>) {
        PodManager::add_pod(self, p);
    }
    fn remove_pod(&self, uid: &str) {
        PodManager::remove_pod(self, uid);
    }
    fn get_pods(&self) -> Vec<Arc<Pod>> {
        PodManager::get_pods(self)
    }
    fn snapshot(&self) -> HashMap<String, Arc<Pod>> {
        PodManager::snapshot(self)
    }
}

impl kubelet_podconfig::MirrorPodSink for PodManager {
    fn set_mirror_pods(&self, pods: HashMap<String, Pod>) {
        PodManager::set_mirror_pods(self, pods);
    }
}

#[derive(Default)]
struct Inner {
    pods: HashMap<String, Arc<Pod>>,
    /// Desired pods removed since the start.
    removed: u64,
    mirror_pods: HashMap<String, Pod>,
}

/// Desired and mirror pods; cheap to clone (shared).
#[derive(Clone)]
pub struct PodManager {
    inner: Arc<RwLock<Inner>>,
    mirror_changed: Arc<watch::Sender<u64>>,
}

impl Default for PodManager {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            mirror_changed: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl PodManager {
    /// The desired pod with `uid`.
    pub fn get_pod_by_uid(&self, uid: &str) -> Option<Arc<Pod>> {
        self.inner.read().pods.get(uid).cloned()
    }

    /// Whether a pod with `uid` is desired.
    pub fn contains(&self, uid: &str) -> bool {
        self.inner.read().pods.contains_key(uid)
    }

    /// Adds or replaces a desired pod (upstream `AddPod`/`UpdatePod`).
    pub fn add_pod(&self, p: Arc<Pod>) {
        let uid = pod::uid(&p).to_string();
        self.inner.write().pods.insert(uid, p);
    }

    /// Forgets a desired pod (upstream `RemovePod`).
    pub fn remove_pod(&self, uid: &str) {
        let mut inner = self.inner.write();
        if inner.pods.remove(uid).is_some() {
            inner.removed += 1;
        }
    }

    /// How many desired pods were removed since the start.
    pub fn removed_total(&self) -> u64 {
        self.inner.read().removed
    }

    /// Forgets every desired pod.
    #[cfg(test)]
    pub fn clear(&self) {
        self.inner.write().pods.clear();
    }

    /// Every desired pod (upstream `GetPods`).
    pub fn get_pods(&self) -> Vec<Arc<Pod>> {
        self.inner.read().pods.values().cloned().collect()
    }

    /// Desired pods by UID, copied.
    pub fn snapshot(&self) -> HashMap<String, Arc<Pod>> {
        self.inner.read().pods.clone()
    }

    /// The mirror pod of a static pod's full name (upstream `GetMirrorPodByPod`).
    pub fn get_mirror_pod_by_full_name(&self, full_name: &str) -> Option<Pod> {
        self.inner.read().mirror_pods.get(full_name).cloned()
    }

    /// Every mirror pod.
    pub fn get_mirror_pods(&self) -> Vec<Pod> {
        self.inner.read().mirror_pods.values().cloned().collect()
    }

    /// Replaces the mirror pods (from the apiserver watch); subscribers are
    /// notified when the set changed.
    pub fn set_mirror_pods(&self, pods: HashMap<String, Pod>) {
        let mut inner = self.inner.write();
        if inner.mirror_pods != pods {
            inner.mirror_pods = pods;
            drop(inner);
            self.mirror_changed.send_modify(|g| *g += 1);
        }
    }

    /// Notified whenever the mirror pods change.
    pub fn subscribe_mirror(&self) -> watch::Receiver<u64> {
        self.mirror_changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_test_util::pods;

    #[test]
    fn desired_pods_by_uid_and_mirror_pods_by_full_name() {
        let m = PodManager::default();
        let p = Arc::new(pods::simple("a", "busybox", "Always"));
        let uid = pod::uid(&p).to_string();
        m.add_pod(p.clone());
        assert!(m.contains(&uid));
        assert_eq!(m.get_pods().len(), 1);
        m.remove_pod(&uid);
        assert!(m.get_pod_by_uid(&uid).is_none());

        let mut rx = m.subscribe_mirror();
        let mirrors: HashMap<_, _> = [("a_default".to_string(), (*p).clone())].into();
        m.set_mirror_pods(mirrors.clone());
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        m.set_mirror_pods(mirrors);
        assert!(
            !rx.has_changed().unwrap_or(true),
            "same set: no notification"
        );
        assert!(m.get_mirror_pod_by_full_name("a_default").is_some());
    }
}
