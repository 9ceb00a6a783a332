//! Fakes for tests and benchmarks: a runtime whose `ExecSync` answers are
//! scripted per container (upstream tests use `containertest.FakeRuntime`
//! with `ExecSync` results), and a recorder that keeps events.

use std::collections::HashMap;
use std::time::Duration;

use cri::{CriError, RuntimeService, pb};
use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::{EventType, Recorder};
use parking_lot::Mutex;

/// What `ExecSync` does for one container.
#[derive(Clone, Debug)]
pub enum Exec {
    /// The command exits with this code and output.
    Exit {
        /// Exit code.
        code: i32,
        /// Stdout.
        stdout: String,
        /// Stderr.
        stderr: String,
    },
    /// The command runs past its timeout: the runtime answers DeadlineExceeded
    /// once the timeout has passed.
    Hang,
    /// The runtime fails the call with `NotFound`.
    NotFound,
}

impl Exec {
    /// Exit with `code` and `stdout`.
    pub fn exit(code: i32, stdout: &str) -> Self {
        Exec::Exit {
            code,
            stdout: stdout.to_string(),
            stderr: String::new(),
        }
    }
}

/// A runtime that only implements `ExecSync`.
#[derive(Default)]
pub struct FakeExec {
    script: Mutex<HashMap<String, Exec>>,
    calls: Mutex<Vec<(String, Vec<String>, Duration)>>,
}

impl FakeExec {
    /// A runtime whose commands exit 0 until told otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scripts `ExecSync` in container `id` (the bare runtime ID).
    pub fn set(&self, id: &str, exec: Exec) {
        self.script.lock().insert(id.to_string(), exec);
    }

    /// Every `ExecSync` call so far: container ID, command, timeout.
    pub fn calls(&self) -> Vec<(String, Vec<String>, Duration)> {
        self.calls.lock().clone()
    }

    /// How many `ExecSync` calls went to container `id`.
    pub fn count(&self, id: &str) -> usize {
        self.calls.lock().iter().filter(|c| c.0 == id).count()
    }
}

fn unimplemented(op: &'static str) -> CriError {
    CriError::Rpc {
        op,
        code: cri::Code::Unimplemented,
        message: "fake exec runtime".into(),
    }
}

#[async_trait::async_trait]
impl RuntimeService for FakeExec {
    async fn version(&self) -> cri::Result<pb::VersionResponse> {
        Err(unimplemented("Version"))
    }
    async fn status(&self) -> cri::Result<pb::StatusResponse> {
        Err(unimplemented("Status"))
    }
    async fn run_pod_sandbox(&self, _: pb::PodSandboxConfig, _: &str) -> cri::Result<String> {
        Err(unimplemented("RunPodSandbox"))
    }
    async fn stop_pod_sandbox(&self, _: &str) -> cri::Result<()> {
        Err(unimplemented("StopPodSandbox"))
    }
    async fn remove_pod_sandbox(&self, _: &str) -> cri::Result<()> {
        Err(unimplemented("RemovePodSandbox"))
    }
    async fn pod_sandbox_status(&self, _: &str) -> cri::Result<pb::PodSandboxStatus> {
        Err(unimplemented("PodSandboxStatus"))
    }
    async fn list_pod_sandbox(
        &self,
        _: Option<pb::PodSandboxFilter>,
    ) -> cri::Result<Vec<pb::PodSandbox>> {
        Err(unimplemented("ListPodSandbox"))
    }
    async fn create_container(
        &self,
        _: &str,
        _: pb::ContainerConfig,
        _: pb::PodSandboxConfig,
    ) -> cri::Result<String> {
        Err(unimplemented("CreateContainer"))
    }
    async fn start_container(&self, _: &str) -> cri::Result<()> {
        Err(unimplemented("StartContainer"))
    }
    async fn stop_container(&self, _: &str, _: Duration) -> cri::Result<()> {
        Err(unimplemented("StopContainer"))
    }
    async fn remove_container(&self, _: &str) -> cri::Result<()> {
        Err(unimplemented("RemoveContainer"))
    }
    async fn list_containers(
        &self,
        _: Option<pb::ContainerFilter>,
    ) -> cri::Result<Vec<pb::Container>> {
        Err(unimplemented("ListContainers"))
    }
    async fn container_status(&self, _: &str) -> cri::Result<pb::ContainerStatus> {
        Err(unimplemented("ContainerStatus"))
    }
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> cri::Result<pb::ExecSyncResponse> {
        self.calls.lock().push((id.to_string(), cmd, timeout));
        let exec = self
            .script
            .lock()
            .get(id)
            .cloned()
            .unwrap_or_else(|| Exec::exit(0, ""));
        match exec {
            Exec::Exit {
                code,
                stdout,
                stderr,
            } => Ok(pb::ExecSyncResponse {
                stdout: stdout.into_bytes(),
                stderr: stderr.into_bytes(),
                exit_code: code,
            }),
            Exec::Hang => {
                tokio::time::sleep(timeout).await;
                Err(CriError::Timeout {
                    op: "ExecSync",
                    timeout,
                })
            }
            Exec::NotFound => Err(CriError::NotFound {
                op: "ExecSync",
                message: format!("container {id} not found"),
            }),
        }
    }
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The object's field path (`spec.containers{name}`).
    pub field_path: Option<String>,
    /// Normal or Warning.
    pub kind: EventType,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// A recorder that keeps every event.
#[derive(Default)]
pub struct FakeRecorder {
    events: Mutex<Vec<Event>>,
}

impl FakeRecorder {
    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

impl Recorder for FakeRecorder {
    fn event(&self, object: &ObjectReference, kind: EventType, reason: &str, message: String) {
        self.events.lock().push(Event {
            field_path: object.field_path.clone(),
            kind,
            reason: reason.to_string(),
            message,
        });
    }
}
