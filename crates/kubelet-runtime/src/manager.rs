//! The runtime manager (upstream `kuberuntime_manager.go` `SyncPod`,
//! `KillPod`, `GetPodStatus`): reads a pod's runtime state through CRI and
//! applies the actions [`compute_pod_actions`] chose, idempotently.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use std::time::{Duration, SystemTime};

use cri::{ImageService, RuntimeService, pb};
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::{CgroupDriver, labels, pod};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::actions::{PodActions, compute_pod_actions};
use crate::backoff::Backoff;
use crate::container::{backoff_key, container_config};
use crate::images::ImageManager;
use crate::pod_status::{ContainerState, PodStatus, container_status_from_cri};
use crate::sandbox::{pod_logs_dir, sandbox_config};
use crate::{Error, Result};

/// Node-level settings the runtime manager needs.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// `podLogsDir` (default `/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// `--root-dir` (default `/var/lib/kubelet`): pod data under `pods/<uid>`.
    pub root_dir: PathBuf,
    /// `clusterDNS`.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain`.
    pub cluster_domain: String,
    /// `resolvConf` ("" disables host DNS inheritance).
    pub resolv_conf: String,
    /// `cgroupDriver`.
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot` (default `/`).
    pub cgroup_root: String,
    /// Node memory, for Burstable OOM score adjustment.
    pub machine_memory_bytes: i64,
    /// CRI runtime handler for sandboxes ("" = default).
    pub runtime_handler: String,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            cluster_dns: vec![],
            cluster_domain: String::new(),
            resolv_conf: "/etc/resolv.conf".into(),
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".into(),
            machine_memory_bytes: 0,
            runtime_handler: String::new(),
        }
    }
}

/// Outcome of one pod sync.
#[derive(Debug, Default)]
pub struct SyncResult {
    /// Steps that failed; the pod is retried.
    pub errors: Vec<Error>,
    /// Sync again after this long (a backoff window ends), if sooner than the resync.
    pub requeue_after: Option<Duration>,
    /// Containers started by this sync.
    pub started: usize,
}

impl SyncResult {
    fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

/// Why a container is waiting, for its status (upstream `ReasonCache`).
pub type Reason = (&'static str, String);

/// Runs pods on a CRI runtime.
pub struct KubeRuntimeManager {
    runtime: Arc<dyn RuntimeService>,
    images: ImageManager,
    cfg: RuntimeConfig,
    backoff: Backoff,
    reasons: Mutex<HashMap<(String, String), Reason>>,
    recorder: Arc<dyn Recorder>,
}

/// A reference to a pod (or container) from runtime state, for events about stopped pods.
fn status_ref(
    s: &PodStatus,
    container: Option<&str>,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(s.name.clone()),
        namespace: Some(s.namespace.clone()),
        uid: Some(s.uid.clone()),
        field_path: container.map(|c| format!("spec.containers{{{c}}}")),
        ..Default::default()
    }
}

fn uid_filter<T: Default>(uid: &str, make: impl FnOnce(HashMap<String, String>) -> T) -> Option<T> {
    Some(make(HashMap::from([(
        labels::POD_UID.to_string(),
        uid.to_string(),
    )])))
}

impl KubeRuntimeManager {
    /// A manager over the given runtime and image services.
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        cfg: RuntimeConfig,
    ) -> Self {
        Self {
            runtime,
            images: ImageManager::new(images),
            cfg,
            backoff: Backoff::default(),
            reasons: Mutex::new(HashMap::new()),
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
        }
    }

    /// Sends events (Pulling, Created, Started, Killing, BackOff, ...) to `recorder`.
    pub fn with_recorder(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.images.recorder = recorder.clone();
        self.recorder = recorder;
        self
    }

    /// The runtime service.
    pub fn runtime(&self) -> &Arc<dyn RuntimeService> {
        &self.runtime
    }

    /// The settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    /// Why the named container is not running, if a start failed (`CrashLoopBackOff`, `ErrImagePull`...).
    pub fn waiting_reason(&self, uid: &str, container: &str) -> Option<Reason> {
        self.reasons
            .lock()
            .get(&(uid.to_string(), container.to_string()))
            .cloned()
    }

    fn set_reason(&self, uid: &str, container: &str, reason: &'static str, message: String) {
        self.reasons
            .lock()
            .insert((uid.to_string(), container.to_string()), (reason, message));
    }

    fn clear_reason(&self, uid: &str, container: &str) {
        self.reasons
            .lock()
            .remove(&(uid.to_string(), container.to_string()));
    }

    /// Forgets the waiting reasons of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.reasons.lock().retain(|(u, _), _| u != uid);
    }

    /// Drops quiet backoff entries.
    pub fn gc_backoff(&self, now: SystemTime) {
        self.backoff.gc(now);
        self.images.gc(now);
    }

    /// The runtime state of pod `uid`: its sandboxes and containers, newest first.
    pub async fn get_pod_status(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus> {
        let (sandboxes, containers) = futures::try_join!(
            self.runtime
                .list_pod_sandbox(uid_filter(uid, |label_selector| pb::PodSandboxFilter {
                    label_selector,
                    ..Default::default()
                })),
            self.runtime
                .list_containers(uid_filter(uid, |label_selector| pb::ContainerFilter {
                    label_selector,
                    ..Default::default()
                })),
        )?;
        let sb = join_all(
            sandboxes
                .iter()
                .map(|s| self.runtime.pod_sandbox_status(&s.id)),
        )
        .await;
        let ct = join_all(
            containers
                .iter()
                .map(|c| self.runtime.container_status(&c.id)),
        )
        .await;
        let mut status = PodStatus {
            uid: uid.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            ..Default::default()
        };
        for r in sb {
            match r {
                Ok(s) => status.sandboxes.push(s),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for (r, c) in ct.into_iter().zip(&containers) {
            match r {
                Ok(s) => status
                    .containers
                    .push(container_status_from_cri(&s, &c.pod_sandbox_id)),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        status
            .sandboxes
            .sort_by_key(|s| std::cmp::Reverse(s.created_at));
        status
            .containers
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
        if let Some(ready) = status
            .sandboxes
            .iter()
            .find(|s| s.state == pb::PodSandboxState::SandboxReady as i32)
            && let Some(net) = &ready.network
            && !net.ip.is_empty()
        {
            status.ips.push(net.ip.clone());
            status
                .ips
                .extend(net.additional_ips.iter().map(|i| i.ip.clone()));
        }
        Ok(status)
    }

    /// Brings the runtime to the desired pod `p`, given its current `status`.
    pub async fn sync_pod(&self, p: &Pod, status: &PodStatus, now: SystemTime) -> SyncResult {
        let actions = compute_pod_actions(p, status);
        debug!(?actions, "Computed pod actions");
        let mut result = SyncResult::default();
        if actions.kill_pod {
            if actions.create_sandbox {
                info!(
                    attempt = actions.attempt,
                    "No ready sandbox for pod; a new one will be created"
                );
                if !status.sandboxes.is_empty() {
                    self.recorder.event(
                        &pod_ref(p, None),
                        EventType::Normal,
                        reason::SANDBOX_CHANGED,
                        "Pod sandbox changed, it will be killed and re-created.".into(),
                    );
                }
            }
            if let Err(e) = self
                .kill_pod(status, pod::grace_period(p), actions.create_sandbox)
                .await
            {
                result.errors.push(e);
                return result;
            }
        } else {
            let grace = pod::grace_period(p);
            let stops = actions.containers_to_kill.iter().map(|k| {
                info!(container = %k.name, container.id = %k.id, "Killing container: {}", k.message);
                self.recorder.event(
                    &pod_ref(p, Some(&k.name)),
                    EventType::Normal,
                    reason::KILLING,
                    k.message.to_string(),
                );
                self.stop_container(&k.id, grace)
            });
            for r in join_all(stops).await {
                if let Err(e) = r {
                    result.errors.push(e);
                }
            }
            if !result.errors.is_empty() {
                return result;
            }
        }
        if actions.kill_pod && !actions.create_sandbox {
            return result;
        }
        let sandbox_cfg = sandbox_config(&self.cfg, p, actions.attempt);
        let sandbox_id = match self.ensure_sandbox(p, &actions, &sandbox_cfg).await {
            Ok(id) => id,
            Err(e) => {
                result.errors.push(e);
                return result;
            }
        };
        // A fresh sandbox has no containers yet: start from a status without the old instances' states
        // except for history (restart counts, backoff, lastState).
        if let Some(i) = actions.next_init_container {
            if let Some(c) = pod::init_containers(p).get(i)
                && let Err(e) = self
                    .start_container(p, c, status, &sandbox_id, &sandbox_cfg, now, &mut result)
                    .await
            {
                result.errors.push(e);
            }
            return result;
        }
        for i in actions.containers_to_start {
            let Some(c) = pod::containers(p).get(i) else {
                continue;
            };
            if let Err(e) = self
                .start_container(p, c, status, &sandbox_id, &sandbox_cfg, now, &mut result)
                .await
            {
                result.errors.push(e);
            }
        }
        self.remove_dead_sandboxes(status).await;
        result
    }

    /// Removes sandboxes that are not ready, not the newest, and hold no
    /// containers any more (upstream container GC's `evictSandboxes`), so a
    /// recreated sandbox does not leave the dead one behind forever.
    async fn remove_dead_sandboxes(&self, status: &PodStatus) {
        let ready = pb::PodSandboxState::SandboxReady as i32;
        for s in status.sandboxes.iter().skip(1) {
            if s.state == ready || status.containers.iter().any(|c| c.sandbox_id == s.id) {
                continue;
            }
            info!(sandbox.id = %s.id, "Removing dead pod sandbox");
            if let Err(e) = self.runtime.remove_pod_sandbox(&s.id).await
                && !e.is_not_found()
            {
                warn!(sandbox.id = %s.id, error = %e, "Failed to remove dead sandbox");
            }
        }
    }

    async fn ensure_sandbox(
        &self,
        p: &Pod,
        a: &PodActions,
        cfg: &pb::PodSandboxConfig,
    ) -> Result<String> {
        if !a.create_sandbox {
            return a
                .sandbox_id
                .clone()
                .ok_or_else(|| Error::CreateSandbox("no sandbox to reuse".into()));
        }
        let dir = pod_logs_dir(&self.cfg.pod_logs_dir, p);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| Error::Io {
                context: format!("create pod log directory {}", dir.display()),
                source,
            })?;
        info!(attempt = a.attempt, "Creating pod sandbox");
        let id = self
            .runtime
            .run_pod_sandbox(cfg.clone(), &self.cfg.runtime_handler)
            .await
            .map_err(|e| {
                let message = format!("Failed to create pod sandbox: {}", e.message());
                self.recorder.event(
                    &pod_ref(p, None),
                    EventType::Warning,
                    reason::FAILED_CREATE_POD_SANDBOX,
                    message.clone(),
                );
                Error::CreateSandbox(message)
            })?;
        info!(sandbox.id = %id, "Created pod sandbox");
        Ok(id)
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        p: &Pod,
        c: &Container,
        status: &PodStatus,
        sandbox_id: &str,
        sandbox_cfg: &pb::PodSandboxConfig,
        now: SystemTime,
        result: &mut SyncResult,
    ) -> Result<()> {
        let uid = pod::uid(p);
        let last = status.find_container(&c.name);
        if let Some(last) = last.filter(|s| s.state == ContainerState::Exited) {
            let key = backoff_key(p, c);
            let event = last.finished_at.unwrap_or(now);
            if let Some(left) = self.backoff.remaining_since(&key, event, now) {
                let window = self.backoff.get(&key).unwrap_or_default();
                let message = format!(
                    "back-off {:?} restarting failed container={} pod={}",
                    window,
                    c.name,
                    pod::describe(p)
                );
                debug!(container = %c.name, ?left, "Container in crash-loop backoff");
                self.set_reason(uid, &c.name, "CrashLoopBackOff", message.clone());
                self.recorder.event(
                    &pod_ref(p, Some(&c.name)),
                    EventType::Warning,
                    reason::BACK_OFF,
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        pod::describe(p)
                    ),
                );
                result.requeue(left);
                return Err(Error::Container {
                    reason: "CrashLoopBackOff",
                    message,
                });
            }
            self.backoff.next(&key, event, now);
        }
        let image_ref = match self.images.ensure_image_exists(p, c, now).await {
            Ok(r) => r,
            Err(e) => {
                if let Error::Container { reason, message } = &e {
                    self.set_reason(uid, &c.name, reason, message.clone());
                    self.recorder.event(
                        &pod_ref(p, Some(&c.name)),
                        EventType::Warning,
                        kubelet_types::events::reason::FAILED,
                        format!("Error: {reason}"),
                    );
                }
                return Err(e);
            }
        };
        let restart_count = last.map_or(0, |s| s.restart_count + 1);
        self.prune_instances(status, &c.name).await;
        let log_dir = pod_logs_dir(&self.cfg.pod_logs_dir, p).join(&c.name);
        tokio::fs::create_dir_all(&log_dir)
            .await
            .map_err(|source| Error::Io {
                context: format!("create container log directory {}", log_dir.display()),
                source,
            })?;
        let mut cfg = container_config(&self.cfg, p, c, restart_count, &image_ref);
        match crate::termination::prepare(&self.cfg.root_dir, p, c, restart_count) {
            Ok(Some(m)) => cfg.mounts.push(m),
            Ok(None) => {}
            Err(source) => {
                return Err(Error::Io {
                    context: "create termination message file".into(),
                    source,
                });
            }
        }
        let id = match self
            .runtime
            .create_container(sandbox_id, cfg, sandbox_cfg.clone())
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let message = e.message();
                self.set_reason(uid, &c.name, "CreateContainerError", message.clone());
                self.recorder.event(
                    &pod_ref(p, Some(&c.name)),
                    EventType::Warning,
                    reason::FAILED,
                    format!("Error: {message}"),
                );
                return Err(Error::Container {
                    reason: "CreateContainerError",
                    message,
                });
            }
        };
        self.recorder.event(
            &pod_ref(p, Some(&c.name)),
            EventType::Normal,
            reason::CREATED,
            format!("Created container: {}", c.name),
        );
        if let Err(e) = self.runtime.start_container(&id).await {
            let message = e.message();
            self.set_reason(uid, &c.name, "RunContainerError", message.clone());
            self.recorder.event(
                &pod_ref(p, Some(&c.name)),
                EventType::Warning,
                reason::FAILED,
                format!("Error: {message}"),
            );
            return Err(Error::Container {
                reason: "RunContainerError",
                message,
            });
        }
        self.clear_reason(uid, &c.name);
        result.started += 1;
        info!(container = %c.name, container.id = %id, restart_count, "Started container");
        self.recorder.event(
            &pod_ref(p, Some(&c.name)),
            EventType::Normal,
            reason::STARTED,
            format!("Started container {}", c.name),
        );
        Ok(())
    }

    /// Keeps the newest exited instance of a container (its `lastState`) and
    /// removes older dead ones (upstream keeps one dead container per name).
    async fn prune_instances(&self, status: &PodStatus, name: &str) {
        let dead: Vec<_> = status
            .instances(name)
            .filter(|s| s.state != ContainerState::Running)
            .skip(1)
            .collect();
        for s in dead {
            if let Err(e) = self.runtime.remove_container(&s.id).await
                && !e.is_not_found()
            {
                warn!(container.id = %s.id, error = %e, "Failed to remove dead container");
            }
        }
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        match self.runtime.stop_container(id, grace).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Stops every live container (in parallel, each with `grace`), then the
    /// pod's ready sandboxes (all of them when `all_sandboxes`, which also
    /// releases the network of a sandbox whose pause process died).
    pub async fn kill_pod(
        &self,
        status: &PodStatus,
        grace: Duration,
        all_sandboxes: bool,
    ) -> Result<()> {
        let stops = status.live_containers().map(|c| {
            info!(container = %c.name, container.id = %c.id, ?grace, "Killing container");
            self.recorder.event(
                &status_ref(status, Some(&c.name)),
                EventType::Normal,
                reason::KILLING,
                format!("Stopping container {}", c.name),
            );
            self.stop_container(&c.id, grace)
        });
        for r in join_all(stops).await {
            r?;
        }
        for s in &status.sandboxes {
            if all_sandboxes || s.state == pb::PodSandboxState::SandboxReady as i32 {
                match self.runtime.stop_pod_sandbox(&s.id).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Removes every container and sandbox of a pod no source wants any more,
    /// and its log directory. Call after [`Self::kill_pod`].
    pub async fn remove_pod(&self, status: &PodStatus) -> Result<()> {
        for c in &status.containers {
            match self.runtime.remove_container(&c.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for s in &status.sandboxes {
            match self.runtime.remove_pod_sandbox(&s.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if self.cfg.cgroup_driver == CgroupDriver::Cgroupfs {
            crate::cgroups::remove_pod_cgroups(
                Path::new("/sys/fs/cgroup"),
                &self.cfg.cgroup_root,
                &status.uid,
            );
        }
        let data = crate::termination::pod_dir(&self.cfg.root_dir, &status.uid);
        if let Err(e) = tokio::fs::remove_dir_all(&data).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(dir = %data.display(), error = %e, "Failed to remove pod directory");
        }
        if !status.name.is_empty() {
            let dir = self.cfg.pod_logs_dir.join(format!(
                "{}_{}_{}",
                status.namespace, status.name, status.uid
            ));
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(dir = %dir.display(), error = %e, "Failed to remove pod log directory");
            }
        }
        self.forget_pod(&status.uid);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::fake::FakeRuntime;
    use std::time::UNIX_EPOCH;

    fn manager(fake: &FakeRuntime, dir: &std::path::Path) -> KubeRuntimeManager {
        let cfg = RuntimeConfig {
            pod_logs_dir: dir.to_path_buf(),
            root_dir: dir.join("root"),
            resolv_conf: String::new(),
            ..Default::default()
        };
        KubeRuntimeManager::new(Arc::new(fake.clone()), Arc::new(fake.clone()), cfg)
    }

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
            "spec": {"restartPolicy": policy, "containers": [{"name": "c", "image": "reg/busybox:1"}]}
        }))
        .expect("pod")
    }

    async fn sync(m: &KubeRuntimeManager, p: &Pod, now: SystemTime) -> (PodStatus, SyncResult) {
        let s = m
            .get_pod_status("uid-1", "p", "default")
            .await
            .expect("status");
        let r = m.sync_pod(p, &s, now).await;
        let s = m
            .get_pod_status("uid-1", "p", "default")
            .await
            .expect("status");
        (s, r)
    }

    #[tokio::test]
    async fn sync_starts_then_is_idempotent() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        let t = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (s, r) = sync(&m, &p, t).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(
            r.started, 1,
            "the start is reported so status can follow at once"
        );
        assert_eq!(s.sandboxes.len(), 1);
        assert_eq!(s.containers.len(), 1);
        assert_eq!(s.containers[0].state, ContainerState::Running);
        assert_eq!(s.ips.len(), 1);
        fake.clear_calls();
        let (_, r) = sync(&m, &p, t).await;
        assert!(r.errors.is_empty());
        assert_eq!(r.started, 0);
        let mutating = [
            "RunPodSandbox",
            "CreateContainer",
            "StartContainer",
            "StopContainer",
            "StopPodSandbox",
        ];
        assert!(
            fake.calls().iter().all(|c| !mutating.contains(c)),
            "{:?}",
            fake.calls()
        );
        assert!(dir.path().join("default_p_uid-1/c").is_dir());
    }

    #[tokio::test]
    async fn crash_loop_backoff_then_restart_with_count() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        let t0 = SystemTime::now();
        let (s, _) = sync(&m, &p, t0).await;
        fake.exit_container(&s.containers[0].id, 1);
        // First exit restarts at once, with restart count 1.
        let (s, r) = sync(&m, &p, t0).await;
        assert!(r.errors.is_empty());
        assert_eq!(
            s.find_container("c").map(|c| (c.state, c.restart_count)),
            Some((ContainerState::Running, 1))
        );
        // Second exit: CrashLoopBackOff for 10s, requeued for the end of the window.
        fake.exit_container(&s.containers[0].id, 1);
        let (s, r) = sync(&m, &p, SystemTime::now()).await;
        assert_eq!(
            r.errors.first().map(Error::reason),
            Some("CrashLoopBackOff")
        );
        assert!(
            r.requeue_after
                .is_some_and(|d| d <= Duration::from_secs(10) && d > Duration::from_secs(8))
        );
        assert_eq!(
            m.waiting_reason("uid-1", "c").map(|r| r.0),
            Some("CrashLoopBackOff")
        );
        assert_eq!(
            s.find_container("c").map(|c| c.state),
            Some(ContainerState::Exited)
        );
        // After the window the container restarts and the reason clears; old dead instances are pruned.
        let later = SystemTime::now() + Duration::from_secs(11);
        let (s, r) = sync(&m, &p, later).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(s.find_container("c").map(|c| c.restart_count), Some(2));
        assert_eq!(m.waiting_reason("uid-1", "c"), None);
        assert_eq!(s.instances("c").count(), 2, "running + newest dead kept");
    }

    #[tokio::test]
    async fn never_pod_finishes_and_stops_its_sandbox() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Never");
        let t = SystemTime::now();
        let (s, _) = sync(&m, &p, t).await;
        fake.exit_container(&s.containers[0].id, 0);
        let (s, r) = sync(&m, &p, t).await;
        assert!(r.errors.is_empty());
        assert_eq!(s.containers.len(), 1);
        assert!(
            !s.has_ready_sandbox(),
            "sandbox stopped once nothing is left to run"
        );
        fake.clear_calls();
        sync(&m, &p, t).await;
        assert_eq!(
            fake.call_count("StopPodSandbox"),
            0,
            "a finished pod costs no more stops"
        );
    }

    #[tokio::test]
    async fn failed_pull_reports_reason_and_leaves_others_alone() {
        let fake = FakeRuntime::new();
        fake.set_image_missing("reg/none:1");
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let mut p = pod("Always");
        if let Some(s) = p.spec.as_mut() {
            s.containers.push(Container {
                name: "bad".into(),
                image: Some("reg/none:1".into()),
                ..Default::default()
            });
        }
        let (s, r) = sync(&m, &p, SystemTime::now()).await;
        assert_eq!(r.errors.len(), 1);
        assert_eq!(
            m.waiting_reason("uid-1", "bad").map(|r| r.0),
            Some("ErrImagePull")
        );
        assert_eq!(
            s.find_container("c").map(|c| c.state),
            Some(ContainerState::Running)
        );
        let (_, _) = sync(&m, &p, SystemTime::now()).await;
        assert_eq!(
            m.waiting_reason("uid-1", "bad").map(|r| r.0),
            Some("ImagePullBackOff")
        );
    }

    #[tokio::test]
    async fn dead_sandboxes_without_containers_are_removed() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        let t = SystemTime::now();
        let (s, _) = sync(&m, &p, t).await;
        let first = s.sandboxes[0].id.clone();
        fake.kill_sandbox(&first);
        fake.exit_container(&s.containers[0].id, 137);
        // New sandbox; the first still holds the dead container (lastState), so it stays.
        let (s, r) = sync(&m, &p, t).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(s.sandboxes.len(), 2);
        // The container restarts again in the new sandbox: the oldest instance is pruned,
        // and the first sandbox, now empty, goes on the following sync.
        fake.exit_container(&s.containers[0].id, 1);
        let later = SystemTime::now() + Duration::from_secs(60);
        sync(&m, &p, later).await;
        let (s, _) = sync(&m, &p, later).await;
        assert!(
            s.sandboxes.iter().all(|sb| sb.id != first),
            "dead empty sandbox removed"
        );
        assert_eq!(s.sandboxes.len(), 1);
    }

    #[tokio::test]
    async fn kill_and_remove() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        let (s, _) = sync(&m, &p, SystemTime::now()).await;
        m.kill_pod(&s, Duration::from_secs(2), false)
            .await
            .expect("kill");
        let s = m
            .get_pod_status("uid-1", "p", "default")
            .await
            .expect("status");
        assert!(s.live_containers().next().is_none() && !s.has_ready_sandbox());
        m.remove_pod(&s).await.expect("remove");
        assert!(fake.sandboxes().is_empty() && fake.containers().is_empty());
        assert!(!dir.path().join("default_p_uid-1").exists());
    }

    const MUTATING: [&str; 5] = [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "StopPodSandbox",
    ];

    fn mutations(fake: &FakeRuntime) -> Vec<&'static str> {
        fake.calls()
            .into_iter()
            .filter(|c| MUTATING.contains(c))
            .collect()
    }

    /// Runs `p`'s container as another kubelet left it: a sandbox and a running
    /// container carrying exactly `annotations` (and upstream's labels).
    async fn start_foreign(fake: &FakeRuntime, p: &Pod, annotations: &[(&str, &str)]) {
        let cfg = RuntimeConfig::default();
        let sb_cfg = sandbox_config(&cfg, p, 0);
        let sb = fake
            .run_pod_sandbox(sb_cfg.clone(), "")
            .await
            .expect("sandbox");
        let c = &pod::containers(p)[0];
        let cc = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            image: Some(pb::ImageSpec {
                image: c.image.clone().unwrap_or_default(),
                ..Default::default()
            }),
            labels: HashMap::from([
                ("io.kubernetes.pod.name".into(), pod::name(p).into()),
                (
                    "io.kubernetes.pod.namespace".into(),
                    pod::namespace(p).into(),
                ),
                ("io.kubernetes.pod.uid".into(), pod::uid(p).into()),
                ("io.kubernetes.container.name".into(), c.name.clone()),
            ]),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let id = fake
            .create_container(&sb, cc, sb_cfg)
            .await
            .expect("create");
        fake.start_container(&id).await.expect("start");
    }

    #[tokio::test]
    async fn a_new_defaulted_field_restarts_nothing() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        let t = SystemTime::now();
        let (s, _) = sync(&m, &p, t).await;
        let before = s.containers[0].id.clone();
        // The apiserver was upgraded and now defaults more fields of the spec.
        let mut upgraded = p.clone();
        kubelet_types::defaults::apply_api_defaults(&mut upgraded);
        if let Some(c) = upgraded.spec.as_mut().map(|s| &mut s.containers[0]) {
            c.liveness_probe = Some(k8s_openapi::api::core::v1::Probe {
                period_seconds: Some(10),
                ..Default::default()
            });
            c.stdin = Some(false);
        }
        fake.clear_calls();
        let (s, r) = sync(&m, &upgraded, t).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(mutations(&fake), Vec::<&str>::new());
        assert_eq!(s.containers[0].id, before);
        // A new image still replaces the container.
        if let Some(c) = upgraded.spec.as_mut().map(|s| &mut s.containers[0]) {
            c.image = Some("reg/busybox:2".into());
        }
        let (_, r) = sync(&m, &upgraded, t).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(fake.call_count("StopContainer"), 1);
    }

    #[tokio::test]
    async fn containers_hashed_by_another_kubelet_rs_version_are_adopted() {
        for annotations in [
            // A later kubelet-rs with another algorithm.
            [
                ("io.kubernetes.container.hash", "deadbeef"),
                ("io.kubelet-rs.container.hashVersion", "2"),
            ],
            // kubelet-rs before hash versions: whole-spec SHA-256 prefix, no version.
            [
                ("io.kubernetes.container.hash", "0123456789abcdef"),
                ("io.kubernetes.container.restartCount", "0"),
            ],
        ] {
            let fake = FakeRuntime::new();
            let dir = tempfile_dir();
            let m = manager(&fake, dir.path());
            let p = pod("Always");
            start_foreign(&fake, &p, &annotations).await;
            fake.clear_calls();
            let (s, r) = sync(&m, &p, SystemTime::now()).await;
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            assert_eq!(mutations(&fake), Vec::<&str>::new(), "{annotations:?}");
            assert_eq!(s.live_containers().count(), 1);
        }
    }

    #[tokio::test]
    async fn containers_an_upstream_1_31_kubelet_started_are_adopted() {
        let fake = FakeRuntime::new();
        let dir = tempfile_dir();
        let m = manager(&fake, dir.path());
        let p = pod("Always");
        // Exactly what upstream 1.31+ writes for container "c", image "reg/busybox:1"
        // (the hash computed independently: FNV-32a of the spew dump of
        // {"image":"reg/busybox:1","name":"c"}).
        let upstream = [
            ("io.kubernetes.container.hash", "35b9bd23"),
            ("io.kubernetes.container.restartCount", "0"),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log",
            ),
            ("io.kubernetes.container.terminationMessagePolicy", "File"),
            ("io.kubernetes.pod.terminationGracePeriod", "30"),
            ("io.kubernetes.container.type", "container"),
        ];
        start_foreign(&fake, &p, &upstream).await;
        fake.clear_calls();
        let (s, r) = sync(&m, &p, SystemTime::now()).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(mutations(&fake), Vec::<&str>::new());
        assert_eq!(s.live_containers().count(), 1);
        // The same algorithm, so a real change is still seen.
        let mut newer = p.clone();
        if let Some(c) = newer.spec.as_mut().map(|s| &mut s.containers[0]) {
            c.image = Some("reg/busybox:2".into());
        }
        let (_, r) = sync(&m, &newer, SystemTime::now()).await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(fake.call_count("StopContainer"), 1);
    }

    fn tempfile_dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }
}
