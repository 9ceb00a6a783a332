//! In-memory CRI runtime for unit tests and benchmarks (upstream
//! `pkg/kubelet/container/testing/fake_runtime.go` and cri-api's fake services).
//!
//! It keeps sandboxes, containers and images in maps, answers every trait call
//! as containerd would for the state it holds, records calls, and lets a test
//! inject an error for the next call of a method, hang `ContainerStatus` for one
//! container or `PullImage` for one image, or make a container exit. The CRI
//! stats calls live in [`stats`]: a test can fail one sandbox's or container's
//! stats, or make a method answer `Unimplemented` as an older runtime does.

mod images;
mod stats;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::pb::{self, ContainerState, PodSandboxState};
use crate::service::RuntimeService;
use crate::{CriError, Result};

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, (pb::PodSandboxStatus, pb::PodSandboxConfig)>,
    containers: HashMap<String, (pb::ContainerStatus, String)>,
    images: HashMap<String, pb::Image>,
    missing_images: HashSet<String>,
    fail_next: HashMap<&'static str, Vec<CriError>>,
    hang_status: HashSet<String>,
    hang_pull: HashSet<String>,
    /// Images a pull must present these credentials for.
    private_images: HashMap<String, pb::AuthConfig>,
    /// Every `PullImage`: image and the credentials it carried.
    pulls: Vec<(String, Option<pb::AuthConfig>)>,
    calls: Vec<&'static str>,
    down: bool,
    network_down: bool,
    /// What `Status` reports beside the conditions (none: containerd 1.6).
    runtime_handlers: Vec<pb::RuntimeHandler>,
    runtime_features: Option<pb::RuntimeFeatures>,
    version: Option<(String, String)>,
    /// Methods answered with `Unimplemented` on every call.
    unimplemented: HashSet<&'static str>,
    /// Sandboxes and containers whose stats the runtime fails to read.
    failing_stats: HashSet<String>,
    /// CPU core-nanoseconds and working set a container's stats report.
    usage: HashMap<String, (u64, u64)>,
}

/// In-memory runtime. Cheap to clone; clones share state.
#[derive(Clone, Default)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    ids: Arc<AtomicU64>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl FakeRuntime {
    /// An empty runtime where every image pull succeeds.
    pub fn new() -> Self {
        Self::default()
    }

    fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}{:08}", self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Makes pulls of `image` fail as a registry 404 would.
    pub fn set_image_missing(&self, image: &str) {
        self.state.lock().missing_images.insert(image.to_string());
    }

    /// Adds `image` as already present on the node.
    pub fn add_image(&self, image: &str) {
        let mut st = self.state.lock();
        st.images.insert(
            image.to_string(),
            pb::Image {
                id: format!("sha256:{image}"),
                repo_tags: vec![image.to_string()],
                size: 1,
                ..Default::default()
            },
        );
    }

    /// The next call of `op` (a CRI method name such as `"CreateContainer"`) fails with `err`.
    pub fn fail_next(&self, op: &'static str, err: CriError) {
        self.state.lock().fail_next.entry(op).or_default().push(err);
    }

    /// `ContainerStatus` for `container_id` never answers (until the caller's deadline).
    pub fn hang_container_status(&self, container_id: &str) {
        self.state
            .lock()
            .hang_status
            .insert(container_id.to_string());
    }

    /// `PullImage` of `image` never answers, as a slow registry (until the
    /// caller gives up and drops the call).
    pub fn hang_pull(&self, image: &str) {
        self.state.lock().hang_pull.insert(image.to_string());
    }

    /// Pulls of `image` fail as a registry's 401 would unless they carry `auth`.
    pub fn require_auth(&self, image: &str, auth: pb::AuthConfig) {
        self.state
            .lock()
            .private_images
            .insert(image.to_string(), auth);
    }

    /// Every `PullImage` so far, in order: the image and the credentials sent.
    pub fn pulls(&self) -> Vec<(String, Option<pb::AuthConfig>)> {
        self.state.lock().pulls.clone()
    }

    /// Every call fails with `Unavailable` while `down` is true.
    pub fn set_down(&self, down: bool) {
        self.state.lock().down = down;
    }

    /// `Status` reports these runtime handlers and runtime features from now
    /// on (a runtime of CRI 1.30 or later; by default none, as containerd 1.6).
    pub fn set_runtime_handlers(
        &self,
        handlers: Vec<pb::RuntimeHandler>,
        features: Option<pb::RuntimeFeatures>,
    ) {
        let mut st = self.state.lock();
        st.runtime_handlers = handlers;
        st.runtime_features = features;
    }

    /// `Status` reports NetworkReady=false (CNI not configured) while set.
    pub fn set_network_down(&self, down: bool) {
        self.state.lock().network_down = down;
    }

    /// `Version` reports `name` and `version` from now on (a runtime upgraded underneath).
    pub fn set_version(&self, name: &str, version: &str) {
        self.state.lock().version = Some((name.to_string(), version.to_string()));
    }

    /// The container's process exits with `code`.
    pub fn exit_container(&self, id: &str, code: i32) {
        if let Some((st, _)) = self.state.lock().containers.get_mut(id) {
            st.state = ContainerState::ContainerExited as i32;
            st.exit_code = code;
            st.finished_at = now_ns();
            st.reason = if code == 0 { "Completed" } else { "Error" }.to_string();
        }
    }

    /// Marks the sandbox NotReady, as when its pause process dies.
    pub fn kill_sandbox(&self, id: &str) {
        if let Some((st, _)) = self.state.lock().sandboxes.get_mut(id) {
            st.state = PodSandboxState::SandboxNotready as i32;
        }
    }

    /// Adds a ready sandbox labelled for pod `uid` (`name` in `default`) with
    /// `containers` running containers named `c0`, `c1`, ... Returns the sandbox
    /// and container IDs.
    pub fn add_running_pod(
        &self,
        uid: &str,
        name: &str,
        containers: usize,
    ) -> (String, Vec<String>) {
        let labels = HashMap::from([
            ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
            ("io.kubernetes.pod.name".to_string(), name.to_string()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                "default".to_string(),
            ),
        ]);
        let sb = self.next_id("sb");
        let now = now_ns();
        let status = pb::PodSandboxStatus {
            id: sb.clone(),
            metadata: Some(pb::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.to_string(),
                namespace: "default".to_string(),
                attempt: 0,
            }),
            state: PodSandboxState::SandboxReady as i32,
            created_at: now,
            labels: labels.clone(),
            ..Default::default()
        };
        let mut st = self.state.lock();
        st.sandboxes
            .insert(sb.clone(), (status, pb::PodSandboxConfig::default()));
        let mut ids = Vec::new();
        for i in 0..containers {
            let id = self.next_id("ct");
            let mut labels = labels.clone();
            labels.insert("io.kubernetes.container.name".to_string(), format!("c{i}"));
            let c = pb::ContainerStatus {
                id: id.clone(),
                metadata: Some(pb::ContainerMetadata {
                    name: format!("c{i}"),
                    attempt: 0,
                }),
                state: ContainerState::ContainerRunning as i32,
                created_at: now,
                started_at: now,
                labels,
                ..Default::default()
            };
            st.containers.insert(id.clone(), (c, sb.clone()));
            ids.push(id);
        }
        (sb, ids)
    }

    /// Starts an exited or created container again (for tests that flip states).
    pub fn restart_container(&self, id: &str) {
        if let Some((c, _)) = self.state.lock().containers.get_mut(id) {
            c.state = ContainerState::ContainerRunning as i32;
            c.started_at = now_ns();
        }
    }

    /// Method names called so far, in order.
    pub fn calls(&self) -> Vec<&'static str> {
        self.state.lock().calls.clone()
    }

    /// How many times `op` was called.
    pub fn call_count(&self, op: &str) -> usize {
        self.state.lock().calls.iter().filter(|c| **c == op).count()
    }

    /// Forgets recorded calls.
    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// Every container status, for assertions.
    pub fn containers(&self) -> Vec<pb::ContainerStatus> {
        self.state
            .lock()
            .containers
            .values()
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// The config every sandbox was created with, for assertions.
    pub fn sandbox_configs(&self) -> Vec<pb::PodSandboxConfig> {
        self.state
            .lock()
            .sandboxes
            .values()
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Every sandbox status, for assertions.
    pub fn sandboxes(&self) -> Vec<pb::PodSandboxStatus> {
        self.state
            .lock()
            .sandboxes
            .values()
            .map(|(s, _)| s.clone())
            .collect()
    }

    fn enter(&self, op: &'static str) -> Result<()> {
        let mut st = self.state.lock();
        st.calls.push(op);
        if st.down {
            return Err(CriError::Unavailable {
                op,
                message: "connection refused".to_string(),
            });
        }
        if st.unimplemented.contains(op) {
            return Err(CriError::Rpc {
                op,
                code: tonic::Code::Unimplemented,
                message: format!("unknown method {op} for service runtime.v1.RuntimeService"),
            });
        }
        if let Some(errs) = st.fail_next.get_mut(op)
            && !errs.is_empty()
        {
            return Err(errs.remove(0));
        }
        Ok(())
    }
}

/// Labels matched with AND, as CRI label selectors are.
fn labels_match(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn not_found(op: &'static str, what: &str) -> CriError {
    CriError::NotFound {
        op,
        message: format!("{what} not found"),
    }
}

#[async_trait::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self) -> Result<pb::VersionResponse> {
        self.enter("Version")?;
        let (name, version) = self
            .state
            .lock()
            .version
            .clone()
            .unwrap_or_else(|| ("fake".into(), "1.0.0".into()));
        Ok(pb::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: name,
            runtime_version: version,
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self) -> Result<pb::StatusResponse> {
        self.enter("Status")?;
        let cond = |t: &str| pb::RuntimeCondition {
            r#type: t.into(),
            status: true,
            ..Default::default()
        };
        let mut network = cond("NetworkReady");
        if self.state.lock().network_down {
            network.status = false;
            network.reason = "NetworkPluginNotReady".into();
            network.message = "cni config uninitialized".into();
        }
        let st = self.state.lock();
        Ok(pb::StatusResponse {
            status: Some(pb::RuntimeStatus {
                conditions: vec![cond("RuntimeReady"), network],
            }),
            runtime_handlers: st.runtime_handlers.clone(),
            features: st.runtime_features,
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(&self, config: pb::PodSandboxConfig, handler: &str) -> Result<String> {
        self.enter("RunPodSandbox")?;
        let id = self.next_id("sb");
        let n = self.ids.load(Ordering::Relaxed);
        let status = pb::PodSandboxStatus {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: PodSandboxState::SandboxReady as i32,
            created_at: now_ns(),
            network: Some(pb::PodSandboxNetworkStatus {
                ip: format!("10.88.{}.{}", (n / 250) % 250, n % 250 + 2),
                additional_ips: vec![],
            }),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            runtime_handler: handler.to_string(),
            ..Default::default()
        };
        self.state
            .lock()
            .sandboxes
            .insert(id.clone(), (status, config));
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        self.enter("StopPodSandbox")?;
        let mut st = self.state.lock();
        if let Some((s, _)) = st.sandboxes.get_mut(id) {
            s.state = PodSandboxState::SandboxNotready as i32;
        }
        let now = now_ns();
        for (c, sb) in st.containers.values_mut() {
            if sb == id && c.state != ContainerState::ContainerExited as i32 {
                c.state = ContainerState::ContainerExited as i32;
                c.exit_code = 137;
                c.finished_at = now;
            }
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        self.enter("RemovePodSandbox")?;
        let mut st = self.state.lock();
        st.sandboxes.remove(id);
        st.containers.retain(|_, (_, sb)| sb != id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<pb::PodSandboxStatus> {
        self.enter("PodSandboxStatus")?;
        let st = self.state.lock();
        st.sandboxes
            .get(id)
            .map(|(s, _)| s.clone())
            .ok_or_else(|| not_found("PodSandboxStatus", id))
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<pb::PodSandboxFilter>,
    ) -> Result<Vec<pb::PodSandbox>> {
        self.enter("ListPodSandbox")?;
        let f = filter.unwrap_or_default();
        let st = self.state.lock();
        Ok(st
            .sandboxes
            .values()
            .map(|(s, _)| s)
            .filter(|s| f.id.is_empty() || s.id == f.id)
            .filter(|s| f.state.as_ref().is_none_or(|v| v.state == s.state))
            .filter(|s| labels_match(&f.label_selector, &s.labels))
            .map(|s| pb::PodSandbox {
                id: s.id.clone(),
                metadata: s.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                labels: s.labels.clone(),
                annotations: s.annotations.clone(),
                runtime_handler: s.runtime_handler.clone(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: pb::ContainerConfig,
        _sandbox_config: pb::PodSandboxConfig,
    ) -> Result<String> {
        self.enter("CreateContainer")?;
        let id = self.next_id("ct");
        let mut st = self.state.lock();
        if !st.sandboxes.contains_key(sandbox_id) {
            return Err(not_found("CreateContainer", sandbox_id));
        }
        let image = config.image.clone().unwrap_or_default();
        let image_id = st
            .images
            .get(&image.image)
            .map(|i| i.id.clone())
            .unwrap_or_default();
        let status = pb::ContainerStatus {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: ContainerState::ContainerCreated as i32,
            created_at: now_ns(),
            image: Some(image),
            image_ref: image_id.clone(),
            image_id,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            mounts: config.mounts.clone(),
            log_path: config.log_path.clone(),
            ..Default::default()
        };
        st.containers
            .insert(id.clone(), (status, sandbox_id.to_string()));
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        self.enter("StartContainer")?;
        let mut st = self.state.lock();
        let (c, _) = st
            .containers
            .get_mut(id)
            .ok_or_else(|| not_found("StartContainer", id))?;
        c.state = ContainerState::ContainerRunning as i32;
        c.started_at = now_ns();
        Ok(())
    }

    async fn stop_container(&self, id: &str, _timeout: Duration) -> Result<()> {
        self.enter("StopContainer")?;
        let mut st = self.state.lock();
        if let Some((c, _)) = st.containers.get_mut(id)
            && c.state != ContainerState::ContainerExited as i32
        {
            c.state = ContainerState::ContainerExited as i32;
            c.exit_code = 0;
            c.finished_at = now_ns();
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        self.enter("RemoveContainer")?;
        self.state.lock().containers.remove(id);
        Ok(())
    }

    async fn list_containers(
        &self,
        filter: Option<pb::ContainerFilter>,
    ) -> Result<Vec<pb::Container>> {
        self.enter("ListContainers")?;
        let f = filter.unwrap_or_default();
        let st = self.state.lock();
        Ok(st
            .containers
            .values()
            .filter(|(c, _)| f.id.is_empty() || c.id == f.id)
            .filter(|(_, sb)| f.pod_sandbox_id.is_empty() || *sb == f.pod_sandbox_id)
            .filter(|(c, _)| f.state.as_ref().is_none_or(|v| v.state == c.state))
            .filter(|(c, _)| labels_match(&f.label_selector, &c.labels))
            .map(|(c, sb)| pb::Container {
                id: c.id.clone(),
                pod_sandbox_id: sb.clone(),
                metadata: c.metadata.clone(),
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                image_id: c.image_id.clone(),
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<pb::ContainerStatus> {
        self.enter("ContainerStatus")?;
        let hang = self.state.lock().hang_status.contains(id);
        if hang {
            std::future::pending::<()>().await;
        }
        let st = self.state.lock();
        st.containers
            .get(id)
            .map(|(c, _)| c.clone())
            .ok_or_else(|| not_found("ContainerStatus", id))
    }

    async fn exec_sync(
        &self,
        id: &str,
        _cmd: Vec<String>,
        _timeout: Duration,
    ) -> Result<pb::ExecSyncResponse> {
        self.enter("ExecSync")?;
        let st = self.state.lock();
        match st.containers.get(id) {
            Some((c, _)) if c.state == ContainerState::ContainerRunning as i32 => {
                Ok(pb::ExecSyncResponse::default())
            }
            Some(_) => Err(CriError::Rpc {
                op: "ExecSync",
                code: tonic::Code::FailedPrecondition,
                message: "container is not running".into(),
            }),
            None => Err(not_found("ExecSync", id)),
        }
    }
}
