//! The status manager's local cache of API pod statuses.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PodStatus;
use parking_lot::RwLock;

/// Latest generated status per pod UID.
#[derive(Default)]
pub struct StatusManager {
    statuses: RwLock<HashMap<String, PodStatus>>,
}

impl StatusManager {
    /// Stores `status` for `uid` when it differs from the cached one. Keeps the
    /// first `startTime`. Returns true when it changed.
    pub fn set_pod_status(&self, uid: &str, mut status: PodStatus) -> bool {
        let mut map = self.statuses.write();
        if let Some(old) = map.get_mut(uid) {
            if old.start_time.is_some() {
                status.start_time.clone_from(&old.start_time);
            }
            // Condition transition times move only when the status of a condition changes.
            if let (Some(new), Some(prev)) = (status.conditions.as_mut(), old.conditions.as_ref()) {
                for c in new.iter_mut() {
                    if let Some(p) = prev
                        .iter()
                        .find(|p| p.type_ == c.type_ && p.status == c.status)
                    {
                        c.last_transition_time.clone_from(&p.last_transition_time);
                    }
                }
            }
            if *old == status {
                return false;
            }
            *old = status;
            return true;
        }
        map.insert(uid.to_string(), status);
        true
    }

    /// The cached status of a pod.
    pub fn get_pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.statuses.read().get(uid).cloned()
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        self.statuses.write().remove(uid);
    }
}
