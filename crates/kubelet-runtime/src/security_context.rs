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
pub(crate) fn security_context(
    p: &Pod,
    c: &Container,
    root_dir: &std::path::Path,
) -> pb::LinuxContainerSecurityContext {
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
            annotation(p, &format!("{CONTAINER_SECCOMP_PREFIX}{}", c.name))
                .or_else(|| annotation(p, POD_SECCOMP)),
            root_dir,
        )),
        apparmor: apparmor(p, c),
        ..Default::default()
    }
}

/// Whether the container's effective security context asks for a non-root
/// user (so its image's user must be checked).
pub(crate) fn run_as_non_root(p: &Pod, c: &Container) -> bool {
    let psc = p.spec.as_ref().and_then(|s| s.security_context.as_ref());
    c.security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false)
}

/// Upstream `verifyRunAsNonRoot`: with `runAsNonRoot`, the effective
/// `runAsUser` must not be 0, or else the image's user must be a non-zero
/// UID. The message is upstream's.
pub(crate) fn verify_run_as_non_root(
    p: &Pod,
    c: &Container,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), String> {
    if !run_as_non_root(p, c) {
        return Ok(());
    }
    let psc = p.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let run_as_user = c
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    let pod = pod::format_pod(p);
    if let Some(uid) = run_as_user {
        return if uid == 0 {
            Err(format!(
                "container's runAsUser breaks non-root policy (pod: {pod:?}, container: {})",
                c.name
            ))
        } else {
            Ok(())
        };
    }
    match image_uid {
        Some(0) => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {})",
            c.name
        )),
        None if !image_user.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({image_user}), cannot verify user is non-root (pod: {pod:?}, container: {})",
            c.name
        )),
        _ => Ok(()),
    }
}

/// The sandbox's security context: the pod's user, groups, namespaces and
/// seccomp profile; privileged when any container is.
pub(crate) fn sandbox_security_context(
    p: &Pod,
    root_dir: &std::path::Path,
) -> pb::LinuxSandboxSecurityContext {
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
        seccomp: Some(seccomp(
            psc.and_then(|s| s.seccomp_profile.as_ref()),
            annotation(p, POD_SECCOMP),
            root_dir,
        )),
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

/// The container's AppArmor profile (upstream `getAppArmorProfile`): the
/// container's `appArmorProfile`, the pod's, then the deprecated
/// `container.apparmor.security.beta.kubernetes.io/<name>` annotation;
/// none when unset (the runtime's default). Admission has already refused
/// a confined profile on a host without AppArmor.
fn apparmor(p: &Pod, c: &Container) -> Option<pb::SecurityProfile> {
    use pb::security_profile::ProfileType;
    let field = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| {
            p.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.app_armor_profile.as_ref())
        });
    let profile = |t: ProfileType, r: &str| pb::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: r.to_string(),
    };
    if let Some(f) = field {
        return Some(match (f.type_.as_str(), f.localhost_profile.as_deref()) {
            ("RuntimeDefault", _) => profile(ProfileType::RuntimeDefault, ""),
            ("Localhost", Some(name)) => profile(ProfileType::Localhost, name),
            _ => profile(ProfileType::Unconfined, ""),
        });
    }
    let a = annotation(
        p,
        &format!("container.apparmor.security.beta.kubernetes.io/{}", c.name),
    )?;
    Some(match a {
        "runtime/default" => profile(ProfileType::RuntimeDefault, ""),
        "unconfined" => profile(ProfileType::Unconfined, ""),
        other => profile(
            ProfileType::Localhost,
            other.trim_start_matches("localhost/"),
        ),
    })
}

/// The deprecated pod-level seccomp annotation older clusters send.
const POD_SECCOMP: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// The deprecated container-level seccomp annotation prefix.
const CONTAINER_SECCOMP_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A seccomp profile (upstream `helpers_linux.go` `getSeccompProfile`): the
/// `seccompProfile` field first, then the deprecated annotation
/// (`runtime/default`, `docker/default`, `localhost/<path>`, `unconfined`);
/// Unconfined when neither is set. Localhost profiles live under
/// `<root-dir>/seccomp`.
pub(crate) fn seccomp(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    annotation: Option<&str>,
    root_dir: &std::path::Path,
) -> pb::SecurityProfile {
    use pb::security_profile::ProfileType;
    let localhost = |path: &str| pb::SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: root_dir
            .join("seccomp")
            .join(path)
            .to_string_lossy()
            .into_owned(),
    };
    let of = |t: ProfileType| pb::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: String::new(),
    };
    if let Some(p) = profile {
        return match (p.type_.as_str(), p.localhost_profile.as_deref()) {
            ("RuntimeDefault", _) => of(ProfileType::RuntimeDefault),
            ("Localhost", Some(path)) => localhost(path),
            _ => of(ProfileType::Unconfined),
        };
    }
    match annotation {
        Some("runtime/default" | "docker/default") => of(ProfileType::RuntimeDefault),
        Some(a) if a.starts_with("localhost/") => localhost(a.trim_start_matches("localhost/")),
        _ => of(ProfileType::Unconfined),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_as_non_root_is_checked_against_the_user_and_the_image() {
        let p = |sc: serde_json::Value, csc: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"securityContext": sc, "containers": [{"name": "c", "image": "i", "securityContext": csc}]}
            }))
            .expect("pod")
        };
        let check = |pod: &Pod, uid: Option<i64>, user: &str| {
            verify_run_as_non_root(pod, &pod::containers(pod)[0], uid, user)
        };
        let plain = p(serde_json::json!({}), serde_json::json!({}));
        assert_eq!(
            check(&plain, Some(0), ""),
            Ok(()),
            "no runAsNonRoot: anything goes"
        );
        let nonroot = p(
            serde_json::json!({"runAsNonRoot": true}),
            serde_json::json!({}),
        );
        assert_eq!(
            check(&nonroot, Some(0), "").expect_err("root image"),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: c)"
        );
        assert_eq!(
            check(&nonroot, None, "nobody").expect_err("named user"),
            "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"p_ns(u)\", container: c)"
        );
        assert_eq!(check(&nonroot, Some(1000), ""), Ok(()));
        let root_user = p(
            serde_json::json!({"runAsNonRoot": true}),
            serde_json::json!({"runAsUser": 0}),
        );
        assert_eq!(
            check(&root_user, Some(1000), "").expect_err("runAsUser 0"),
            "container's runAsUser breaks non-root policy (pod: \"p_ns(u)\", container: c)"
        );
        let user = p(
            serde_json::json!({"runAsUser": 1234}),
            serde_json::json!({"runAsNonRoot": true}),
        );
        assert_eq!(
            check(&user, Some(0), ""),
            Ok(()),
            "a non-zero runAsUser wins over the image"
        );
    }

    #[test]
    fn seccomp_from_the_field_then_the_deprecated_annotations() {
        use pb::security_profile::ProfileType;
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
                "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
                "container.seccomp.security.alpha.kubernetes.io/b": "localhost/profiles/audit.json"}},
            "spec": {"containers": [
                {"name": "a", "image": "i"},
                {"name": "b", "image": "i"},
                {"name": "c", "image": "i", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]}
        }))
        .expect("pod");
        let root = std::path::Path::new("/var/lib/kubelet");
        let sc = |i: usize| {
            security_context(&p, &pod::containers(&p)[i], root)
                .seccomp
                .expect("seccomp")
        };
        assert_eq!(
            sc(0).profile_type,
            ProfileType::RuntimeDefault as i32,
            "pod annotation"
        );
        assert_eq!(
            (sc(1).profile_type, sc(1).localhost_ref.as_str()),
            (
                ProfileType::Localhost as i32,
                "/var/lib/kubelet/seccomp/profiles/audit.json"
            ),
            "container annotation, under <root-dir>/seccomp"
        );
        assert_eq!(
            sc(2).profile_type,
            ProfileType::Unconfined as i32,
            "the field wins"
        );
        let sandbox = sandbox_security_context(&p, root).seccomp.expect("seccomp");
        assert_eq!(sandbox.profile_type, ProfileType::RuntimeDefault as i32);
    }

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
            security_context(&p, c, std::path::Path::new("/var/lib/kubelet")).supplemental_groups,
            vec![1001, 5, 6]
        );
        assert_eq!(
            sandbox_security_context(&p, std::path::Path::new("/var/lib/kubelet"))
                .supplemental_groups,
            vec![1001, 5, 6]
        );
    }
}
