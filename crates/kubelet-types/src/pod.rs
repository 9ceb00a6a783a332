//! Small read-only helpers over `Pod` and `Container` (upstream
//! `pkg/kubelet/container/helpers.go`, `pkg/kubelet/util/format`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};

/// Upstream `minimumGracePeriodInSeconds`: no container is stopped faster than this.
pub const MIN_GRACE_PERIOD: Duration = Duration::from_secs(2);
/// Default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

/// A pod's restart policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart whatever the exit code.
    Always,
    /// Restart only on a non-zero exit code.
    OnFailure,
    /// Never restart.
    Never,
}

/// The pod's UID, or "" when it has none.
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// The pod's name.
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// The pod's namespace (`default` when unset).
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `name_namespace`, upstream's `kubecontainer.GetPodFullName`.
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}", name(pod), namespace(pod))
}

/// `namespace/name(uid)` for logs, as upstream `format.Pod`.
pub fn describe(pod: &Pod) -> String {
    format!("{}/{}({})", namespace(pod), name(pod), uid(pod))
}

/// `name_namespace(uid)`, upstream `format.Pod` as it appears in lifecycle
/// hook messages.
pub fn format_pod(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}

/// The pod's restart policy (Always when unset, as the apiserver defaults it).
pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
        Some("Never") => RestartPolicy::Never,
        Some("OnFailure") => RestartPolicy::OnFailure,
        _ => RestartPolicy::Always,
    }
}

/// The pod's app containers.
pub fn containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[])
}

/// The pod's init containers.
pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

/// True for an init container with `restartPolicy: Always`: a sidecar that
/// keeps running beside the app containers (upstream
/// `types.IsRestartableInitContainer`).
pub fn is_restartable_init_container(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// True when any init container of the pod is a sidecar (upstream
/// `types.HasRestartableInitContainer`).
pub fn has_restartable_init_container(pod: &Pod) -> bool {
    init_containers(pod)
        .iter()
        .any(is_restartable_init_container)
}

/// Grace period to stop the pod's containers: the deletion grace period when the
/// pod is being deleted, else `terminationGracePeriodSeconds`, never under 2s.
pub fn grace_period(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0)).max(MIN_GRACE_PERIOD)
}

/// True for a pod from a static source, a file or a URL (upstream
/// `kubetypes.IsStaticPod`: the `kubernetes.io/config.source` annotation).
pub fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::labels::CONFIG_SOURCE))
        .is_some_and(|s| s == "file" || s == "http")
}

/// True when the pod uses the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Hash of the container fields whose change restarts it, stored on the
/// container (upstream 1.31+ `HashContainer`; see [`crate::hash`]).
pub fn container_hash(container: &Container) -> String {
    crate::hash::container_hash(container)
}

/// Image pull policy, defaulted from the tag as the apiserver does: `Always` for
/// `:latest` or no tag (digests excepted), else `IfNotPresent`.
pub fn image_pull_policy(container: &Container) -> &str {
    match container.image_pull_policy.as_deref() {
        Some(p @ ("Always" | "IfNotPresent" | "Never")) => p,
        _ => default_pull_policy(container.image.as_deref().unwrap_or("")),
    }
}

/// The default pull policy for an image reference.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    // The tag is what follows the last ':' after the last '/' (a registry port is not a tag).
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults_by_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(
            default_pull_policy("localhost:5000/busybox:1.35"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn grace_period_floor_and_deletion_override() {
        let mut pod = Pod::default();
        assert_eq!(grace_period(&pod), Duration::from_secs(30));
        pod.spec = Some(Default::default());
        if let Some(s) = pod.spec.as_mut() {
            s.termination_grace_period_seconds = Some(0);
        }
        assert_eq!(grace_period(&pod), MIN_GRACE_PERIOD);
        pod.metadata.deletion_grace_period_seconds = Some(7);
        assert_eq!(grace_period(&pod), Duration::from_secs(7));
    }

    #[test]
    fn restartable_init_containers() {
        let mut c = Container::default();
        assert!(!is_restartable_init_container(&c));
        c.restart_policy = Some("Always".into());
        assert!(is_restartable_init_container(&c));
        let mut pod = Pod::default();
        assert!(!has_restartable_init_container(&pod));
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            init_containers: Some(vec![Container::default(), c]),
            ..Default::default()
        });
        assert!(has_restartable_init_container(&pod));
    }

    #[test]
    fn hash_follows_the_spec() {
        let a = Container {
            name: "a".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        assert_eq!(container_hash(&a), container_hash(&b));
        // Fix 4.5: as upstream 1.31+, only name and image restart a container.
        b.command = Some(vec!["sleep".into()]);
        assert_eq!(container_hash(&a), container_hash(&b));
        b.image = Some("busybox:1.37".into());
        assert_ne!(container_hash(&a), container_hash(&b));
    }
}
