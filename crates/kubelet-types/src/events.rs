//! Events the kubelet records (upstream `pkg/kubelet/events`): reasons, the
//! object references they point at, and the [`Recorder`] seam the runtime
//! manager and node status write to.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

use crate::pod;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// Upstream event reasons.
pub mod reason {
    /// Container created.
    pub const CREATED: &str = "Created";
    /// Container started.
    pub const STARTED: &str = "Started";
    /// Container failed (create/start), image pull failed.
    pub const FAILED: &str = "Failed";
    /// Container being stopped.
    pub const KILLING: &str = "Killing";
    /// Back-off restarting or pulling.
    pub const BACK_OFF: &str = "BackOff";
    /// Pulling an image.
    pub const PULLING: &str = "Pulling";
    /// Image pulled or present.
    pub const PULLED: &str = "Pulled";
    /// Sandbox creation failed.
    pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
    /// Sandbox changed; it will be killed and re-created.
    pub const SANDBOX_CHANGED: &str = "SandboxChanged";
    /// Sync failed.
    pub const FAILED_SYNC: &str = "FailedSync";
    /// Kubelet starting.
    pub const STARTING: &str = "Starting";
    /// Probe failed.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// A volume could not be set up (upstream `FailedMountVolume`).
    pub const FAILED_MOUNT: &str = "FailedMount";
    /// A postStart hook failed (upstream `FailedPostStartHook`).
    pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
    /// A preStop hook failed (upstream `FailedPreStopHook`).
    pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
    /// The runtime did not stop a pod within its grace period (upstream
    /// `ExceededGracePeriod`, recorded by the pod workers' kill function).
    pub const EXCEEDED_GRACE_PERIOD: &str = "ExceededGracePeriod";
    /// An HTTPS lifecycle hook succeeded only over plain HTTP (upstream
    /// `LifecycleHTTPFallback`).
    pub const LIFECYCLE_HTTP_FALLBACK: &str = "LifecycleHTTPFallback";
}

/// Records events; implementations must not block.
pub trait Recorder: Send + Sync {
    /// Records one event about `object`.
    fn event(&self, object: &ObjectReference, kind: EventType, reason: &str, message: String);
}

/// Drops every event (standalone mode).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopRecorder;

impl Recorder for NoopRecorder {
    fn event(&self, _: &ObjectReference, _: EventType, _: &str, _: String) {}
}

/// A reference to a pod, or to one of its containers (`spec.containers{name}`).
pub fn pod_ref(p: &Pod, container: Option<&str>) -> ObjectReference {
    let field_path = container.map(|c| {
        let init = pod::init_containers(p).iter().any(|ic| ic.name == c);
        let ephemeral = p
            .spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_ref())
            .is_some_and(|ecs| ecs.iter().any(|ec| ec.name == c));
        if init {
            format!("spec.initContainers{{{c}}}")
        } else if ephemeral {
            format!("spec.ephemeralContainers{{{c}}}")
        } else {
            format!("spec.containers{{{c}}}")
        }
    });
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod::name(p).to_string()),
        namespace: Some(pod::namespace(p).to_string()),
        uid: Some(pod::uid(p).to_string()),
        field_path,
        ..Default::default()
    }
}

/// The node as upstream refers to it in events (its UID is the node name).
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    }
}
