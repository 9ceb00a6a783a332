//! Security contexts for CRI (upstream `kuberuntime/security_context.go`
//! `determineEffectiveSecurityContext`, `security_context_linux.go`,
//! `helpers.go` `namespacesForPod` and `helpers_linux.go` seccomp profiles):
//! the pod's and each container's `securityContext` turned into CRI
//! sandbox and container security contexts.

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::pod;

/// Paths masked in non-privileged containers (upstream `securitycontext` defaults).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Paths read-only in non-privileged containers.
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The container's effective security context: its own settings, falling
/// back to the pod's.
pub(crate) fn security_context(p: &Pod, c: &Container) -> pb::LinuxContainerSecurityContext {
    let sc = c.security_context.as_ref();
    let psc = p.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let proc_mount_unmasked = sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let (masked, readonly) = if privileged || proc_mount_unmasked {
        (vec![], vec![])
    } else {
        (
            MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
        )
    };
    pb::LinuxContainerSecurityContext {
        capabilities: caps.map(|c| pb::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespace_options(p)),
        run_as_user: sc
            .and_then(|s| s.run_as_user)
            .or_else(|| psc.and_then(|s| s.run_as_user))
            .map(|value| pb::Int64Value { value }),
        run_as_group: sc
            .and_then(|s| s.run_as_group)
            .or_else(|| psc.and_then(|s| s.run_as_group))
            .map(|value| pb::Int64Value { value }),
        readonly_rootfs: sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: supplemental_groups(psc),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: masked,
        readonly_paths: readonly,
        seccomp: Some(seccomp(
            sc.and_then(|s| s.seccomp_profile.as_ref())
                .or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref())),
        )),
        ..Default::default()
    }
}

/// The sandbox's security context: the pod's user, groups, namespaces and
/// seccomp profile; privileged when any container is.
pub(crate) fn sandbox_security_context(p: &Pod) -> pb::LinuxSandboxSecurityContext {
    let psc = p.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let privileged = pod::containers(p)
        .iter()
        .chain(pod::init_containers(p))
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    pb::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(p)),
        run_as_user: psc
            .and_then(|s| s.run_as_user)
            .map(|value| pb::Int64Value { value }),
        run_as_group: psc
            .and_then(|s| s.run_as_group)
            .map(|value| pb::Int64Value { value }),
        supplemental_groups: supplemental_groups(psc),
        privileged,
        seccomp: Some(seccomp(psc.and_then(|s| s.seccomp_profile.as_ref()))),
        ..Default::default()
    }
}

/// The pod's `fsGroup`, then its `supplementalGroups` (upstream
/// `determineEffectiveSecurityContext` and `generatePodSandboxLinuxConfig`):
/// the processes can use the volumes the fsGroup owns.
fn supplemental_groups(psc: Option<&k8s_openapi::api::core::v1::PodSecurityContext>) -> Vec<i64> {
    let Some(psc) = psc else { return vec![] };
    psc.fs_group
        .into_iter()
        .chain(psc.supplemental_groups.iter().flatten().copied())
        .collect()
}

/// Namespace options for sandbox and containers.
pub(crate) fn namespace_options(p: &Pod) -> pb::NamespaceOption {
    let spec = p.spec.as_ref();
    let node = pb::NamespaceMode::Node as i32;
    pb::NamespaceOption {
        network: if pod::host_network(p) {
            node
        } else {
            pb::NamespaceMode::Pod as i32
        },
        pid: if spec.and_then(|s| s.host_pid).unwrap_or(false) {
            node
        } else if spec
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false)
        {
            pb::NamespaceMode::Pod as i32
        } else {
            pb::NamespaceMode::Container as i32
        },
        ipc: if spec.and_then(|s| s.host_ipc).unwrap_or(false) {
            node
        } else {
            pb::NamespaceMode::Pod as i32
        },
        ..Default::default()
    }
}

/// A seccomp profile from the API's `seccompProfile`, Unconfined when unset (upstream default).
pub(crate) fn seccomp(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
) -> pb::SecurityProfile {
    use pb::security_profile::ProfileType;
    match profile.map(|p| (p.type_.as_str(), p.localhost_profile.clone())) {
        Some(("RuntimeDefault", _)) => pb::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        Some(("Localhost", Some(path))) => pb::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: path,
        },
        _ => pb::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fs_group_comes_first_in_the_supplemental_groups() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"securityContext": {"fsGroup": 1001, "supplementalGroups": [5, 6]},
                     "containers": [{"name": "c", "image": "i"}]}
        }))
        .expect("pod");
        let c = &pod::containers(&p)[0];
        assert_eq!(
            security_context(&p, c).supplemental_groups,
            vec![1001, 5, 6]
        );
        assert_eq!(
            sandbox_security_context(&p).supplemental_groups,
            vec![1001, 5, 6]
        );
    }
}
