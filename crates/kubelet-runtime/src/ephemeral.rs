//! Ephemeral containers (upstream `kuberuntime_manager.go`
//! `computePodActions`' `EphemeralContainersToStart`, and
//! `kuberuntime_container.go` `ephemeralContainerStartSpec`, `getTargetID`,
//! `generateLinuxContainerConfig`'s `NamespaceMode_TARGET`).
//!
//! An ephemeral container (`kubectl debug`) is added to a running pod
//! through the `ephemeralcontainers` subresource. The kubelet starts it
//! once, never restarts it and never stops it on its own; it goes with the
//! pod. With `targetContainerName` it joins that container's PID namespace.

use cri::pb;
use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

use crate::pod_status::{ContainerState, PodStatus};

/// The pod's ephemeral containers, in spec order.
pub fn ephemeral_containers(p: &Pod) -> &[EphemeralContainer] {
    p.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or(&[])
}

/// The container an ephemeral container runs as (upstream
/// `v1.Container(ec.EphemeralContainerCommon)`): every field but
/// `targetContainerName`.
pub fn as_container(ec: &EphemeralContainer) -> Container {
    let ec = ec.clone();
    Container {
        args: ec.args,
        command: ec.command,
        env: ec.env,
        env_from: ec.env_from,
        image: ec.image,
        image_pull_policy: ec.image_pull_policy,
        lifecycle: ec.lifecycle,
        liveness_probe: ec.liveness_probe,
        name: ec.name,
        ports: ec.ports,
        readiness_probe: ec.readiness_probe,
        resize_policy: ec.resize_policy,
        resources: ec.resources,
        restart_policy: ec.restart_policy,
        security_context: ec.security_context,
        startup_probe: ec.startup_probe,
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        termination_message_path: ec.termination_message_path,
        termination_message_policy: ec.termination_message_policy,
        tty: ec.tty,
        volume_devices: ec.volume_devices,
        volume_mounts: ec.volume_mounts,
        working_dir: ec.working_dir,
    }
}

/// Indexes of the ephemeral containers the runtime has never seen: each
/// starts once, whatever became of it later (upstream: "Ephemeral
/// Containers are never restarted").
pub fn to_start(p: &Pod, status: &PodStatus) -> Vec<usize> {
    ephemeral_containers(p)
        .iter()
        .enumerate()
        .filter(|(_, ec)| status.find_container(&ec.name).is_none())
        .map(|(i, _)| i)
        .collect()
}

/// Upstream `getTargetID`: the runtime ID of the running container whose
/// PID namespace `ec` targets, `Ok(None)` without a target, and upstream's
/// message when the target is not running.
pub fn target_id(ec: &EphemeralContainer, status: &PodStatus) -> Result<Option<String>, String> {
    let Some(target) = ec
        .target_container_name
        .as_deref()
        .filter(|t| !t.is_empty())
    else {
        return Ok(None);
    };
    match status.find_container(target) {
        Some(s) if s.state == ContainerState::Running => Ok(Some(s.id.clone())),
        _ => Err(format!("unable to find target container {target}")),
    }
}

/// Puts the container in the PID namespace of container `target`, when it
/// would otherwise have its own (upstream: only a `CONTAINER` PID mode
/// becomes `TARGET`; a shared-process or host-PID pod keeps its mode).
pub fn apply_target(cfg: &mut pb::ContainerConfig, target: &str) {
    let Some(ns) = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    else {
        return;
    };
    if ns.pid == pb::NamespaceMode::Container as i32 {
        ns.pid = pb::NamespaceMode::Target as i32;
        ns.target_id = target.to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_status::ContainerStatus;
    use serde_json::json;

    fn pod(share_pid: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"shareProcessNamespace": share_pid,
                "containers": [{"name": "app", "image": "busybox"}],
                "ephemeralContainers": [
                    {"name": "debugger", "image": "busybox", "targetContainerName": "app",
                     "stdin": true, "tty": true, "command": ["sh"]},
                    {"name": "debugger2", "image": "agnhost"}]}
        }))
        .expect("pod")
    }

    fn instance(name: &str, state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            id: format!("id-{name}"),
            name: name.into(),
            state,
            ..Default::default()
        }
    }

    #[test]
    fn the_container_keeps_every_common_field() {
        let p = pod(false);
        let c = as_container(&ephemeral_containers(&p)[0]);
        assert_eq!(c.name, "debugger");
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
        assert_eq!(c.command, Some(vec!["sh".to_string()]));
    }

    #[test]
    fn each_starts_once_and_is_never_restarted() {
        let p = pod(false);
        let mut s = PodStatus::default();
        assert_eq!(to_start(&p, &s), vec![0, 1]);
        s.containers
            .push(instance("debugger", ContainerState::Exited));
        s.containers
            .push(instance("debugger2", ContainerState::Created));
        assert_eq!(to_start(&p, &s), Vec::<usize>::new());
    }

    #[test]
    fn the_target_must_be_running() {
        let p = pod(false);
        let ec = &ephemeral_containers(&p)[0];
        let mut s = PodStatus::default();
        assert_eq!(
            target_id(ec, &s),
            Err("unable to find target container app".into())
        );
        s.containers.push(instance("app", ContainerState::Exited));
        assert!(target_id(ec, &s).is_err());
        s.containers
            .insert(0, instance("app", ContainerState::Running));
        assert_eq!(target_id(ec, &s), Ok(Some("id-app".into())));
        assert_eq!(target_id(&ephemeral_containers(&p)[1], &s), Ok(None));
    }

    fn config(p: &Pod) -> pb::ContainerConfig {
        let c = as_container(&ephemeral_containers(p)[0]);
        crate::container::container_config(&Default::default(), p, &c, 0, "sha256:x", None)
    }

    #[test]
    fn a_target_shares_its_pid_namespace_unless_the_pod_shares_one() {
        let p = pod(false);
        let mut cfg = config(&p);
        apply_target(&mut cfg, "id-app");
        let ns = cfg
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .expect("namespace options");
        assert_eq!(ns.pid, pb::NamespaceMode::Target as i32);
        assert_eq!(ns.target_id, "id-app");
        // A pod that shares one PID namespace keeps it.
        let p = pod(true);
        let mut cfg = config(&p);
        apply_target(&mut cfg, "id-app");
        let ns = cfg
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .expect("namespace options");
        assert_eq!(ns.pid, pb::NamespaceMode::Pod as i32);
        assert!(ns.target_id.is_empty());
    }
}
