//! Deciding what to do for a pod (upstream `kuberuntime_manager.go`
//! `computePodActions`, `findNextInitContainerToRun`, and
//! `container/helpers.go` `ShouldContainerBeRestarted`). Pure: the same
//! desired pod and observed status always give the same actions (a restart
//! of a container another kubelet started is logged and counted once, see
//! [`crate::foreign_restarts`]).

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::hash::{self, HashCheck};
use kubelet_types::pod::{self, RestartPolicy, is_restartable_init_container as is_sidecar};
use tracing::debug;

use crate::foreign_restarts;
use crate::pod_status::{ContainerState, ContainerStatus, PodStatus};
use crate::prober_results::{ProbeResult, ProbeResults};

/// Why a container is stopped (upstream `containerKillReason`): a probe
/// failure picks the probe's own grace period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KillReason {
    /// Any other reason (spec change, pod stop).
    #[default]
    Unknown,
    /// The liveness probe failed.
    LivenessProbe,
    /// The startup probe failed.
    StartupProbe,
    /// The postStart hook failed.
    FailedPostStartHook,
}

/// A running container to stop, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToKill {
    /// Runtime ID.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Why (logged, and the `Killing` event message).
    pub message: String,
    /// Why, for the grace period.
    pub reason: KillReason,
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
    /// Indexes of init containers to start, in spec order (the next regular
    /// init container, and sidecars to start or restart).
    pub init_containers_to_start: Vec<usize>,
    /// Indexes of app containers to start.
    pub containers_to_start: Vec<usize>,
    /// Indexes of ephemeral containers to start (upstream
    /// `EphemeralContainersToStart`): those never started before.
    pub ephemeral_containers_to_start: Vec<usize>,
    /// Running containers to stop.
    pub containers_to_kill: Vec<ContainerToKill>,
}

/// The liveness and startup results `compute_pod_actions` reads (upstream
/// `livenessManager`, `startupManager`), by container ID.
pub trait ProbeLookup {
    /// The liveness result, if the prober has one.
    fn liveness(&self, id: &str) -> Option<ProbeResult>;
    /// The startup result, if the prober has one.
    fn startup(&self, id: &str) -> Option<ProbeResult>;
}

impl ProbeLookup for ProbeResults {
    fn liveness(&self, id: &str) -> Option<ProbeResult> {
        self.liveness.get(id)
    }
    fn startup(&self, id: &str) -> Option<ProbeResult> {
        self.startup.get(id)
    }
}

/// No prober: every lookup misses.
pub struct NoProbes;

impl ProbeLookup for NoProbes {
    fn liveness(&self, _: &str) -> Option<ProbeResult> {
        None
    }
    fn startup(&self, _: &str) -> Option<ProbeResult> {
        None
    }
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

fn kill(s: &ContainerStatus, message: String, reason: KillReason) -> ContainerToKill {
    ContainerToKill {
        id: s.id.clone(),
        name: s.name.clone(),
        message,
        reason,
    }
}

/// What to do about a running sidecar at index `i` (upstream
/// `computeInitContainerActions`, Running case): `Some(true)` when it counts
/// as started, `Some(false)` when it is being restarted, `None` to wait.
fn running_sidecar(
    c: &Container,
    s: &ContainerStatus,
    i: usize,
    probes: &dyn ProbeLookup,
    a: &mut PodActions,
) -> Option<bool> {
    if c.startup_probe.is_some() {
        match probes.startup(&s.id)? {
            ProbeResult::Success => {}
            ProbeResult::Failure => {
                let m = format!("Init container {} failed startup probe", c.name);
                a.containers_to_kill
                    .push(kill(s, m, KillReason::StartupProbe));
                a.init_containers_to_start.push(i);
                return Some(false);
            }
            ProbeResult::Unknown => return None,
        }
    }
    Some(true)
}

/// Sidecar changes that do not hold back the next init container: a changed
/// spec or a failed liveness probe restarts it.
fn sidecar_restarts(
    p: &Pod,
    c: &Container,
    s: &ContainerStatus,
    i: usize,
    probes: &dyn ProbeLookup,
    a: &mut PodActions,
) {
    if hash::check(c, &s.hash, s.hash_version.as_deref()) == HashCheck::Changed {
        foreign_restarts::note_hash_restart(p, s);
        let m = format!("Init container {} definition changed", c.name);
        a.containers_to_kill.push(kill(s, m, KillReason::Unknown));
        a.init_containers_to_start.push(i);
        return;
    }
    if c.liveness_probe.is_some() && probes.liveness(&s.id) == Some(ProbeResult::Failure) {
        let m = format!("Init container {} failed liveness probe", c.name);
        a.containers_to_kill
            .push(kill(s, m, KillReason::LivenessProbe));
        a.init_containers_to_start.push(i);
    }
}

/// Upstream `computeInitContainerActions` (with sidecars): fills the init
/// containers to start (and sidecars to kill) and says whether the pod is
/// initialized, i.e. its app containers may run.
fn init_container_actions(
    p: &Pod,
    status: &PodStatus,
    probes: &dyn ProbeLookup,
    a: &mut PodActions,
) -> bool {
    let inits = pod::init_containers(p);
    if inits.is_empty() {
        return true;
    }
    // A created or running app container means initialization finished earlier.
    let mut initialized = pod::containers(p).iter().any(|c| {
        status
            .find_container(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Running | ContainerState::Created))
    });
    let mut previously = initialized;
    // Newest first: completed init containers may have been removed, so the
    // last one that has a status decides what runs next.
    for (i, c) in inits.iter().enumerate().rev() {
        let sidecar = is_sidecar(c);
        let Some(s) = status.find_container(&c.name) else {
            if previously && sidecar {
                a.init_containers_to_start.push(i);
            }
            continue;
        };
        if previously && !sidecar {
            continue;
        }
        match s.state {
            // The sync creates and starts in one step: a container left in
            // Created failed to start. Start it again.
            ContainerState::Created => a.init_containers_to_start.push(i),
            ContainerState::Running if sidecar => {
                if running_sidecar(c, s, i, probes, a) == Some(true) {
                    if i == inits.len() - 1 {
                        initialized = true;
                    } else if !previously {
                        a.init_containers_to_start.push(i + 1);
                    }
                    sidecar_restarts(p, c, s, i, probes, a);
                }
            }
            ContainerState::Running => {}
            ContainerState::Exited if sidecar => a.init_containers_to_start.push(i),
            ContainerState::Exited if init_failed(s) => {
                if !restart_on_failure(p) {
                    a.kill_pod = true;
                    a.init_containers_to_start.clear();
                    return false;
                }
                a.init_containers_to_start.push(i);
            }
            ContainerState::Exited => {
                if i == inits.len() - 1 {
                    initialized = true;
                } else {
                    a.init_containers_to_start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                if !sidecar && !restart_on_failure(p) {
                    a.kill_pod = true;
                    a.init_containers_to_start.clear();
                    return false;
                }
                let m = format!(
                    "Init container is in {:?} state, try killing it before restart",
                    "unknown"
                );
                a.containers_to_kill.push(kill(s, m, KillReason::Unknown));
                a.init_containers_to_start.push(i);
            }
        }
        previously = true;
    }
    if !previously {
        a.init_containers_to_start.push(0);
    }
    a.init_containers_to_start.reverse();
    initialized
}

/// The actions that bring the runtime state `status` to the desired pod `p`,
/// with no probe results.
pub fn compute_pod_actions(p: &Pod, status: &PodStatus) -> PodActions {
    compute_pod_actions_with(p, status, &NoProbes)
}

/// Upstream `computePodActions`: the actions that bring `status` to the
/// desired pod `p`, given the liveness and startup results in `probes`.
pub fn compute_pod_actions_with(
    p: &Pod,
    status: &PodStatus,
    probes: &dyn ProbeLookup,
) -> PodActions {
    foreign_restarts::start();
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
        let mut to_start = vec![];
        for (i, c) in containers.iter().enumerate() {
            let succeeded = status
                .find_container(&c.name)
                .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0);
            if succeeded && pod::restart_policy(p) == RestartPolicy::OnFailure {
                continue;
            }
            to_start.push(i);
        }
        // Initialization is done and nothing is left to run: only kill.
        let initialized = containers
            .iter()
            .filter_map(|c| status.find_container(&c.name))
            .any(|s| s.state != ContainerState::Unknown);
        if initialized && to_start.is_empty() {
            a.create_sandbox = false;
            return a;
        }
        if !pod::init_containers(p).is_empty() {
            a.init_containers_to_start = vec![0];
            return a;
        }
        a.containers_to_start = to_start;
        return a;
    }

    // Ephemeral containers may start before initialization is done; they
    // are never restarted, and never killed on their own.
    a.ephemeral_containers_to_start = crate::ephemeral::to_start(p, status);
    let initialized = init_container_actions(p, status, probes, &mut a);
    if a.kill_pod {
        // Nothing starts in a pod being stopped.
        a.ephemeral_containers_to_start.clear();
    }
    if a.kill_pod || !initialized {
        return a;
    }

    let mut keep = 0;
    for (i, c) in containers.iter().enumerate() {
        let s = status.find_container(&c.name);
        let Some(s) = s.filter(|s| s.state == ContainerState::Running) else {
            if should_container_be_restarted(c, p, status) {
                a.containers_to_start.push(i);
                if let Some(s) = s.filter(|s| s.state == ContainerState::Unknown) {
                    let m = format!(
                        "Container is in {:?} state, try killing it before restart",
                        "unknown"
                    );
                    a.containers_to_kill.push(kill(s, m, KillReason::Unknown));
                }
            }
            continue;
        };
        let check = hash::check(c, &s.hash, s.hash_version.as_deref());
        if check == HashCheck::Adopted {
            debug!(container = %c.name, container.id = %s.id, hash = %s.hash,
                version = ?s.hash_version, "Adopting a container hashed by another algorithm");
        }
        let mut restart = restart_on_failure(p);
        let (message, reason) = if check == HashCheck::Changed {
            // A changed spec restarts whatever the restart policy.
            restart = true;
            foreign_restarts::note_hash_restart(p, s);
            (
                format!("Container {} definition changed", c.name),
                KillReason::Unknown,
            )
        } else if probes.liveness(&s.id) == Some(ProbeResult::Failure) {
            (
                format!("Container {} failed liveness probe", c.name),
                KillReason::LivenessProbe,
            )
        } else if probes.startup(&s.id) == Some(ProbeResult::Failure) {
            (
                format!("Container {} failed startup probe", c.name),
                KillReason::StartupProbe,
            )
        } else {
            keep += 1;
            continue;
        };
        let message = if restart {
            a.containers_to_start.push(i);
            format!("{message}, will be restarted")
        } else {
            message
        };
        a.containers_to_kill.push(kill(s, message, reason));
    }
    if keep == 0 && a.containers_to_start.is_empty() {
        a.kill_pod = true;
        // Sidecars and ephemeral containers do not keep a finished pod alive.
        a.init_containers_to_start.clear();
        a.ephemeral_containers_to_start.clear();
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::foreign_restarts;
    use std::time::UNIX_EPOCH;

    fn pod_with(container: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "swap", "namespace": "default", "uid": "u-swap"},
            "spec": {"containers": [{"name": container, "image": "busybox:1"}]}
        }))
        .expect("pod")
    }

    fn running(id: &str, name: &str, hash: &str, version: Option<&str>) -> PodStatus {
        let sandbox = cri::pb::PodSandboxStatus {
            id: "sb".into(),
            state: cri::pb::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        };
        PodStatus {
            uid: "u-swap".into(),
            sandboxes: vec![sandbox],
            containers: vec![ContainerStatus {
                id: id.into(),
                sandbox_id: "sb".into(),
                name: name.into(),
                state: ContainerState::Running,
                created_at: UNIX_EPOCH,
                hash: hash.into(),
                hash_version: version.map(Into::into),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A container an upstream kubelet before 1.31 started (whole-container
    /// hash, no kubelet-rs version) is restarted with upstream's message and
    /// counted; one with the 1.31+ hash is kept and not counted.
    #[test]
    fn foreign_container_with_another_hash_is_restarted_and_counted() {
        let p = pod_with("app");
        let c = &pod::containers(&p)[0];

        let adopted = running("id-swap-adopted", "app", &hash::container_hash(c), None);
        let a = compute_pod_actions(&p, &adopted);
        assert!(a.containers_to_kill.is_empty() && a.containers_to_start.is_empty());
        assert!(!foreign_restarts::counted("id-swap-adopted"));

        let old = running("id-swap-pre131", "app", "3c42280f", None);
        let before = foreign_restarts::restarted_so_far();
        let a = compute_pod_actions(&p, &old);
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Container app definition changed, will be restarted"
        );
        assert!(foreign_restarts::counted("id-swap-pre131"));
        assert!(foreign_restarts::restarted_so_far() > before);

        // kubelet-rs' own container with a changed spec: restarted, not counted.
        let own = running("id-swap-own", "app", "3c42280f", Some(hash::HASH_VERSION));
        let a = compute_pod_actions(&p, &own);
        assert_eq!(a.containers_to_start, vec![0]);
        assert!(!foreign_restarts::counted("id-swap-own"));
    }
}
