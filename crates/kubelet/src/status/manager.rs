//! The status manager's local cache of API pod statuses (upstream
//! `status_manager.go` `SetPodStatus`, `TerminatePod`, `checkContainerStateTransition`).
//! Changes mark the pod dirty and wake the API sync ([`super::sync`]).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_types::PodPhase;
use kubelet_types::pod::RestartPolicy;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use super::conditions;

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

    /// A readiness probe result changed (upstream `SetContainerReadiness`):
    /// the container's `ready`, then the pod's `Ready` and `ContainersReady`
    /// conditions, without waiting for the pod's next sync. `container_id` is
    /// the runtime's bare ID. Returns true when the status changed.
    pub fn set_container_readiness(&self, p: &Pod, container_id: &str, ready: bool) -> bool {
        self.update_container(p, container_id, |s| {
            if s.ready == ready {
                return false;
            }
            s.ready = ready;
            true
        })
    }

    /// A startup probe result changed (upstream `SetContainerStartup`).
    pub fn set_container_startup(&self, p: &Pod, container_id: &str, started: bool) -> bool {
        self.update_container(p, container_id, |s| {
            if s.started == Some(started) {
                return false;
            }
            s.started = Some(started);
            true
        })
    }

    fn update_container(
        &self,
        p: &Pod,
        container_id: &str,
        change: impl FnOnce(&mut ContainerStatus) -> bool,
    ) -> bool {
        let uid = kubelet_types::pod::uid(p);
        let Some(mut status) = self.get_pod_status(uid) else {
            return false;
        };
        let matches = |s: &&mut ContainerStatus| {
            s.container_id
                .as_deref()
                .is_some_and(|id| id.rsplit("://").next() == Some(container_id))
        };
        let found = status
            .container_statuses
            .iter_mut()
            .flatten()
            .chain(status.init_container_statuses.iter_mut().flatten())
            .find(matches);
        let Some(container) = found else { return false };
        if !change(container) {
            return false;
        }
        let phase = status
            .phase
            .as_deref()
            .and_then(|ph| ph.parse::<PodPhase>().ok())
            .unwrap_or(PodPhase::Pending);
        let all: Vec<ContainerStatus> = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .cloned()
            .collect();
        let api_conditions = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let regenerated = [
            conditions::pod_ready(p, &api_conditions, &all, phase),
            conditions::containers_ready(p, &all, phase),
            conditions::initialized(p, &all, phase),
        ];
        let now = jiff::Timestamp::now();
        for new in regenerated {
            let list = status.conditions.get_or_insert_with(Vec::new);
            match list.iter_mut().find(|c| c.type_ == new.type_) {
                Some(old) => {
                    let moved = old.status != new.status;
                    let time = old.last_transition_time.clone();
                    *old = new;
                    old.last_transition_time = if moved { Some(Time(now)) } else { time };
                }
                None => list.push(PodCondition {
                    last_transition_time: Some(Time(now)),
                    ..new
                }),
            }
        }
        self.set_pod_status(uid, status)
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
