//! Well-known labels and annotations (upstream `pkg/kubelet/types/labels.go`,
//! `pkg/kubelet/kuberuntime/labels.go`, `pkg/kubelet/types/pod_update.go`).

/// Pod name label on sandboxes and containers.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod namespace label on sandboxes and containers.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod UID label on sandboxes and containers.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Container name label.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Container annotation: hash of the container spec.
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Container annotation (kubelet-rs' own): the algorithm of `io.kubernetes.container.hash`.
pub const CONTAINER_HASH_VERSION: &str = crate::hash::HASH_VERSION_ANNOTATION;
/// Container annotation: restart count of this instance.
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Container annotation: termination message path.
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Container annotation: termination message policy.
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// Container annotation: pod termination grace period in seconds.
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Container annotation: JSON of the container ports.
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Container annotation: the preStop handler as JSON, which upstream reads to
/// run the hook when it kills a container whose pod spec it no longer has.
pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";

/// Pod annotation: which source the pod came from.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// Pod annotation: the static pod's hash (its UID).
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// Pod annotation: when the kubelet first saw the pod (RFC 3339 with nanoseconds).
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// Pod annotation on mirror pods.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
