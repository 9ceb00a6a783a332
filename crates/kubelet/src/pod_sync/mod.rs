//! The pod sync the workers run (upstream `Kubelet.syncPod` and `killPod`):
//! read runtime state, record the generated API status, apply the runtime
//! manager's actions; or stop, and for pods gone for good, remove.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_metrics::KubeletMetrics;
use kubelet_runtime::KubeRuntimeManager;
use kubelet_runtime::pleg::PodCache;
use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use kubelet_types::pod;
use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::info;

use crate::active_deadline;
use crate::error::Error;
use crate::pod_manager::PodManager;
use crate::pod_start::{self, StartRecorder};
use crate::pod_workers::{PodSyncer, SyncOutcome};
use crate::prober::{NoProbes, ProbeManager};
use crate::runtime_state::RuntimeState;
use crate::status::{StatusManager, check_container_state_transition, generate_api_pod_status};
use crate::volume_host::KubeletVolumeHost;
use crate::volumemanager::VolumeManager;

mod terminal;

/// Syncs pods on a CRI runtime and records their status.
pub struct RuntimePodSyncer {
    runtime: Arc<KubeRuntimeManager>,
    status: Arc<StatusManager>,
    runtime_state: Arc<RuntimeState>,
    host_ips: Vec<std::net::IpAddr>,
    recorder: Arc<dyn Recorder>,
    pods: Option<PodManager>,
    /// The PLEG's pod cache; without it every sync inspects the pod itself.
    cache: Option<Arc<PodCache>>,
    /// When each pod's last sync ended (upstream `lastSyncTime`).
    last_sync: Mutex<HashMap<String, Instant>>,
    created: Instant,
    start: Option<StartRecorder>,
    volumes: Option<(VolumeManager, Arc<KubeletVolumeHost>)>,
    probes: Arc<dyn ProbeManager>,
    /// Pods the kubelet is ending (eviction, node shutdown).
    terminations: crate::pod_killer::Terminations,
}

impl RuntimePodSyncer {
    /// The runtime's name, from `runtime_state` as of its last (re)connect,
    /// prefixes container IDs in status (`containerd://…`).
    pub fn new(
        runtime: Arc<KubeRuntimeManager>,
        status: Arc<StatusManager>,
        runtime_state: Arc<RuntimeState>,
        host_ips: Vec<std::net::IpAddr>,
    ) -> Self {
        Self {
            runtime,
            status,
            runtime_state,
            host_ips,
            recorder: Arc::new(kubelet_types::events::NoopRecorder),
            pods: None,
            cache: None,
            last_sync: Mutex::new(HashMap::new()),
            created: Instant::now(),
            start: None,
            volumes: None,
            probes: Arc::new(NoProbes),
            terminations: Default::default(),
        }
    }

    /// Shares the pods the kubelet is ending with a [`crate::pod_killer::WorkerKiller`].
    pub fn with_terminations(mut self, t: crate::pod_killer::Terminations) -> Self {
        self.terminations = t;
        self
    }

    /// Reads readiness and startup from the prober (upstream
    /// `probeManager.UpdatePodStatus` in `generateAPIPodStatus`).
    pub fn with_probes(mut self, probes: Arc<dyn ProbeManager>) -> Self {
        self.probes = probes;
        self
    }

    /// Waits for each pod's volumes before starting its containers, and
    /// tears them down once the containers are gone.
    /// `host` watches the objects each pod references while it lives.
    pub fn with_volume_manager(
        mut self,
        volumes: VolumeManager,
        host: Arc<KubeletVolumeHost>,
    ) -> Self {
        self.volumes = Some((volumes, host));
        self
    }

    /// Observes pod startup latency and the startup breakdown in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<KubeletMetrics>) -> Self {
        self.start = Some(StartRecorder::new(metrics));
        self
    }

    /// Records pod events (FailedSync) to `recorder`.
    pub fn with_recorder(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Reads pod status from the PLEG's cache (upstream `podCache.GetNewerThan`)
    /// instead of inspecting the pod again right after the PLEG did.
    pub fn with_pod_cache(mut self, cache: Arc<PodCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The runtime's view of the pod at the start of a sync: from the PLEG
    /// cache, newer than the end of the pod's last sync (so it reflects what
    /// that sync did), or inspected directly when there is no cache.
    async fn pod_status_for_sync(
        &self,
        p: &Pod,
    ) -> Result<kubelet_runtime::PodStatus, Arc<kubelet_runtime::Error>> {
        let (uid, name, ns) = (pod::uid(p), pod::name(p), pod::namespace(p));
        match &self.cache {
            Some(cache) => {
                let min = self
                    .last_sync
                    .lock()
                    .get(uid)
                    .copied()
                    .unwrap_or(self.created);
                cache.get_newer_than(uid, min).await.map(|s| (*s).clone())
            }
            None => self
                .runtime
                .get_pod_status(uid, name, ns)
                .await
                .map_err(Arc::new),
        }
    }

    /// Reads the apiserver's view of pods (the API pod, or a static pod's
    /// mirror) to seed state a restarted kubelet would otherwise lose.
    pub fn with_pod_manager(mut self, pods: PodManager) -> Self {
        self.pods = Some(pods);
        self
    }

    /// The pod's last status: ours, or after a restart the one the apiserver
    /// holds (upstream `updateStatusInternal`: the cached status, else the
    /// mirror pod's, else the pod's own).
    fn previous_status(&self, p: &Pod) -> Option<PodStatus> {
        if let Some(s) = self.status.get_pod_status(pod::uid(p)) {
            return Some(s);
        }
        let mirror = self
            .pods
            .as_ref()
            .and_then(|m| m.get_mirror_pod_by_full_name(&pod::full_name(p)))
            .and_then(|m| m.status);
        mirror.or_else(|| p.status.clone())
    }

    fn record(&self, p: &Pod, rs: &kubelet_runtime::PodStatus) {
        self.record_phase(p, rs, false, None);
    }

    /// Generates and stores the pod's status; `pod_is_terminal` once the pod
    /// was stopped for good (upstream `generateAPIPodStatus(.., podIsTerminal)`);
    /// with `kill`, the status the kubelet ends the pod with, stored in the
    /// same step so the pod never shows a live phase in between.
    fn record_phase(
        &self,
        p: &Pod,
        rs: &kubelet_runtime::PodStatus,
        pod_is_terminal: bool,
        kill: Option<&crate::pod_killer::KillRequest>,
    ) {
        let uid = pod::uid(p);
        let waiting = |name: &str| self.runtime.waiting_reason(uid, name);
        let runtime_name = self.runtime_state.runtime_name();
        let mut api = generate_api_pod_status(
            p,
            rs,
            &waiting,
            &runtime_name,
            &self.host_ips,
            pod_is_terminal,
            self.probes.as_ref(),
        );
        // The start time never changes, not even across a kubelet restart.
        if let Some(start) = self.previous_status(p).and_then(|s| s.start_time) {
            api.start_time = Some(start);
        }
        if let Some(req) = kill {
            api = req.terminal_status(api);
        }
        if let Some(old) = self.previous_status(p) {
            terminal::keep_phase(&old, &mut api);
        }
        let old = self.status.get_pod_status(uid);
        if let Some(old) = &old
            && let Err(e) = check_container_state_transition(old, &api, pod::restart_policy(p))
        {
            tracing::error!(error = %e, "Refusing pod status update");
            return;
        }
        if let Some(start) = &self.start {
            start.observe(p, old.as_ref(), &api);
        }
        self.status.set_pod_status(uid, api);
    }
}

#[async_trait::async_trait]
impl PodSyncer for RuntimePodSyncer {
    async fn sync_pod(&self, p: &Arc<Pod>) -> SyncOutcome {
        let out = self.sync_pod_once(p).await;
        self.last_sync
            .lock()
            .insert(pod::uid(p).to_string(), Instant::now());
        out
    }

    fn gc_backoff(&self) {
        self.runtime.gc_backoff(SystemTime::now());
    }

    async fn kill_pod(&self, p: &Arc<Pod>, remove: bool) -> Result<(), Error> {
        let out = self.kill_pod_once(p, remove).await;
        // Upstream sets lastSyncTime after every piece of work: a pod re-added
        // after this kill must not read a status from before it.
        self.last_sync
            .lock()
            .insert(pod::uid(p).to_string(), Instant::now());
        out
    }

    fn forget(&self, uid: &str) {
        self.last_sync.lock().remove(uid);
        self.terminations.forget(uid);
        if let Some(start) = &self.start {
            start.forget(uid);
        }
    }
}

impl RuntimePodSyncer {
    async fn sync_pod_once(&self, p: &Arc<Pod>) -> SyncOutcome {
        let (uid, name, ns) = (pod::uid(p), pod::name(p), pod::namespace(p));
        let before = match self.pod_status_for_sync(p).await {
            Ok(s) => s,
            Err(e) => {
                self.recorder.event(
                    &pod_ref(p, None),
                    EventType::Warning,
                    reason::FAILED_SYNC,
                    format!("error determining status: {e}"),
                );
                return SyncOutcome {
                    error: Some(Error::PodStatus(e)),
                    requeue_after: None,
                };
            }
        };
        let now = SystemTime::now();
        // Checked before a new status is recorded, so a failed pod never looks alive again.
        let cached = self.previous_status(p);
        if let Some(req) = self
            .terminations
            .get(uid)
            .or_else(|| terminal::restored_kill(cached.as_ref()))
        {
            return self.fail_terminal(p, &before, &req).await;
        }
        if active_deadline::exceeded(cached.as_ref())
            || active_deadline::remaining(p, cached.as_ref(), now)
                == Some(std::time::Duration::ZERO)
        {
            return self.fail_deadline(p, &before).await;
        }
        self.record(p, &before);
        let left = active_deadline::remaining(p, self.status.get_pod_status(uid).as_ref(), now);
        // Upstream `SyncPod` returns before the volumes for a pod in a
        // terminal phase, and the pod worker's `SyncTerminatedPod` unmounts
        // them: a finished pod's volumes go now, not when it is deleted.
        let terminal = self
            .status
            .get_pod_status(uid)
            .and_then(|s| s.phase)
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
        if let Some((volumes, host)) = &self.volumes {
            if terminal {
                volumes.pod_terminated(uid, false);
                // Upstream `SyncTerminatedPod`: a finished pod needs no
                // ConfigMap/Secret watches any more.
                host.unregister_pod(p);
            } else {
                host.register_pod(p);
            }
        }
        if let Some((volumes, _)) = &self.volumes
            && !terminal
            && let Err(e) = volumes.wait_for_attach_and_mount(p).await
        {
            // Upstream records the failure unless the wait merely timed out:
            // each failed set-up already was a FailedMount event.
            if !e.is_timeout() {
                self.recorder.event(
                    &pod_ref(p, None),
                    EventType::Warning,
                    reason::FAILED_MOUNT,
                    format!("Unable to attach or mount volumes: {e}"),
                );
            }
            tracing::error!(error = %e, "Unable to attach or mount volumes for pod; skipping pod");
            return SyncOutcome {
                error: Some(Error::Volumes(e)),
                requeue_after: None,
            };
        }
        let mut result = self.runtime.sync_pod(p, &before, now).await;
        pod_start::record_timings(&result.timings);
        if let Some(left) = left {
            // Come back when the deadline passes.
            result.requeue_after = Some(result.requeue_after.map_or(left, |r| r.min(left)));
        }
        if result.started > 0 {
            // Report what was started now, rather than after the next PLEG relist.
            match self.runtime.get_pod_status(uid, name, ns).await {
                Ok(after) => self.record(p, &after),
                Err(_) => self.record(p, &before),
            }
        } else if !result.errors.is_empty() {
            // Failed starts change the waiting reasons: show them now rather than on the next sync.
            self.record(p, &before);
        }
        let requeue_after = result.requeue_after;
        let error = if result.errors.is_empty() {
            None
        } else {
            Some(Error::Sync(result.errors))
        };
        SyncOutcome {
            error,
            requeue_after,
        }
    }

    async fn kill_pod_once(&self, p: &Arc<Pod>, remove: bool) -> Result<(), Error> {
        let (uid, name, ns) = (pod::uid(p), pod::name(p), pod::namespace(p));
        let status = self
            .runtime
            .get_pod_status(uid, name, ns)
            .await
            .map_err(|e| Error::PodStatus(Arc::new(e)))?;
        // Upstream `killPod`: each container's grace from the pod (deletion
        // grace first), its preStop hook, sidecars last. An orphan's stub has
        // no spec: the runtime manager uses the one it last synced.
        let spec = p.spec.is_some().then_some(p.as_ref());
        // A pod the kubelet ends (eviction, node shutdown) stops within the
        // grace period the caller chose.
        let grace = self
            .terminations
            .get(uid)
            .and_then(|r| r.grace_period_override)
            .map(|g| std::time::Duration::from_secs(u64::try_from(g).unwrap_or(0)));
        self.runtime
            .kill_pod_with_spec(spec, &status, grace, true)
            .await
            .map_err(Error::Kill)?;
        if let Some((volumes, host)) = &self.volumes {
            // The containers are stopped: nothing uses the volumes any more.
            // Upstream `SyncTerminatedPod`: the pod counts as terminated (its
            // deletion may be confirmed, its UID run again) only once they
            // are unmounted; until then the kill is retried.
            volumes.pod_terminated(uid, remove);
            if !volumes
                .wait_for_unmount(uid, crate::volumemanager::POD_ATTACH_AND_MOUNT_TIMEOUT)
                .await
            {
                return Err(Error::VolumesStillMounted);
            }
            // Its volumes are gone: so are its ConfigMap/Secret watches,
            // whether or not the pod object goes too.
            host.unregister_pod(p);
        }
        if remove {
            // Killing changes states, not which containers and sandboxes exist.
            self.runtime
                .remove_pod(&status)
                .await
                .map_err(Error::Kill)?;
            self.status.remove(uid);
            info!("Pod stopped and removed");
        } else {
            let status = self
                .runtime
                .get_pod_status(uid, name, ns)
                .await
                .map_err(|e| Error::PodStatus(Arc::new(e)))?;
            let kill = self.terminations.get(uid);
            self.record_phase(p, &status, true, kill.as_ref());
            self.status.mark_terminated(uid);
            info!("Pod stopped");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubelet_runtime::RuntimeConfig;
    use kubelet_test_util::{FakeRuntime, pods};
    use std::time::Duration;

    pub(super) fn syncer(fake: &FakeRuntime) -> (RuntimePodSyncer, Arc<StatusManager>) {
        fake.add_image("busybox");
        let manager = Arc::new(KubeRuntimeManager::new(
            Arc::new(fake.clone()),
            Arc::new(fake.clone()),
            RuntimeConfig::default(),
        ));
        let status = Arc::new(StatusManager::default());
        let s = RuntimePodSyncer::new(
            manager,
            status.clone(),
            Arc::new(RuntimeState::new(vec![])),
            vec![],
        );
        (s, status)
    }

    fn hour_ago() -> Time {
        Time(jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1))
    }

    /// Issue 7 fix 4.2: after a kubelet restart the start time is the one the
    /// apiserver holds, and `activeDeadlineSeconds` counts from it.
    #[tokio::test]
    async fn start_time_survives_a_restart_and_the_deadline_counts_from_it() {
        let fake = FakeRuntime::new();
        let (s, status) = syncer(&fake);
        let mut p = pods::simple("web", "busybox", "Always");
        let started = hour_ago();
        p.status = Some(PodStatus {
            start_time: Some(started.clone()),
            phase: Some("Running".into()),
            ..Default::default()
        });
        let p = Arc::new(p);
        let out = s.sync_pod(&p).await;
        assert!(out.error.is_none(), "{:?}", out.error);
        let got = status.get_pod_status(pod::uid(&p)).expect("status");
        assert_eq!(got.start_time, Some(started.clone()));

        let fake = FakeRuntime::new();
        let (s, status) = syncer(&fake);
        let mut p = (*p).clone();
        p.metadata.uid = Some(pods::unique_uid());
        p.spec.as_mut().expect("spec").active_deadline_seconds = Some(1800);
        let p = Arc::new(p);
        s.sync_pod(&p).await;
        let got = status.get_pod_status(pod::uid(&p)).expect("status");
        assert_eq!(got.start_time, Some(started));
        assert_eq!(
            (got.phase.as_deref(), got.reason.as_deref()),
            (Some("Failed"), Some(active_deadline::REASON)),
            "an hour since the original start is past a 30-minute deadline"
        );
        assert_eq!(
            fake.call_count("CreateContainer"),
            0,
            "never started after the deadline"
        );
    }

    /// Issue 7 fix 4.3: a deleted pod whose containers are all stopped is
    /// terminal, even under restartPolicy Always.
    #[tokio::test]
    async fn a_killed_pod_reports_a_terminal_phase() {
        let fake = FakeRuntime::new();
        let (s, status) = syncer(&fake);
        let p = Arc::new(pods::simple("web", "busybox", "Always"));
        s.sync_pod(&p).await;
        let running = status.get_pod_status(pod::uid(&p)).expect("status");
        assert_eq!(running.phase.as_deref(), Some("Running"));
        s.kill_pod(&p, false).await.expect("kill");
        let killed = status.get_pod_status(pod::uid(&p)).expect("status");
        assert_eq!(
            killed.phase.as_deref(),
            Some("Succeeded"),
            "all containers exited 0 and none will restart"
        );
    }

    /// CRI reads (lists and status calls) the fake saw.
    fn reads(fake: &FakeRuntime) -> usize {
        fake.calls()
            .iter()
            .filter(|c| c.ends_with("Status") || c.starts_with("List"))
            .filter(|c| **c != "Status")
            .count()
    }

    /// One pod start as it happens: a first sync starts the pod, the PLEG
    /// relists and sees the container start, the woken worker syncs again.
    async fn reads_per_pod_start(with_cache: bool) -> usize {
        let fake = FakeRuntime::new();
        fake.add_image("busybox");
        let manager = Arc::new(KubeRuntimeManager::new(
            Arc::new(fake.clone()),
            Arc::new(fake.clone()),
            RuntimeConfig::default(),
        ));
        let (pleg, _events) = kubelet_runtime::pleg::GenericPleg::new(
            manager.clone(),
            1,
            Duration::from_secs(5),
            tokio_util::task::TaskTracker::new(),
        );
        let mut s = RuntimePodSyncer::new(
            manager,
            Arc::new(StatusManager::default()),
            Arc::new(RuntimeState::new(vec![])),
            vec![],
        );
        if with_cache {
            s = s.with_pod_cache(pleg.cache().clone());
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        pleg.relist().await.expect("relist");
        let p = Arc::new(pods::simple("web", "busybox", "Always"));
        fake.clear_calls();
        let out = s.sync_pod(&p).await;
        assert!(out.error.is_none(), "{:?}", out.error);
        tokio::time::advance(Duration::from_secs(1)).await;
        pleg.relist().await.expect("relist");
        // Background inspections finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let out = s.sync_pod(&p).await;
        assert!(out.error.is_none(), "{:?}", out.error);
        assert_eq!(fake.call_count("CreateContainer"), 1, "started once");
        reads(&fake)
    }

    /// Issue 7 fix 4.9: workers read the PLEG's cache instead of inspecting
    /// the pod again right after the PLEG did.
    #[tokio::test(start_paused = true)]
    async fn workers_read_the_pleg_cache_and_make_fewer_cri_reads() {
        let before = reads_per_pod_start(false).await;
        let after = reads_per_pod_start(true).await;
        eprintln!("CRI reads per pod start: {before} inspecting, {after} with the PLEG cache");
        assert!(
            after < before,
            "the cache saves the two syncs' own inspections: {after} vs {before}"
        );
    }
}
