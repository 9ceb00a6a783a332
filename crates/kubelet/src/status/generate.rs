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

use super::conditions::{self, is_restartable_init_container};
use crate::prober::ProbeManager;

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
            // Readiness and `started` are the prober's (`update_pod_status`).
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

/// Upstream `getPhase` (1.29+, sidecars): once the pod is terminal (stopped
/// for good, e.g. deleted), all-terminated containers give `Succeeded` or
/// `Failed` whatever the restart policy; static pods are exempt, as upstream.
/// Sidecars count as running app containers while they run, never as
/// stopped ones, and hold the pod `Pending` until started unless an app
/// container already ran (`has_initialized`).
fn phase(
    p: &Pod,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    pod_is_terminal: bool,
    has_initialized: bool,
) -> PodPhase {
    let policy = pod::restart_policy(p);
    let (mut pending_init, mut failed_init, mut pending_sidecars) = (0, 0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    let last_terminated = |s: &ContainerStatus| {
        s.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    for c in pod::init_containers(p) {
        let Some(s) = init.iter().find(|s| s.name == c.name) else {
            if is_restartable_init_container(c) {
                unknown += 1;
            } else {
                pending_init += 1;
            }
            continue;
        };
        let st = s.state.as_ref();
        let is_running = st.and_then(|s| s.running.as_ref()).is_some();
        let terminated = st.and_then(|s| s.terminated.as_ref());
        let is_waiting = st.and_then(|s| s.waiting.as_ref()).is_some();
        if is_restartable_init_container(c) {
            if is_running {
                if s.started != Some(true) {
                    pending_sidecars += 1;
                }
                running += 1;
            } else if terminated.is_some() || (is_waiting && last_terminated(s).is_some()) {
                // A stopped sidecar does not count towards the phase.
            } else if is_waiting {
                pending_sidecars += 1;
                waiting += 1;
            } else {
                pending_sidecars += 1;
                unknown += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if is_waiting {
            match last_terminated(s) {
                Some(code) if code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
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
            if last_terminated(s).is_some() {
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
    if pending_init > 0 || (pending_sidecars > 0 && !has_initialized) || waiting > 0 {
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

fn condition(type_: &str, ok: bool) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        ..Default::default()
    }
}

/// The API status of `p` for runtime state `status`. `runtime` names the runtime
/// for container IDs (`containerd://…`); `waiting` gives the reason of a container
/// that failed to start; `pod_is_terminal` once the pod was stopped for good;
/// `probes` sets each container's `started` and `ready`.
pub fn generate_api_pod_status(
    p: &Pod,
    status: &rt::PodStatus,
    waiting: Waiting<'_>,
    runtime: &str,
    host_ips: &[std::net::IpAddr],
    pod_is_terminal: bool,
    probes: &dyn ProbeManager,
) -> PodStatus {
    let init: Vec<ContainerStatus> = pod::init_containers(p)
        .iter()
        .map(|c| container_status(c, status, waiting, runtime, "PodInitializing"))
        .collect();
    // Upstream `convertToAPIContainerStatuses`: app containers not created
    // yet wait with `PodInitializing` in any pod that has init containers.
    let default_reason = if pod::init_containers(p).is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let app: Vec<ContainerStatus> = pod::containers(p)
        .iter()
        .map(|c| container_status(c, status, waiting, runtime, default_reason))
        .collect();
    // Ephemeral containers: statuses like app containers', apart from the
    // phase, the conditions and the prober (upstream
    // `convertToAPIContainerStatuses` over the ephemeral specs).
    let ephemeral: Vec<ContainerStatus> = kubelet_runtime::ephemeral::ephemeral_containers(p)
        .iter()
        .map(|ec| {
            let c = kubelet_runtime::ephemeral::as_container(ec);
            container_status(&c, status, waiting, runtime, default_reason)
        })
        .collect();
    let mut s = PodStatus {
        init_container_statuses: Some(init),
        container_statuses: Some(app),
        ..Default::default()
    };
    probes.update_pod_status(p, &mut s);
    let init = s.init_container_statuses.take().unwrap_or_default();
    let app = s.container_statuses.take().unwrap_or_default();
    // Upstream `HasAnyActiveRegularContainerStarted`.
    let has_initialized = pod::containers(p).iter().any(|c| {
        status
            .find_container(&c.name)
            .is_some_and(|s| s.state == RtState::Running)
    });
    let phase = phase(p, &init, &app, pod_is_terminal, has_initialized);
    let now = time(SystemTime::now());
    let all: Vec<ContainerStatus> = init.iter().chain(app.iter()).cloned().collect();
    let api_conditions = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut conditions = vec![
        condition("PodReadyToStartContainers", status.has_ready_sandbox()),
        conditions::initialized(p, &all, phase),
        conditions::pod_ready(p, &api_conditions, &all, phase),
        conditions::containers_ready(p, &all, phase),
        condition("PodScheduled", true),
    ];
    for c in &mut conditions {
        c.last_transition_time.clone_from(&now);
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
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generate(
        p: &Pod,
        st: &rt::PodStatus,
        waiting: Waiting<'_>,
        runtime: &str,
        host_ips: &[std::net::IpAddr],
        terminal: bool,
    ) -> PodStatus {
        generate_api_pod_status(
            p,
            st,
            waiting,
            runtime,
            host_ips,
            terminal,
            &crate::prober::NoProbes,
        )
    }
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
        let s = generate(
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
        let s = generate(&pod("Always"), &st, &none, "containerd", &[node], false);
        assert_eq!(s.host_ip.as_deref(), Some("192.168.1.20"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.5"));
        let mut hn = pod("Always");
        if let Some(spec) = hn.spec.as_mut() {
            spec.host_network = Some(true);
        }
        let s = generate(&hn, &st, &none, "containerd", &[node], false);
        assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.20"));
    }

    #[test]
    fn crash_loop_shows_waiting_with_last_state() {
        let w = |_: &str| Some(("CrashLoopBackOff", "back-off 10s".to_string()));
        let s = generate(
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
            let s = generate(
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
        let s = generate(
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
            let running = generate(&p, &st, &none, "containerd", &[], false);
            let terminal = generate(&p, &st, &none, "containerd", &[], true);
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
        let s = generate(&static_pod, &st, &none, "containerd", &[], true);
        assert_eq!(
            s.phase.as_deref(),
            Some("Running"),
            "static pods are exempt"
        );
    }
}
