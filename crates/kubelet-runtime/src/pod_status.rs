//! What the runtime holds for one pod (upstream `kubecontainer.PodStatus`):
//! its sandboxes and every container instance, newest first, read back from
//! CRI labels and annotations so a restarted kubelet knows what it started.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cri::pb;
use kubelet_types::labels;

/// State of one container instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

impl ContainerState {
    /// From the CRI enum value.
    pub fn from_cri(state: i32) -> Self {
        match pb::ContainerState::try_from(state) {
            Ok(pb::ContainerState::ContainerCreated) => Self::Created,
            Ok(pb::ContainerState::ContainerRunning) => Self::Running,
            Ok(pb::ContainerState::ContainerExited) => Self::Exited,
            _ => Self::Unknown,
        }
    }
}

/// One container instance as the runtime reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerStatus {
    /// Runtime container ID.
    pub id: String,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// Container name from the pod spec.
    pub name: String,
    /// State.
    pub state: ContainerState,
    /// Creation time.
    pub created_at: SystemTime,
    /// Start time, if started.
    pub started_at: Option<SystemTime>,
    /// Finish time, if exited.
    pub finished_at: Option<SystemTime>,
    /// Exit code (meaningful once exited).
    pub exit_code: i32,
    /// Image as requested.
    pub image: String,
    /// Image ID the runtime resolved.
    pub image_ref: String,
    /// Hash of the spec this instance was created from (`io.kubernetes.container.hash`).
    pub hash: String,
    /// kubelet-rs' hash version annotation; `None` on containers from upstream
    /// kubelets and from kubelet-rs before versions (see [`kubelet_types::hash::check`]).
    pub hash_version: Option<String>,
    /// Restart count of this instance.
    pub restart_count: i32,
    /// Runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Runtime's message.
    pub message: String,
}

impl Default for ContainerStatus {
    /// An unnamed, unknown instance created at the epoch (for tests and builders).
    fn default() -> Self {
        Self {
            id: String::new(),
            sandbox_id: String::new(),
            name: String::new(),
            state: ContainerState::Unknown,
            created_at: UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            exit_code: 0,
            image: String::new(),
            image_ref: String::new(),
            hash: String::new(),
            hash_version: None,
            restart_count: 0,
            reason: String::new(),
            message: String::new(),
        }
    }
}

/// Runtime state of one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodStatus {
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// IPs of the newest ready sandbox.
    pub ips: Vec<String>,
    /// Sandboxes, newest first.
    pub sandboxes: Vec<pb::PodSandboxStatus>,
    /// Container instances, newest first.
    pub containers: Vec<ContainerStatus>,
}

impl PodStatus {
    /// The newest instance of the named container.
    pub fn find_container(&self, name: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Every instance of the named container, newest first.
    pub fn instances<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a ContainerStatus> + 'a {
        self.containers.iter().filter(move |c| c.name == name)
    }

    /// Containers that are running or may still be (not exited).
    pub fn live_containers(&self) -> impl Iterator<Item = &ContainerStatus> {
        self.containers
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
    }

    /// True when a sandbox is ready.
    pub fn has_ready_sandbox(&self) -> bool {
        self.sandboxes
            .iter()
            .any(|s| s.state == pb::PodSandboxState::SandboxReady as i32)
    }
}

/// CRI nanoseconds to a wall-clock time; 0 means unset.
pub fn from_nanos(ns: i64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
}

/// Builds a container status from the CRI answer. The message is the
/// runtime's; the runtime manager replaces it with the termination message,
/// which it reads off the async runtime.
pub fn container_status_from_cri(s: &pb::ContainerStatus, sandbox_id: &str) -> ContainerStatus {
    let ann = |k: &str| s.annotations.get(k).cloned().unwrap_or_default();
    ContainerStatus {
        id: s.id.clone(),
        sandbox_id: sandbox_id.to_string(),
        name: s
            .labels
            .get(labels::CONTAINER_NAME)
            .cloned()
            .or_else(|| s.metadata.as_ref().map(|m| m.name.clone()))
            .unwrap_or_default(),
        state: ContainerState::from_cri(s.state),
        created_at: from_nanos(s.created_at).unwrap_or(UNIX_EPOCH),
        started_at: from_nanos(s.started_at),
        finished_at: from_nanos(s.finished_at),
        exit_code: s.exit_code,
        image: s
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        image_ref: if s.image_id.is_empty() {
            s.image_ref.clone()
        } else {
            s.image_id.clone()
        },
        hash: ann(labels::CONTAINER_HASH),
        hash_version: s.annotations.get(labels::CONTAINER_HASH_VERSION).cloned(),
        restart_count: ann(labels::CONTAINER_RESTART_COUNT).parse().unwrap_or(0),
        reason: s.reason.clone(),
        message: s.message.clone(),
    }
}
