//! The status manager's local cache of API pod statuses (upstream
//! `status_manager.go` `SetPodStatus`, `TerminatePod`, `checkContainerStateTransition`).
//! Changes mark the pod dirty and wake the API sync ([`super::sync`]).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, PodStatus};
use kubelet_types::pod::RestartPolicy;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

/// Latest generated status per pod UID.
#[derive(Default)]
pub struct StatusManager {
    statuses: RwLock<HashMap<String, PodStatus>>,
    dirty: Mutex<HashSet<String>>,
    terminated: Mutex<HashSet<String>>,
    notify: Notify,
}

/// Refuses a status in which a container that must not restart went from
/// terminated back to running (upstream `checkContainerStateTransition`).
pub fn check_container_state_transition(
    old: &PodStatus,
    new: &PodStatus,
    policy: RestartPolicy,
) -> Result<(), String> {
    if policy == RestartPolicy::Always {
        return Ok(());
    }
    let lists = [
        (&old.container_statuses, &new.container_statuses),
        (&old.init_container_statuses, &new.init_container_statuses),
    ];
    for (olds, news) in lists {
        for o in olds.iter().flatten() {
            let Some(t) = terminated(o) else { continue };
            if policy == RestartPolicy::OnFailure && t.exit_code != 0 {
                continue;
            }
            if let Some(n) = news.iter().flatten().find(|n| n.name == o.name)
                && terminated(n).is_none()
            {
                return Err(format!(
                    "terminated container {} attempted illegal transition to non-terminated state",
                    o.name
                ));
            }
        }
    }
    Ok(())
}

fn terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.state.as_ref().and_then(|st| st.terminated.as_ref())
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
        } else {
            map.insert(uid.to_string(), status);
        }
        drop(map);
        self.dirty.lock().insert(uid.to_string());
        self.notify.notify_one();
        true
    }

    /// Records that the pod's containers were stopped for good (upstream
    /// `TerminatePod`), so a deleted pod's object may be removed.
    pub fn mark_terminated(&self, uid: &str) {
        self.terminated.lock().insert(uid.to_string());
        self.dirty.lock().insert(uid.to_string());
        self.notify.notify_one();
    }

    /// Whether [`Self::mark_terminated`] was called for the pod.
    pub fn is_terminated(&self, uid: &str) -> bool {
        self.terminated.lock().contains(uid)
    }

    /// Pods whose status changed since the last call.
    pub fn take_dirty(&self) -> Vec<String> {
        self.dirty.lock().drain().collect()
    }

    /// Pods with a status.
    pub fn uids(&self) -> Vec<String> {
        self.statuses.read().keys().cloned().collect()
    }

    /// Resolves when some status changed.
    pub async fn changed(&self) {
        self.notify.notified().await;
    }

    /// The cached status of a pod.
    pub fn get_pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.statuses.read().get(uid).cloned()
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        self.statuses.write().remove(uid);
        self.terminated.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning};

    fn with(name: &str, state: ContainerState) -> PodStatus {
        PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: name.into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn exited(code: i32) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn running() -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }
    }

    #[test]
    fn terminated_containers_that_must_not_restart_stay_terminated() {
        let done = with("c", exited(0));
        let failed = with("c", exited(1));
        let again = with("c", running());
        assert!(check_container_state_transition(&done, &again, RestartPolicy::Never).is_err());
        assert!(check_container_state_transition(&failed, &again, RestartPolicy::Never).is_err());
        assert!(check_container_state_transition(&done, &again, RestartPolicy::OnFailure).is_err());
        assert!(
            check_container_state_transition(&failed, &again, RestartPolicy::OnFailure).is_ok()
        );
        assert!(check_container_state_transition(&done, &again, RestartPolicy::Always).is_ok());
    }

    #[test]
    fn changes_mark_the_pod_dirty_once() {
        let m = StatusManager::default();
        assert!(m.set_pod_status("u", with("c", running())));
        assert!(!m.set_pod_status("u", with("c", running())));
        assert_eq!(m.take_dirty(), vec!["u".to_string()]);
        assert!(m.take_dirty().is_empty());
        m.mark_terminated("u");
        assert!(m.is_terminated("u"));
        m.remove("u");
        assert!(!m.is_terminated("u"));
    }
}
