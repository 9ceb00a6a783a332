//! Deciding what to do for a pod (upstream `kuberuntime_manager.go`
//! `computePodActions`, `findNextInitContainerToRun`, and
//! `container/helpers.go` `ShouldContainerBeRestarted`). Pure: the same
//! desired pod and observed status always give the same actions.

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::hash::{self, HashCheck};
use kubelet_types::pod::{self, RestartPolicy};
use tracing::debug;

use crate::pod_status::{ContainerState, ContainerStatus, PodStatus};

/// A running container to stop, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToKill {
    /// Runtime ID.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Why (logged, and the `Killing` event message).
    pub message: String,
}

/// What a sync must do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox of the pod first.
    pub kill_pod: bool,
    /// Create a new sandbox.
    pub create_sandbox: bool,
    /// The sandbox to use when not creating one.
    pub sandbox_id: Option<String>,
    /// Attempt number for the new sandbox.
    pub attempt: u32,
    /// Index of the init container to start next.
    pub next_init_container: Option<usize>,
    /// Indexes of app containers to start.
    pub containers_to_start: Vec<usize>,
    /// Running containers to stop.
    pub containers_to_kill: Vec<ContainerToKill>,
}

fn restart_on_failure(p: &Pod) -> bool {
    pod::restart_policy(p) != RestartPolicy::Never
}

fn init_failed(s: &ContainerStatus) -> bool {
    match s.state {
        ContainerState::Exited => s.exit_code != 0,
        ContainerState::Unknown => true,
        _ => false,
    }
}

/// Upstream `ShouldContainerBeRestarted`.
pub fn should_container_be_restarted(c: &Container, p: &Pod, status: &PodStatus) -> bool {
    let Some(s) = status.find_container(&c.name) else {
        return true;
    };
    match s.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        ContainerState::Exited => match pod::restart_policy(p) {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => s.exit_code != 0,
            RestartPolicy::Always => true,
        },
    }
}

/// Whether the newest sandbox is unusable, and the attempt number for a new one
/// (upstream `podSandboxChanged`).
fn sandbox_changed(status: &PodStatus) -> (bool, u32, Option<String>) {
    let Some(newest) = status.sandboxes.first() else {
        return (true, 0, None);
    };
    let attempt = newest.metadata.as_ref().map_or(0, |m| m.attempt);
    let ready =
        |s: &cri::pb::PodSandboxStatus| s.state == cri::pb::PodSandboxState::SandboxReady as i32;
    let ready_count = status.sandboxes.iter().filter(|s| ready(s)).count();
    if ready_count > 1 || !ready(newest) {
        return (true, attempt + 1, Some(newest.id.clone()));
    }
    (false, attempt, Some(newest.id.clone()))
}

/// Upstream `findNextInitContainerToRun`: (status of a failed init container,
/// next index to run, done).
fn next_init_container<'a>(
    p: &Pod,
    status: &'a PodStatus,
) -> (Option<&'a ContainerStatus>, Option<usize>, bool) {
    let inits = pod::init_containers(p);
    if inits.is_empty() {
        return (None, None, true);
    }
    // A running app container means initialization finished earlier.
    if pod::containers(p).iter().any(|c| {
        status
            .find_container(&c.name)
            .is_some_and(|s| s.state == ContainerState::Running)
    }) {
        return (None, None, true);
    }
    for (i, c) in inits.iter().enumerate().rev() {
        if let Some(s) = status.find_container(&c.name)
            && init_failed(s)
        {
            return (Some(s), Some(i), false);
        }
    }
    for (i, c) in inits.iter().enumerate().rev() {
        let Some(s) = status.find_container(&c.name) else {
            continue;
        };
        if s.state == ContainerState::Running || s.state == ContainerState::Created {
            return (None, None, false);
        }
        if s.state == ContainerState::Exited {
            return if i == inits.len() - 1 {
                (None, None, true)
            } else {
                (None, Some(i + 1), false)
            };
        }
    }
    (None, Some(0), false)
}

/// The actions that bring the runtime state `status` to the desired pod `p`.
pub fn compute_pod_actions(p: &Pod, status: &PodStatus) -> PodActions {
    let (create, attempt, sandbox_id) = sandbox_changed(status);
    let mut a = PodActions {
        kill_pod: create,
        create_sandbox: create,
        sandbox_id,
        attempt,
        ..Default::default()
    };
    let containers = pod::containers(p);

    if create {
        // A finished Never pod whose sandbox went away is not brought back.
        if !restart_on_failure(p) && attempt != 0 && !status.containers.is_empty() {
            a.create_sandbox = false;
            return a;
        }
        if !pod::init_containers(p).is_empty() {
            a.next_init_container = Some(0);
            return a;
        }
        for (i, c) in containers.iter().enumerate() {
            let succeeded = status
                .find_container(&c.name)
                .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0);
            if succeeded && pod::restart_policy(p) == RestartPolicy::OnFailure {
                continue;
            }
            a.containers_to_start.push(i);
        }
        return a;
    }

    let (failed, next, done) = next_init_container(p, status);
    if !done {
        if let Some(next) = next {
            if failed.is_some() && !restart_on_failure(p) {
                a.kill_pod = true;
            } else {
                a.next_init_container = Some(next);
            }
        }
        return a;
    }

    let mut keep = 0;
    for (i, c) in containers.iter().enumerate() {
        let s = status.find_container(&c.name);
        let Some(s) = s.filter(|s| s.state == ContainerState::Running) else {
            if should_container_be_restarted(c, p, status) {
                a.containers_to_start.push(i);
            }
            continue;
        };
        let check = hash::check(c, &s.hash, s.hash_version.as_deref());
        if check == HashCheck::Adopted {
            debug!(container = %c.name, container.id = %s.id, hash = %s.hash,
                version = ?s.hash_version, "Adopting a container hashed by another algorithm");
        }
        if check == HashCheck::Changed {
            a.containers_to_start.push(i);
            a.containers_to_kill.push(ContainerToKill {
                id: s.id.clone(),
                name: c.name.clone(),
                message: format!("Container {} definition changed, will be restarted", c.name),
            });
            continue;
        }
        keep += 1;
    }
    if keep == 0 && a.containers_to_start.is_empty() {
        a.kill_pod = true;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::pb;
    use std::time::UNIX_EPOCH;

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> Pod {
        let c = |n: &&str| serde_json::json!({"name": n, "image": "busybox:1"});
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"restartPolicy": policy,
                     "initContainers": inits.iter().map(c).collect::<Vec<_>>(),
                     "containers": apps.iter().map(c).collect::<Vec<_>>()}
        }))
        .expect("pod")
    }

    fn sandbox(id: &str, ready: bool, attempt: u32) -> pb::PodSandboxStatus {
        pb::PodSandboxStatus {
            id: id.into(),
            state: if ready {
                pb::PodSandboxState::SandboxReady as i32
            } else {
                pb::PodSandboxState::SandboxNotready as i32
            },
            metadata: Some(pb::PodSandboxMetadata {
                attempt,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctr(p: &Pod, name: &str, state: ContainerState, exit: i32) -> ContainerStatus {
        let spec = pod::containers(p)
            .iter()
            .chain(pod::init_containers(p))
            .find(|c| c.name == name)
            .cloned()
            .unwrap_or_default();
        ContainerStatus {
            id: format!("id-{name}"),
            sandbox_id: "sb".into(),
            name: name.into(),
            state,
            created_at: UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            exit_code: exit,
            image: String::new(),
            image_ref: String::new(),
            hash: pod::container_hash(&spec),
            hash_version: None,
            restart_count: 0,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn status(sandboxes: Vec<pb::PodSandboxStatus>, containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            uid: "u".into(),
            sandboxes,
            containers,
            ..Default::default()
        }
    }

    #[test]
    fn new_pod_creates_sandbox_and_starts_all() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = compute_pod_actions(&p, &PodStatus::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn running_pod_needs_nothing() {
        let p = pod("Always", &[], &["a"]);
        let s = status(
            vec![sandbox("sb", true, 0)],
            vec![ctr(&p, "a", ContainerState::Running, 0)],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(
            a,
            PodActions {
                sandbox_id: Some("sb".into()),
                ..Default::default()
            }
        );
    }

    #[test]
    fn restart_policy_matrix() {
        // (policy, exit code) -> restart?
        for (policy, exit, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 1, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ] {
            let p = pod(policy, &[], &["a"]);
            let s = status(
                vec![sandbox("sb", true, 0)],
                vec![ctr(&p, "a", ContainerState::Exited, exit)],
            );
            let a = compute_pod_actions(&p, &s);
            assert_eq!(
                !a.containers_to_start.is_empty(),
                restart,
                "{policy} exit {exit}"
            );
            // Nothing left to run: the pod is done and its sandbox is stopped.
            assert_eq!(a.kill_pod, !restart, "{policy} exit {exit}");
        }
    }

    #[test]
    fn changed_spec_replaces_the_container() {
        let p = pod("Always", &[], &["a"]);
        let mut c = ctr(&p, "a", ContainerState::Running, 0);
        c.hash = "old".into();
        let a = compute_pod_actions(&p, &status(vec![sandbox("sb", true, 0)], vec![c]));
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert!(!a.kill_pod);
    }

    #[test]
    fn dead_sandbox_is_recreated_with_next_attempt() {
        let p = pod("Always", &[], &["a"]);
        let s = status(
            vec![sandbox("sb", false, 2)],
            vec![ctr(&p, "a", ContainerState::Exited, 137)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 3);
        assert_eq!(a.containers_to_start, vec![0]);
        // Never: a dead sandbox of a pod that ran is not recreated.
        let p = pod("Never", &[], &["a"]);
        let a = compute_pod_actions(&p, &s);
        assert!(!a.create_sandbox && a.kill_pod);
        // OnFailure: succeeded containers are not started again in the new sandbox.
        let p = pod("OnFailure", &[], &["a", "b"]);
        let s = status(
            vec![sandbox("sb", false, 0)],
            vec![
                ctr(&p, "a", ContainerState::Exited, 0),
                ctr(&p, "b", ContainerState::Exited, 1),
            ],
        );
        assert_eq!(compute_pod_actions(&p, &s).containers_to_start, vec![1]);
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = compute_pod_actions(&p, &PodStatus::default());
        assert_eq!(a.next_init_container, Some(0));
        assert!(a.containers_to_start.is_empty());
        let sb = || vec![sandbox("sb", true, 0)];
        // i1 running: wait.
        let a = compute_pod_actions(
            &p,
            &status(sb(), vec![ctr(&p, "i1", ContainerState::Running, 0)]),
        );
        assert_eq!(
            (a.next_init_container, a.containers_to_start.len()),
            (None, 0)
        );
        // i1 done: i2 next.
        let a = compute_pod_actions(
            &p,
            &status(sb(), vec![ctr(&p, "i1", ContainerState::Exited, 0)]),
        );
        assert_eq!(a.next_init_container, Some(1));
        // both done: app containers.
        let a = compute_pod_actions(
            &p,
            &status(
                sb(),
                vec![
                    ctr(&p, "i2", ContainerState::Exited, 0),
                    ctr(&p, "i1", ContainerState::Exited, 0),
                ],
            ),
        );
        assert_eq!(
            (a.next_init_container, a.containers_to_start.clone()),
            (None, vec![0])
        );
        // i1 failed: restart it (Always), or fail the pod (Never).
        let failed = status(sb(), vec![ctr(&p, "i1", ContainerState::Exited, 1)]);
        assert_eq!(
            compute_pod_actions(&p, &failed).next_init_container,
            Some(0)
        );
        let never = pod("Never", &["i1", "i2"], &["a"]);
        let failed = status(sb(), vec![ctr(&never, "i1", ContainerState::Exited, 1)]);
        let a = compute_pod_actions(&never, &failed);
        assert!(a.kill_pod && a.next_init_container.is_none());
    }
}
