//! The runtime manager (upstream `kuberuntime_manager.go` `SyncPod`,
//! `KillPod`, `GetPodStatus`): reads a pod's runtime state through CRI and
//! applies the actions [`compute_pod_actions`] chose, idempotently.
//!
//! Container start and stop live in `containers` (upstream
//! `kuberuntime_container.go`), sandbox creation in `sandboxes`
//! (`kuberuntime_sandbox.go`), removal of dead instances and pods in `gc`
//! (`kuberuntime_gc.go`).

mod containers;
mod gc;
mod kill;
mod sandboxes;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cri::{ImageService, RuntimeService, pb};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kubelet_metrics::{KubeletMetrics, StartPhase, container_type};
use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use kubelet_types::{labels, pod};
use parking_lot::Mutex;
use tracing::{debug, info};

use crate::actions::{NoProbes, compute_pod_actions_with};
use crate::backoff::Backoff;
use crate::ephemeral;
use crate::images::ImageManager;
use crate::lifecycle_handler::HandlerRunner;
use crate::pod_status::{PodStatus, container_status_from_cri};
use crate::prober_results::ProbeResults;
use crate::runtime_config::RuntimeConfig;
use crate::sandbox::{HostDns, sandbox_config};
use crate::{Error, Result};

/// Outcome of one pod sync.
#[derive(Debug, Default)]
pub struct SyncResult {
    /// Steps that failed; the pod is retried.
    pub errors: Vec<Error>,
    /// Sync again after this long (a backoff window ends), if sooner than the resync.
    pub requeue_after: Option<Duration>,
    /// Containers started by this sync.
    pub started: usize,
    /// Time this sync spent in each startup step.
    pub timings: StartTimings,
}

/// Time one sync spent in each step of starting a pod (kubelet-rs's startup
/// breakdown; summed over the containers it started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartTimings {
    /// `RunPodSandbox`, when the sync created a sandbox.
    pub sandbox: Option<Duration>,
    /// Ensuring images (pulls, or presence checks).
    pub image_pull: Duration,
    /// Building configs and `CreateContainer`.
    pub container_create: Duration,
    /// `StartContainer`.
    pub container_start: Duration,
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
    metrics: Option<Arc<KubeletMetrics>>,
    /// The kubelet's environment, mounts and pull secrets for containers.
    helper: std::sync::OnceLock<Arc<dyn crate::RuntimeHelper>>,
    /// Runs postStart and preStop hooks.
    runner: HandlerRunner,
    /// Liveness and startup results, when a prober runs.
    probes: Option<ProbeResults>,
    /// The last spec synced per pod UID, for the preStop hooks and grace
    /// periods of a kill that only has the runtime state (upstream restores
    /// them from container labels).
    specs: Mutex<HashMap<String, Arc<Pod>>>,
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
            runner: HandlerRunner::new(runtime.clone()),
            probes: None,
            specs: Mutex::new(HashMap::new()),
            runtime,
            images: ImageManager::new(images)
                .with_credential_providers(cfg.image_credential_providers.clone()),
            cfg,
            backoff: Backoff::default(),
            reasons: Mutex::new(HashMap::new()),
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
            metrics: None,
            helper: std::sync::OnceLock::new(),
        }
    }

    /// Asks `helper` for each container's environment and mounts and each
    /// pod's pull secrets (upstream passes the kubelet as `RuntimeHelper`).
    /// Without one, containers get their plain `env` values and no mounts.
    /// Set once; later calls are ignored.
    pub fn set_runtime_helper(&self, helper: Arc<dyn crate::RuntimeHelper>) {
        let _ = self.helper.set(helper);
    }

    /// The sandbox's IPs: from the runtime right after it was created,
    /// otherwise those in `status` (upstream `determinePodSandboxIPs`).
    async fn pod_ips(
        &self,
        p: &Pod,
        created: bool,
        sandbox_id: &str,
        status: &PodStatus,
    ) -> Vec<String> {
        if !created {
            return status.ips.clone();
        }
        if pod::host_network(p) {
            return vec![];
        }
        match self.runtime.pod_sandbox_status(sandbox_id).await {
            Ok(s) => s
                .network
                .map(|n| {
                    std::iter::once(n.ip)
                        .chain(n.additional_ips.into_iter().map(|i| i.ip))
                        .filter(|ip| !ip.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            Err(e) => {
                debug!(error = %e, "Cannot read the new sandbox's IPs");
                vec![]
            }
        }
    }

    /// Records started pods and containers, image pulls and the startup breakdown in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<KubeletMetrics>) -> Self {
        self.images.metrics = Some(metrics.clone());
        self.metrics = Some(metrics);
        self
    }

    /// Observes one startup step in `kubelet_pod_start_phase_duration_seconds`.
    fn observe_phase(&self, phase: StartPhase, d: Duration) {
        if let Some(m) = &self.metrics {
            m.observe_start_phase(phase, d);
        }
    }

    /// `kubelet_started_containers_total` (and its errors) for one start
    /// attempt; upstream counts only attempts past the crash-loop backoff.
    fn record_container_start(&self, kind: &'static str, r: &Result<()>) {
        let Some(m) = &self.metrics else { return };
        match r {
            Err(e) if e.reason() == "CrashLoopBackOff" => {}
            Err(e) => m.record_started_container(kind, Some(e.reason())),
            Ok(()) => m.record_started_container(kind, None),
        }
    }

    /// Reads liveness and startup results from `results`: a running
    /// container whose probe failed is killed and restarted per the pod's
    /// restart policy (upstream `livenessManager`, `startupManager`).
    pub fn with_probe_results(mut self, results: ProbeResults) -> Self {
        self.probes = Some(results);
        self
    }

    /// Sends events (Pulling, Created, Started, Killing, BackOff, ...) to `recorder`.
    pub fn with_recorder(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.images.recorder = recorder.clone();
        self.recorder = recorder;
        self
    }

    /// Cancels image pulls in flight, and refuses new ones, once `shutdown`
    /// is cancelled (upstream cancels the pull's context on shutdown).
    pub fn with_shutdown(mut self, shutdown: tokio_util::sync::CancellationToken) -> Self {
        self.images.shutdown = shutdown;
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
        self.specs.lock().remove(uid);
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
                Ok(s) => {
                    let mut cs = container_status_from_cri(&s, &c.pod_sandbox_id);
                    if let Some(m) = crate::termination::message(&s).await {
                        cs.message = m;
                    }
                    status.containers.push(cs);
                }
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
        let actions = match &self.probes {
            Some(r) => compute_pod_actions_with(p, status, r),
            None => compute_pod_actions_with(p, status, &NoProbes),
        };
        debug!(?actions, "Computed pod actions");
        self.remember_spec(p);
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
                .kill_pod_with_spec(Some(p), status, None, actions.create_sandbox)
                .await
            {
                result.errors.push(e);
                return result;
            }
        } else {
            let stops = actions.containers_to_kill.iter().map(|k| {
                info!(container = %k.name, container.id = %k.id, "Killing container: {}", k.message);
                self.kill_container(
                    kill::Kill {
                        pod: Some(p),
                        id: &k.id,
                        name: &k.name,
                        message: k.message.clone(),
                        reason: k.reason,
                        grace: None,
                        grace_override: None,
                    },
                    status,
                    None,
                )
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
        if !actions.create_sandbox
            && actions.init_containers_to_start.is_empty()
            && actions.containers_to_start.is_empty()
            && actions.ephemeral_containers_to_start.is_empty()
        {
            // Nothing to create or start: no sandbox config to build.
            self.remove_dead_sandboxes(status).await;
            return result;
        }
        let host_dns = HostDns::read(&self.cfg.resolv_conf).await;
        let sandbox_cfg = sandbox_config(&self.cfg, p, actions.attempt, &host_dns);
        let sandbox_id = match self
            .ensure_sandbox(p, &actions, &sandbox_cfg, &mut result.timings)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                result.errors.push(e);
                return result;
            }
        };
        let pod_ips = self
            .pod_ips(p, actions.create_sandbox, &sandbox_id, status)
            .await;
        let target = (sandbox_id.as_str(), pod_ips.as_slice());
        // Ephemeral containers first, as upstream: one that fails does not
        // hold back the others, nor the init and app containers.
        for i in &actions.ephemeral_containers_to_start {
            let Some(ec) = ephemeral::ephemeral_containers(p).get(*i) else {
                continue;
            };
            let r = self
                .start_ephemeral_container(p, ec, status, target, &sandbox_cfg, now, &mut result)
                .await;
            self.record_container_start(container_type::EPHEMERAL_CONTAINER, &r);
            if let Err(e) = r {
                result.errors.push(e);
            }
        }
        // Init containers in order: a regular one that fails to start stops
        // the sync; a sidecar that fails does not hold back the others.
        for i in &actions.init_containers_to_start {
            let Some(c) = pod::init_containers(p).get(*i) else {
                continue;
            };
            let r = self
                .start_container(p, c, None, status, target, &sandbox_cfg, now, &mut result)
                .await;
            self.record_container_start(container_type::INIT_CONTAINER, &r);
            if let Err(e) = r {
                result.errors.push(e);
                if !pod::is_restartable_init_container(c) {
                    return result;
                }
            }
        }
        for i in actions.containers_to_start {
            let Some(c) = pod::containers(p).get(i) else {
                continue;
            };
            let r = self
                .start_container(p, c, None, status, target, &sandbox_cfg, now, &mut result)
                .await;
            self.record_container_start(container_type::CONTAINER, &r);
            if let Err(e) = r {
                result.errors.push(e);
            }
        }
        self.remove_dead_sandboxes(status).await;
        result
    }

    fn remember_spec(&self, p: &Pod) {
        let mut specs = self.specs.lock();
        let same = specs.get(pod::uid(p)).is_some_and(|old| **old == *p);
        if !same {
            specs.insert(pod::uid(p).to_string(), Arc::new(p.clone()));
        }
    }

    /// Stops every live container (in parallel, each with `grace`), then the
    /// pod's ready sandboxes (all of them when `all_sandboxes`, which also
    /// releases the network of a sandbox whose pause process died).
    ///
    /// When this manager synced the pod before, its last spec gives each
    /// container's preStop hook (run within `grace`, and the time it took
    /// subtracted from it) and sidecars stop after the app containers.
    pub async fn kill_pod(
        &self,
        status: &PodStatus,
        grace: Duration,
        all_sandboxes: bool,
    ) -> Result<()> {
        let spec = self.specs.lock().get(&status.uid).cloned();
        self.kill_pod_inner(spec.as_deref(), status, Some(grace), None, all_sandboxes)
            .await
    }

    /// Upstream `KillPod`: stops the pod's live containers as
    /// [`Self::kill_pod`] does, with the spec `p` when given (else the one
    /// last synced), and `grace_override`, when set, as every container's
    /// grace period (it wins over the pod's and the preStop hook's time).
    pub async fn kill_pod_with_spec(
        &self,
        p: Option<&Pod>,
        status: &PodStatus,
        grace_override: Option<Duration>,
        all_sandboxes: bool,
    ) -> Result<()> {
        let remembered = match p {
            Some(_) => None,
            None => self.specs.lock().get(&status.uid).cloned(),
        };
        let p = p.or(remembered.as_deref());
        self.kill_pod_inner(p, status, None, grace_override, all_sandboxes)
            .await
    }

    async fn kill_pod_inner(
        &self,
        p: Option<&Pod>,
        status: &PodStatus,
        grace: Option<Duration>,
        grace_override: Option<Duration>,
        all_sandboxes: bool,
    ) -> Result<()> {
        self.kill_containers(p, status, grace, grace_override)
            .await?;
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
}
