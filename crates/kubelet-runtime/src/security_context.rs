//! Security contexts for CRI (upstream `kuberuntime/security_context.go`
//! `determineEffectiveSecurityContext`, `security_context_linux.go`,
//! `helpers.go` `namespacesForPod` and `fieldSeccompProfile`,
//! `getAppArmorProfile`, and `security_context_others.go`
//! `verifyRunAsNonRoot`): the pod's and each container's `securityContext`
//! turned into CRI sandbox and container security contexts (SELinux
//! options, seccomp with `seccompDefault`, the sandbox always on the
//! runtime's default seccomp profile), the seccomp check that fails a
//! container rather than leave it unconfined, and the `runAsNonRoot` check
//! against the image's user.

use std::path::Path;

use cri::pb;
use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};
use kubelet_types::pod;

/// Why a container may not start under `runAsNonRoot` (upstream
/// `verifyRunAsNonRoot`); the text is upstream's message, shown as the
/// `CreateContainerConfigError` waiting message.
#[derive(Debug, thiserror::Error)]
pub enum NonRootError {
    /// `runAsUser` is 0.
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot {
        /// Upstream `format.Pod`: `name_namespace(uid)`.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// The image names its user by name only.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericUser {
        /// The image's user name.
        user: String,
        /// Upstream `format.Pod`.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// The image runs as uid 0 (or names no user at all).
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRoot {
        /// Upstream `format.Pod`.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// The runtime could not tell the image's user (upstream passes the
    /// runtime's message on).
    #[error("{}", .0.message())]
    ImageStatus(#[source] cri::CriError),
    /// The image's uid is outside 1..=2^31-1.
    #[error(
        "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive (pod: {pod:?}, container: {container})"
    )]
    InvalidUid {
        /// The image's uid.
        uid: i64,
        /// Upstream `format.Pod`.
        pod: String,
        /// The container's name.
        container: String,
    },
}

/// Upstream `getImageUser` then `verifyRunAsNonRoot`, for a container whose
/// effective `runAsNonRoot` is true (others skip the image lookup).
pub(crate) async fn check_non_root(
    images: &crate::images::ImageManager,
    p: &Pod,
    c: &Container,
    image_ref: &str,
) -> Result<(), NonRootError> {
    let (non_root, run_as_user) = effective_non_root(p, c);
    if non_root != Some(true) || run_as_user.is_some() {
        return verify_run_as_non_root(p, c, None, "");
    }
    let (uid, username) = images
        .image_user(image_ref)
        .await
        .map_err(NonRootError::ImageStatus)?;
    verify_run_as_non_root(p, c, uid, &username)
}

/// Upstream `format.Pod`: `name_namespace(uid)`.
fn format_pod(p: &Pod) -> String {
    format!("{}_{}({})", pod::name(p), pod::namespace(p), pod::uid(p))
}

/// The container's `runAsNonRoot`/`runAsUser`, its own over the pod's.
fn effective_non_root(p: &Pod, c: &Container) -> (Option<bool>, Option<i64>) {
    let sc = c.security_context.as_ref();
    let psc = p.spec.as_ref().and_then(|s| s.security_context.as_ref());
    (
        sc.and_then(|s| s.run_as_non_root)
            .or_else(|| psc.and_then(|s| s.run_as_non_root)),
        sc.and_then(|s| s.run_as_user)
            .or_else(|| psc.and_then(|s| s.run_as_user)),
    )
}

/// Upstream `verifyRunAsNonRoot`: with `runAsNonRoot` true the container
/// must not run as uid 0, judged by `runAsUser` or else the image's user
/// (`uid`, or `username` when the image names it by name; neither means root,
/// as upstream `getImageUser`).
pub fn verify_run_as_non_root(
    p: &Pod,
    c: &Container,
    uid: Option<i64>,
    username: &str,
) -> Result<(), NonRootError> {
    let (non_root, run_as_user) = effective_non_root(p, c);
    if non_root != Some(true) {
        return Ok(());
    }
    let (pod, container) = (format_pod(p), c.name.clone());
    if let Some(u) = run_as_user {
        return if u == 0 {
            Err(NonRootError::RunAsUserRoot { pod, container })
        } else {
            Ok(())
        };
    }
    match uid {
        None if !username.is_empty() => Err(NonRootError::NonNumericUser {
            user: username.to_string(),
            pod,
            container,
        }),
        Some(0) => Err(NonRootError::ImageRoot { pod, container }),
        Some(u) if !(0..=i64::from(i32::MAX)).contains(&u) => Err(NonRootError::InvalidUid {
            uid: u,
            pod,
            container,
        }),
        _ => Ok(()),
    }
}

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
    root_dir: &Path,
    seccomp_default: bool,
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
        supplemental_groups_policy: supplemental_groups_policy(psc),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: masked,
        readonly_paths: readonly,
        seccomp: Some(seccomp(
            container_seccomp_field(p, c),
            annotation(p, &format!("{CONTAINER_SECCOMP_PREFIX}{}", c.name))
                .or_else(|| annotation(p, POD_SECCOMP)),
            root_dir,
            seccomp_default,
        )),
        apparmor: apparmor(p, c),
        selinux_options: selinux_options(
            sc.and_then(|s| s.se_linux_options.as_ref())
                .or_else(|| psc.and_then(|s| s.se_linux_options.as_ref())),
        ),
        ..Default::default()
    }
}

/// The container's `seccompProfile`, else the pod's.
fn container_seccomp_field<'a>(
    p: &'a Pod,
    c: &'a Container,
) -> Option<&'a k8s_openapi::api::core::v1::SeccompProfile> {
    c.security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| {
            p.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.seccomp_profile.as_ref())
        })
}

/// Upstream `fieldSeccompProfile`'s refusal: a `Localhost` profile without
/// `localhostProfile` fails the container (`CreateContainerConfigError`);
/// it never runs unconfined instead. The apiserver refuses such pods; a
/// static pod can still ask.
pub(crate) fn check_seccomp(p: &Pod, c: &Container) -> Result<(), String> {
    match container_seccomp_field(p, c) {
        Some(s)
            if s.type_ == "Localhost"
                && s.localhost_profile.as_deref().unwrap_or("").is_empty() =>
        {
            Err("localhostProfile must be set if seccompProfile type is Localhost.".into())
        }
        _ => Ok(()),
    }
}

/// Upstream `convertToRuntimeSELinuxOption`.
fn selinux_options(
    o: Option<&k8s_openapi::api::core::v1::SELinuxOptions>,
) -> Option<pb::SeLinuxOption> {
    o.map(|o| pb::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    })
}

/// Upstream `apparmor.GetProfile` and `getAppArmorProfile`: the container's
/// `appArmorProfile`, then the deprecated
/// `container.apparmor.security.beta.kubernetes.io/<name>` annotation, then
/// the pod's field; none leaves the runtime's default.
pub(crate) fn apparmor(p: &Pod, c: &Container) -> Option<pb::SecurityProfile> {
    use pb::security_profile::ProfileType;
    let field = |sc: Option<&k8s_openapi::api::core::v1::AppArmorProfile>| {
        sc.map(|a| (a.type_.clone(), a.localhost_profile.clone()))
    };
    let annotation = || {
        let key = format!("container.apparmor.security.beta.kubernetes.io/{}", c.name);
        let v = p.metadata.annotations.as_ref()?.get(&key)?;
        match v.as_str() {
            "runtime/default" => Some(("RuntimeDefault".to_string(), None)),
            "unconfined" => Some(("Unconfined".to_string(), None)),
            v => v
                .strip_prefix("localhost/")
                .map(|name| ("Localhost".to_string(), Some(name.to_string()))),
        }
    };
    let (kind, name) = field(
        c.security_context
            .as_ref()
            .and_then(|s: &SecurityContext| s.app_armor_profile.as_ref()),
    )
    .or_else(annotation)
    .or_else(|| {
        field(
            p.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.app_armor_profile.as_ref()),
        )
    })?;
    let (profile_type, localhost_ref) = match (kind.as_str(), name) {
        ("RuntimeDefault", _) => (ProfileType::RuntimeDefault, String::new()),
        ("Unconfined", _) => (ProfileType::Unconfined, String::new()),
        ("Localhost", Some(n)) if !n.is_empty() => (ProfileType::Localhost, n),
        _ => {
            tracing::warn!(container = %c.name, kind, "Invalid AppArmor profile; the runtime's default applies");
            return None;
        }
    };
    Some(pb::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    })
}

/// The sandbox's security context: the pod's user, groups, namespaces and
/// SELinux options; privileged when any container is; always the runtime's
/// default seccomp profile (upstream forces it, so that pods may give their
/// containers a stricter one: kubernetes#84623).
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
        supplemental_groups_policy: supplemental_groups_policy(psc),
        privileged,
        seccomp: Some(pb::SecurityProfile {
            profile_type: pb::security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        selinux_options: selinux_options(psc.and_then(|s| s.se_linux_options.as_ref())),
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

/// The pod's `supplementalGroupsPolicy` as CRI's enum (upstream
/// `determineEffectiveSecurityContext`): `Strict` keeps the image's
/// `/etc/group` memberships out; `Merge` (the default) keeps them.
fn supplemental_groups_policy(psc: Option<&k8s_openapi::api::core::v1::PodSecurityContext>) -> i32 {
    match psc.and_then(|s| s.supplemental_groups_policy.as_deref()) {
        Some("Strict") => pb::SupplementalGroupsPolicy::Strict as i32,
        _ => pb::SupplementalGroupsPolicy::Merge as i32,
    }
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

/// A seccomp profile (upstream `helpers_linux.go`): the `seccompProfile`
/// field first, then the deprecated annotation pods from older clusters and
/// old manifests carry (`runtime/default`, `docker/default`,
/// `localhost/<path>`, `unconfined`; upstream stopped reading them in 1.27,
/// kubelet-rs keeps them for the 1.19+ clusters it joins); when neither is
/// set, the runtime's default with `seccompDefault`, else Unconfined, as
/// upstream. A Localhost profile is the file
/// `<root-dir>/seccomp/<localhostProfile>`, joined as Go's `filepath.Join`
/// (an absolute name stays under it; `..` climbs out, as upstream's). An
/// unknown profile type gets the runtime's default (upstream: Unconfined;
/// the apiserver refuses unknown types, a static pod may not). A Localhost profile without a name is refused before
/// ([`check_seccomp`]); should one get here, the runtime's default applies,
/// never Unconfined.
pub(crate) fn seccomp(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    annotation: Option<&str>,
    root_dir: &Path,
    seccomp_default: bool,
) -> pb::SecurityProfile {
    use pb::security_profile::ProfileType;
    let localhost = |path: &str| pb::SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: kubelet_types::path::join(&root_dir.join("seccomp").to_string_lossy(), path),
    };
    let of = |t: ProfileType| pb::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: String::new(),
    };
    if let Some(p) = profile {
        return match (p.type_.as_str(), p.localhost_profile.as_deref()) {
            ("Unconfined", _) => of(ProfileType::Unconfined),
            ("Localhost", Some(path)) if !path.is_empty() => localhost(path),
            _ => of(ProfileType::RuntimeDefault),
        };
    }
    match annotation {
        Some("runtime/default" | "docker/default") => of(ProfileType::RuntimeDefault),
        Some(a) if a.starts_with("localhost/") => localhost(a.trim_start_matches("localhost/")),
        Some("unconfined") => of(ProfileType::Unconfined),
        _ if seccomp_default => of(ProfileType::RuntimeDefault),
        _ => of(ProfileType::Unconfined),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let root = Path::new("/var/lib/kubelet");
        let sc = |i: usize| {
            security_context(&p, &kubelet_types::pod::containers(&p)[i], root, false)
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
        let sandbox = sandbox_security_context(&p).seccomp.expect("seccomp");
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
            security_context(&p, c, Path::new("/var/lib/kubelet"), false).supplemental_groups,
            vec![1001, 5, 6]
        );
        assert_eq!(
            sandbox_security_context(&p).supplemental_groups,
            vec![1001, 5, 6]
        );
    }
}

#[cfg(test)]
mod mapping_tests;
