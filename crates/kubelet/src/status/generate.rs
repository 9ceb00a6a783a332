//! API pod status from runtime state (upstream `generateAPIPodStatus`,
//! `convertToAPIContainerStatuses`, `getPhase`, `status/generate.go`).

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_runtime::pod_status::{self as rt, ContainerState as RtState};
use kubelet_types::PodPhase;
use kubelet_types::pod::{self, RestartPolicy};

/// Why a container waits, from the runtime manager (upstream `ReasonCache`).
pub type Waiting<'a> = &'a dyn Fn(&str) -> Option<(&'static str, String)>;

fn time(t: SystemTime) -> Option<Time> {
    jiff::Timestamp::try_from(t).ok().map(Time)
}

fn waiting_state(reason: &str, message: String) -> Option<ContainerState> {
    Some(ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: (!message.is_empty()).then_some(message),
        }),
        ..Default::default()
    })
}

fn terminated(s: &rt::ContainerStatus, runtime: &str) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: s.exit_code,
        reason: (!s.reason.is_empty()).then(|| s.reason.clone()),
        message: (!s.message.is_empty()).then(|| s.message.clone()),
        started_at: s.started_at.and_then(time),
        finished_at: s.finished_at.and_then(time),
        container_id: Some(format!("{runtime}://{}", s.id)),
        signal: None,
    }
}

fn container_status(
    c: &Container,
    status: &rt::PodStatus,
    waiting: Waiting<'_>,
    runtime: &str,
    default_reason: &str,
) -> ContainerStatus {
    let mut instances = status.instances(&c.name);
    let latest = instances.next();
    let previous = instances.find(|s| s.state == RtState::Exited);
    let mut out = ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        ..Default::default()
    };
    let Some(latest) = latest else {
        let (reason, message) = waiting(&c.name).unwrap_or((default_reason, String::new()));
        out.state = waiting_state(reason, message);
        out.started = Some(false);
        return out;
    };
    out.container_id = Some(format!("{runtime}://{}", latest.id));
    out.image_id = latest.image_ref.clone();
    out.restart_count = latest.restart_count;
    out.last_state = previous.map(|p| ContainerState {
        terminated: Some(terminated(p, runtime)),
        ..Default::default()
    });
    match latest.state {
        RtState::Running => {
            out.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: latest.started_at.and_then(time),
                }),
                ..Default::default()
            });
            out.ready = true;
            out.started = Some(true);
        }
        RtState::Exited => {
            // A failed restart (backoff, pull) shows as waiting, the exit as lastState.
            if let Some((reason, message)) = waiting(&c.name) {
                out.last_state = Some(ContainerState {
                    terminated: Some(terminated(latest, runtime)),
                    ..Default::default()
                });
                out.state = waiting_state(reason, message);
            } else {
                out.state = Some(ContainerState {
                    terminated: Some(terminated(latest, runtime)),
                    ..Default::default()
                });
            }
            out.started = Some(false);
        }
        RtState::Created | RtState::Unknown => {
            let (reason, message) =
                waiting(&c.name).unwrap_or(("ContainerCreating", String::new()));
            out.state = waiting_state(reason, message);
            out.started = Some(false);
        }
    }
    out
}

/// Upstream `getPhase` (1.27+): once the pod is terminal (stopped for good,
/// e.g. deleted), all-terminated containers give `Succeeded` or `Failed`
/// whatever the restart policy; static pods are exempt, as upstream.
fn phase(
    p: &Pod,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    pod_is_terminal: bool,
) -> PodPhase {
    let policy = pod::restart_policy(p);
    let (mut pending_init, mut failed_init) = (0, 0);
    for s in init {
        let st = s.state.as_ref();
        if let Some(t) = st.and_then(|s| s.terminated.as_ref()) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if st.and_then(|s| s.waiting.as_ref()).is_some() {
            let last_failed = s
                .last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some_and(|t| t.exit_code != 0);
            if last_failed {
                failed_init += 1;
            } else {
                pending_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for s in app {
        let st = s.state.as_ref();
        if st.and_then(|s| s.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = st.and_then(|s| s.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.and_then(|s| s.waiting.as_ref()).is_some() {
            if s.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some()
            {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == RestartPolicy::Never {
        return PodPhase::Failed;
    }
    if pending_init > 0 || failed_init > 0 || waiting > 0 {
        return PodPhase::Pending;
    }
    if running > 0 && unknown == 0 {
        return PodPhase::Running;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal && !pod::is_static(p) {
            return if stopped == succeeded {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
        }
        return match policy {
            RestartPolicy::Always => PodPhase::Running,
            _ if stopped == succeeded => PodPhase::Succeeded,
            RestartPolicy::Never => PodPhase::Failed,
            RestartPolicy::OnFailure => PodPhase::Running,
        };
    }
    PodPhase::Pending
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, now: &Option<Time>) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: if ok { None } else { reason.map(String::from) },
        last_transition_time: now.clone(),
        ..Default::default()
    }
}

/// The API status of `p` for runtime state `status`. `runtime` names the runtime
/// for container IDs (`containerd://…`); `waiting` gives the reason of a container
/// that failed to start; `pod_is_terminal` once the pod was stopped for good.
pub fn generate_api_pod_status(
    p: &Pod,
    status: &rt::PodStatus,
    waiting: Waiting<'_>,
    runtime: &str,
    host_ips: &[std::net::IpAddr],
    pod_is_terminal: bool,
) -> PodStatus {
    let init: Vec<ContainerStatus> = pod::init_containers(p)
        .iter()
        .map(|c| container_status(c, status, waiting, runtime, "PodInitializing"))
        .collect();
    let app: Vec<ContainerStatus> = pod::containers(p)
        .iter()
        .map(|c| {
            let reason = if init.iter().all(|s| {
                s.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
            }) {
                "ContainerCreating"
            } else {
                "PodInitializing"
            };
            container_status(c, status, waiting, runtime, reason)
        })
        .collect();
    let phase = phase(p, &init, &app, pod_is_terminal);
    let now = time(SystemTime::now());
    let initialized = init.iter().all(|s| {
        s.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    });
    let ready = !app.is_empty() && app.iter().all(|s| s.ready);
    let terminal = phase.is_terminal();
    let not_ready_reason = if terminal {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let conditions = vec![
        condition(
            "PodReadyToStartContainers",
            status.has_ready_sandbox(),
            None,
            &now,
        ),
        condition(
            "Initialized",
            initialized || terminal,
            Some("ContainersNotInitialized"),
            &now,
        ),
        condition("Ready", ready, Some(not_ready_reason), &now),
        condition("ContainersReady", ready, Some(not_ready_reason), &now),
        condition("PodScheduled", true, None, &now),
    ];
    let mut conditions = conditions;
    // Upstream names the containers holding a condition back.
    let unready: Vec<&str> = app
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let incomplete: Vec<&str> = init
        .iter()
        .filter(|s| {
            s.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_none_or(|t| t.exit_code != 0)
        })
        .map(|s| s.name.as_str())
        .collect();
    for c in conditions.iter_mut().filter(|c| c.status == "False") {
        c.message = match c.type_.as_str() {
            "Ready" | "ContainersReady" if !terminal && !unready.is_empty() => Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
            "Initialized" if !incomplete.is_empty() => Some(format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            )),
            _ => None,
        };
    }
    let host: Vec<String> = host_ips.iter().map(ToString::to_string).collect();
    // Host-network pods have the node's addresses (upstream).
    let pod_ips = if pod::host_network(p) {
        host.clone()
    } else {
        status.ips.clone()
    };
    let host_ip_list =
        (!host.is_empty()).then(|| host.iter().map(|ip| HostIP { ip: ip.clone() }).collect());
    PodStatus {
        phase: Some(phase.as_str().to_string()),
        conditions: Some(conditions),
        host_ip: host.first().cloned(),
        host_ips: host_ip_list,
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: now,
        qos_class: Some(kubelet_types::qos::pod_qos(p).as_str().to_string()),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(app),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"restartPolicy": policy, "containers": [{"name": "c", "image": "img:1"}]}
        }))
        .expect("pod")
    }

    fn inst(state: RtState, exit: i32, restart: i32, created: u64) -> rt::ContainerStatus {
        rt::ContainerStatus {
            id: format!("id{created}"),
            sandbox_id: "sb".into(),
            name: "c".into(),
            state,
            created_at: UNIX_EPOCH + Duration::from_secs(created),
            started_at: Some(UNIX_EPOCH + Duration::from_secs(created)),
            finished_at: (state == RtState::Exited)
                .then(|| UNIX_EPOCH + Duration::from_secs(created + 1)),
            exit_code: exit,
            image: "img:1".into(),
            image_ref: "sha256:x".into(),
            hash: String::new(),
            hash_version: None,
            restart_count: restart,
            reason: String::new(),
            message: String::new(),
        }
    }

    fn status(cs: Vec<rt::ContainerStatus>) -> rt::PodStatus {
        rt::PodStatus {
            uid: "u".into(),
            ips: vec!["10.88.0.5".into()],
            containers: cs,
            ..Default::default()
        }
    }

    #[test]
    fn running_pod() {
        let none = |_: &str| None;
        let s = generate_api_pod_status(
            &pod("Always"),
            &status(vec![inst(RtState::Running, 0, 0, 10)]),
            &none,
            "containerd",
            &[],
            false,
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.5"));
        let cs = &s.container_statuses.expect("statuses")[0];
        assert!(cs.ready);
        assert_eq!(cs.container_id.as_deref(), Some("containerd://id10"));
        let ready = s
            .conditions
            .expect("conds")
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("ready");
        assert_eq!(ready.status, "True");
    }

    #[test]
    fn host_ips_and_host_network_pod_ips() {
        let none = |_: &str| None;
        let node: std::net::IpAddr = "192.168.1.20".parse().expect("ip");
        let st = status(vec![inst(RtState::Running, 0, 0, 10)]);
        let s = generate_api_pod_status(&pod("Always"), &st, &none, "containerd", &[node], false);
        assert_eq!(s.host_ip.as_deref(), Some("192.168.1.20"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.5"));
        let mut hn = pod("Always");
        if let Some(spec) = hn.spec.as_mut() {
            spec.host_network = Some(true);
        }
        let s = generate_api_pod_status(&hn, &st, &none, "containerd", &[node], false);
        assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.20"));
    }

    #[test]
    fn crash_loop_shows_waiting_with_last_state() {
        let w = |_: &str| Some(("CrashLoopBackOff", "back-off 10s".to_string()));
        let s = generate_api_pod_status(
            &pod("Always"),
            &status(vec![
                inst(RtState::Exited, 1, 1, 20),
                inst(RtState::Exited, 1, 0, 10),
            ]),
            &w,
            "containerd",
            &[],
            false,
        );
        let cs = &s.container_statuses.expect("statuses")[0];
        assert_eq!(
            cs.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref()),
            Some("CrashLoopBackOff")
        );
        assert_eq!(
            cs.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code),
            Some(1)
        );
        assert_eq!(cs.restart_count, 1);
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn phases_by_policy() {
        let none = |_: &str| None;
        for (policy, exit, want) in [
            ("Never", 0, "Succeeded"),
            ("Never", 1, "Failed"),
            ("OnFailure", 0, "Succeeded"),
            ("Always", 0, "Running"),
        ] {
            let s = generate_api_pod_status(
                &pod(policy),
                &status(vec![inst(RtState::Exited, exit, 0, 10)]),
                &none,
                "containerd",
                &[],
                false,
            );
            assert_eq!(s.phase.as_deref(), Some(want), "{policy} {exit}");
        }
        let w = |_: &str| Some(("ErrImagePull", "not found".to_string()));
        let s = generate_api_pod_status(
            &pod("Always"),
            &status(vec![]),
            &w,
            "containerd",
            &[],
            false,
        );
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let cs = &s.container_statuses.expect("statuses")[0];
        assert_eq!(
            cs.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref()),
            Some("ErrImagePull")
        );
    }

    /// Issue 7 fix 4.3: a pod stopped for good (deleted) whose containers all
    /// terminated is `Succeeded` or `Failed` whatever its restart policy
    /// (upstream 1.27+ `getPhase` with `podIsTerminal`); static pods are exempt.
    #[test]
    fn terminal_pods_get_a_terminal_phase() {
        let none = |_: &str| None;
        for (policy, exit, want) in [
            ("Always", 0, "Succeeded"),
            ("Always", 137, "Failed"),
            ("OnFailure", 143, "Failed"),
            ("OnFailure", 0, "Succeeded"),
            ("Never", 1, "Failed"),
        ] {
            let st = status(vec![inst(RtState::Exited, exit, 0, 10)]);
            let p = pod(policy);
            let running = generate_api_pod_status(&p, &st, &none, "containerd", &[], false);
            let terminal = generate_api_pod_status(&p, &st, &none, "containerd", &[], true);
            assert_eq!(terminal.phase.as_deref(), Some(want), "{policy} {exit}");
            if policy == "Always" {
                assert_eq!(running.phase.as_deref(), Some("Running"), "restarting");
            }
        }
        let mut static_pod = pod("Always");
        static_pod
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(kubelet_types::labels::CONFIG_SOURCE.into(), "file".into());
        let st = status(vec![inst(RtState::Exited, 0, 0, 10)]);
        let s = generate_api_pod_status(&static_pod, &st, &none, "containerd", &[], true);
        assert_eq!(
            s.phase.as_deref(),
            Some("Running"),
            "static pods are exempt"
        );
    }
}
