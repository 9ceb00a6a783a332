//! The pod conditions the kubelet owns (upstream `pkg/kubelet/status/generate.go`:
//! `GeneratePodInitializedCondition`, `GenerateContainersReadyCondition`,
//! `GeneratePodReadyCondition` with the pod's readiness gates). Pure
//! functions of the pod, its container statuses and its phase, shared by
//! status generation and the status manager's readiness updates.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use kubelet_types::PodPhase;
use kubelet_types::pod;

/// All container statuses are unknown.
pub const UNKNOWN_CONTAINER_STATUSES: &str = "UnknownContainerStatuses";
/// All containers succeeded.
pub const POD_COMPLETED: &str = "PodCompleted";
/// The pod failed.
pub const POD_FAILED: &str = "PodFailed";
/// Some container is not ready.
pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
/// Some init container has not succeeded.
pub const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
/// Some readiness gate is not satisfied.
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";

pub use kubelet_types::pod::is_restartable_init_container;

fn cond(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(String::from),
        message,
        ..Default::default()
    }
}

fn find<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// Go's `%s` of a `[]string`: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// Upstream `GenerateContainersReadyCondition`: sidecars and app containers.
pub fn containers_ready(p: &Pod, statuses: &[ContainerStatus], phase: PodPhase) -> PodCondition {
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let sidecars = pod::init_containers(p)
        .iter()
        .filter(|c| is_restartable_init_container(c));
    for c in sidecars.chain(pod::containers(p).iter()) {
        match find(statuses, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
            None => unknown.push(c.name.as_str()),
        }
    }
    if (phase == PodPhase::Succeeded && unknown.is_empty()) || phase == PodPhase::Failed {
        return cond("ContainersReady", false, Some(terminal_reason(phase)), None);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        messages.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if messages.is_empty() {
        return cond("ContainersReady", true, None, None);
    }
    cond(
        "ContainersReady",
        false,
        Some(CONTAINERS_NOT_READY),
        Some(messages.join(", ")),
    )
}

fn terminal_reason(phase: PodPhase) -> &'static str {
    if phase == PodPhase::Failed {
        POD_FAILED
    } else {
        POD_COMPLETED
    }
}

/// Upstream `GeneratePodReadyCondition`: ContainersReady, then each of the
/// pod's readiness gates against `conditions` (the pod's conditions, incl.
/// the ones other controllers own).
pub fn pod_ready(
    p: &Pod,
    conditions: &[PodCondition],
    statuses: &[ContainerStatus],
    phase: PodPhase,
) -> PodCondition {
    let containers = containers_ready(p, statuses, phase);
    if containers.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers
        };
    }
    let gates = p
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .into_iter()
        .flatten();
    let mut messages = Vec::new();
    for g in gates {
        match conditions.iter().find(|c| c.type_ == g.condition_type) {
            None => messages.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                g.condition_type
            )),
            Some(c) if c.status != "True" => messages.push(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                g.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if messages.is_empty() {
        return cond("Ready", true, None, None);
    }
    cond(
        "Ready",
        false,
        Some(READINESS_GATES_NOT_READY),
        Some(messages.join(", ")),
    )
}

/// Upstream `GeneratePodInitializedCondition`: regular init containers are
/// ready (succeeded), sidecars started; true once any app container started.
pub fn initialized(p: &Pod, statuses: &[ContainerStatus], phase: PodPhase) -> PodCondition {
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in pod::init_containers(p) {
        let Some(s) = find(statuses, &c.name) else {
            unknown.push(c.name.as_str());
            continue;
        };
        let done = if is_restartable_init_container(c) {
            s.started == Some(true)
        } else {
            s.ready
        };
        if !done {
            incomplete.push(c.name.as_str());
        }
    }
    if phase == PodPhase::Succeeded && unknown.is_empty() {
        return cond("Initialized", true, Some(POD_COMPLETED), None);
    }
    let app_started = pod::containers(p).iter().any(|c| {
        find(statuses, &c.name).is_some_and(|s| {
            s.started == Some(true)
                || s.state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
        })
    });
    if app_started {
        return cond("Initialized", true, None, None);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        messages.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if messages.is_empty() {
        return cond("Initialized", true, None, None);
    }
    cond(
        "Initialized",
        false,
        Some(CONTAINERS_NOT_INITIALIZED),
        Some(messages.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning};

    fn pod(gates: &[&str]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}],
                     "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always"},
                                        {"name": "init", "image": "i"}],
                     "readinessGates": gates.iter().map(|g| serde_json::json!({"conditionType": g})).collect::<Vec<_>>()}
        }))
        .expect("pod")
    }

    fn st(name: &str, ready: bool, started: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            started: Some(started),
            state: Some(ContainerState {
                running: started.then(ContainerStateRunning::default),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn containers_ready_names_unready_and_unknown_containers_sidecars_included() {
        let p = pod(&[]);
        let c = containers_ready(
            &p,
            &[st("side", false, true), st("a", true, true)],
            PodPhase::Running,
        );
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some(CONTAINERS_NOT_READY));
        assert_eq!(
            c.message.as_deref(),
            Some("containers with unknown status: [b], containers with unready status: [side]")
        );
        let all = [
            st("side", true, true),
            st("a", true, true),
            st("b", true, true),
        ];
        assert_eq!(containers_ready(&p, &all, PodPhase::Running).status, "True");
        let failed = containers_ready(&p, &all, PodPhase::Failed);
        assert_eq!(
            (failed.status.as_str(), failed.reason.as_deref()),
            ("False", Some(POD_FAILED))
        );
    }

    #[test]
    fn readiness_gates_hold_ready_back_with_upstream_messages() {
        let p = pod(&["example.com/lb", "example.com/dns"]);
        let all = [
            st("side", true, true),
            st("a", true, true),
            st("b", true, true),
        ];
        let conds = vec![PodCondition {
            type_: "example.com/lb".into(),
            status: "False".into(),
            ..Default::default()
        }];
        let r = pod_ready(&p, &conds, &all, PodPhase::Running);
        assert_eq!(r.reason.as_deref(), Some(READINESS_GATES_NOT_READY));
        assert_eq!(
            r.message.as_deref(),
            Some(
                "the status of pod readiness gate \"example.com/lb\" is not \"True\", but False, \
                 corresponding condition of pod readiness gate \"example.com/dns\" does not exist."
            )
        );
        let ok: Vec<PodCondition> = ["example.com/lb", "example.com/dns"]
            .iter()
            .map(|t| PodCondition {
                type_: t.to_string(),
                status: "True".into(),
                ..Default::default()
            })
            .collect();
        assert_eq!(pod_ready(&p, &ok, &all, PodPhase::Running).status, "True");
        // Unready containers win over the gates, with ContainersReady's reason.
        let r = pod_ready(&p, &ok, &all[..2], PodPhase::Running);
        assert_eq!(
            (r.type_.as_str(), r.reason.as_deref()),
            ("Ready", Some(CONTAINERS_NOT_READY))
        );
    }

    #[test]
    fn sidecars_count_as_initialized_once_started() {
        let p = pod(&[]);
        let mut init_done = st("init", true, false);
        init_done.state = None;
        let c = initialized(
            &p,
            &[st("side", false, false), init_done.clone()],
            PodPhase::Pending,
        );
        assert_eq!(
            c.message.as_deref(),
            Some("containers with incomplete status: [side]")
        );
        let c = initialized(&p, &[st("side", false, true), init_done], PodPhase::Pending);
        assert_eq!(c.status, "True", "a started sidecar need not be ready");
        // Once an app container ran, a restarting sidecar does not un-initialize the pod.
        let c = initialized(
            &p,
            &[st("side", false, false), st("a", true, true)],
            PodPhase::Running,
        );
        assert_eq!(c.status, "True");
    }
}
