//! The node's view of the container runtime (upstream `pkg/kubelet/runtime.go`
//! `runtimeState` and `updateRuntimeUp`): when the runtime last answered
//! ready (the runtime is *down* once that is older than 30 s), whether it and
//! its network report ready, the runtime's name and version as of the last
//! check, its handlers and features ([`RuntimeFeatures`]), and named health
//! checks (the PLEG). Node status reads it to set the
//! Ready condition; `/healthz` does not, as upstream. The node shutdown
//! manager's status (upstream `shutdownManager.ShutdownStatus`, which
//! upstream hands the Ready setter after the runtime's and network's errors)
//! is kept here too: while the node shuts down it is NotReady with that
//! error, and node status is woken to report it at once.

use std::sync::Arc;
use std::time::Duration;

use cri::RuntimeService;
use parking_lot::RwLock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::runtime_features::RuntimeFeatures;

/// How often the runtime's status is checked (upstream: every 5s).
pub const RUNTIME_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// Deadline of one status or version call.
pub const RUNTIME_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The runtime is down when it last answered ready longer ago than this
/// (upstream `baseRuntimeSyncThreshold`).
pub const BASE_RUNTIME_SYNC_THRESHOLD: Duration = Duration::from_secs(30);

/// A named health check (upstream `addHealthCheck`), e.g. the PLEG's.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The runtime's name and version, as its `Version` call reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// `containerd`.
    pub name: String,
    /// As reported, e.g. `1.6.20~ds1`.
    pub version: String,
}

/// What the kubelet knows of the runtime's health.
pub struct RuntimeState {
    /// When the runtime last answered with RuntimeReady=true.
    last_base_runtime_sync: RwLock<Option<Instant>>,
    runtime_error: RwLock<Option<String>>,
    network_error: RwLock<Option<String>>,
    version: RwLock<Option<RuntimeVersion>>,
    features: Arc<RuntimeFeatures>,
    health_checks: RwLock<Vec<(&'static str, HealthCheck)>>,
    shutdown_status: RwLock<Option<String>>,
    /// Wakes the node status loop when the shutdown status changes
    /// (upstream's shutdown manager runs `syncNodeStatus` then).
    status_changed: Arc<tokio::sync::Notify>,
}

impl RuntimeState {
    /// A state with no errors yet and `health_checks` run on every read.
    pub fn new(health_checks: Vec<(&'static str, HealthCheck)>) -> Self {
        Self {
            last_base_runtime_sync: RwLock::new(None),
            runtime_error: RwLock::new(None),
            network_error: RwLock::new(None),
            version: RwLock::new(None),
            features: Arc::default(),
            health_checks: RwLock::new(health_checks),
            shutdown_status: RwLock::new(None),
            status_changed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Adds a named health check (upstream `addHealthCheck`).
    pub fn add_health_check(&self, name: &'static str, check: HealthCheck) {
        self.health_checks.write().push((name, check));
    }

    /// Sets or clears the node shutdown manager's error (upstream
    /// `ShutdownStatus()`: `node is shutting down`); a change is reported
    /// by node status at once, not on its next tick.
    pub fn set_shutdown_status(&self, err: Option<String>) {
        let changed = {
            let mut cur = self.shutdown_status.write();
            let changed = *cur != err;
            *cur = err;
            changed
        };
        if changed {
            self.status_changed.notify_one();
        }
    }

    /// The node shutdown manager's error while the node shuts down (for
    /// node readiness and pod admission).
    pub fn shutdown_status(&self) -> Option<String> {
        self.shutdown_status.read().clone()
    }

    /// The runtime's handlers and features as of its last ready answer.
    pub fn features(&self) -> Arc<RuntimeFeatures> {
        self.features.clone()
    }

    /// The runtime's name and version as of the last (re)connect.
    pub fn version(&self) -> Option<RuntimeVersion> {
        self.version.read().clone()
    }

    /// The runtime's name for container IDs (`<name>://<id>`); `containerd`
    /// until the runtime has answered once.
    pub fn runtime_name(&self) -> String {
        self.version
            .read()
            .as_ref()
            .map_or_else(|| "containerd".to_string(), |v| v.name.clone())
    }

    fn set_runtime_error(&self, err: Option<String>) {
        let mut cur = self.runtime_error.write();
        match (&*cur, &err) {
            (None, Some(e)) => warn!(error = %e, "Container runtime not ready"),
            (Some(_), None) => info!("Container runtime is ready"),
            _ => {}
        }
        *cur = err;
    }

    /// Whether the runtime has not answered ready within
    /// [`BASE_RUNTIME_SYNC_THRESHOLD`] (or never has).
    fn is_down(&self) -> bool {
        self.last_base_runtime_sync
            .read()
            .is_none_or(|t| t.elapsed() >= BASE_RUNTIME_SYNC_THRESHOLD)
    }

    /// One check (upstream `updateRuntimeUp`). A failed or hung `Status` call
    /// changes nothing: the runtime counts as down only once it has not
    /// answered ready for [`BASE_RUNTIME_SYNC_THRESHOLD`]. A missing condition
    /// counts as not ready. On every ready answer the runtime's name and
    /// version are read again, so a runtime restarted or upgraded between two
    /// checks is seen as it now is.
    pub async fn update_runtime_up(&self, runtime: &dyn RuntimeService) {
        let answer = match tokio::time::timeout(RUNTIME_CHECK_TIMEOUT, runtime.status()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                warn!(error = %e, "Container runtime sanity check failed");
                return;
            }
            Err(_) => {
                warn!(timeout = ?RUNTIME_CHECK_TIMEOUT, "Container runtime sanity check timed out");
                return;
            }
        };
        let conditions = answer
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let condition = |t: &str| {
            conditions.iter().find(|c| c.r#type == t).map(|c| {
                (
                    c.status,
                    format!("{t}={} reason:{} message:{}", c.status, c.reason, c.message),
                )
            })
        };
        *self.network_error.write() = match condition("NetworkReady") {
            Some((true, _)) => None,
            Some((false, c)) => Some(format!("container runtime network not ready: {c}")),
            None => Some("container runtime network not ready: <nil>".to_string()),
        };
        match condition("RuntimeReady") {
            Some((true, _)) => {}
            Some((false, c)) => {
                self.set_runtime_error(Some(format!("container runtime not ready: {c}")));
                return;
            }
            None => {
                self.set_runtime_error(Some("container runtime not ready: <nil>".to_string()));
                return;
            }
        }
        // Back from down (never answered, no ready answer for the threshold,
        // or not ready): node status is woken to report Ready now rather
        // than at its next period (up to `nodeStatusUpdateFrequency` later).
        let was_down = self.runtime_error.read().is_some() || self.is_down();
        self.set_runtime_error(None);
        self.features.record(&answer);
        *self.last_base_runtime_sync.write() = Some(Instant::now());
        if was_down {
            self.status_changed.notify_one();
        }
        match tokio::time::timeout(RUNTIME_CHECK_TIMEOUT, runtime.version()).await {
            Ok(Ok(v)) => {
                let new = RuntimeVersion {
                    name: v.runtime_name,
                    version: v.runtime_version,
                };
                let mut cur = self.version.write();
                if cur.as_ref() != Some(&new) {
                    info!(runtime = %new.name, version = %new.version,
                        api = %v.runtime_api_version, "Connected to container runtime");
                    *cur = Some(new);
                }
            }
            Ok(Err(e)) => warn!(error = %e, "Cannot read the runtime's version"),
            Err(_) => warn!("The runtime's version call timed out"),
        }
    }

    /// Checks the runtime every [`RUNTIME_CHECK_PERIOD`] until `stop`.
    pub async fn run(self: Arc<Self>, runtime: Arc<dyn RuntimeService>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(RUNTIME_CHECK_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.update_runtime_up(runtime.as_ref()).await;
        }
    }
}

impl kubelet_node::RuntimeState for RuntimeState {
    /// Upstream `runtimeErrors`, in its order.
    fn runtime_errors(&self) -> Vec<String> {
        let mut out = vec![];
        match *self.last_base_runtime_sync.read() {
            None => {
                out.push("container runtime status check may not have completed yet".to_string())
            }
            Some(t) if t.elapsed() >= BASE_RUNTIME_SYNC_THRESHOLD => {
                out.push("container runtime is down".to_string());
            }
            Some(_) => {}
        }
        for (name, check) in self.health_checks.read().iter() {
            if let Err(e) = check() {
                out.push(format!("{name} is not healthy: {e}"));
            }
        }
        out.extend(self.runtime_error.read().iter().cloned());
        out
    }

    fn network_errors(&self) -> Vec<String> {
        self.network_error.read().iter().cloned().collect()
    }

    fn shutdown_errors(&self) -> Vec<String> {
        self.shutdown_status.read().iter().cloned().collect()
    }

    fn status_changed(&self) -> Arc<tokio::sync::Notify> {
        self.status_changed.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_node::RuntimeState as _;
    use kubelet_test_util::FakeRuntime;

    const NETWORK_DOWN: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized";

    #[tokio::test(start_paused = true)]
    async fn the_runtime_is_down_after_30s_without_a_ready_answer() {
        let fake = FakeRuntime::new();
        let pleg_ok = Arc::new(parking_lot::Mutex::new(Ok(())));
        let check = pleg_ok.clone();
        let state = Arc::new(RuntimeState::new(vec![(
            "PLEG",
            Arc::new(move || check.lock().clone()) as HealthCheck,
        )]));
        assert_eq!(
            state.runtime_errors(),
            vec!["container runtime status check may not have completed yet".to_string()]
        );
        let stop = CancellationToken::new();
        tokio::spawn(state.clone().run(Arc::new(fake.clone()), stop.clone()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            state.runtime_errors().is_empty(),
            "{:?}",
            state.runtime_errors()
        );
        // One failed check changes nothing; 30s without a ready answer does.
        fake.set_down(true);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD * 2).await;
        assert!(
            state.runtime_errors().is_empty(),
            "a blip: {:?}",
            state.runtime_errors()
        );
        tokio::time::sleep(BASE_RUNTIME_SYNC_THRESHOLD).await;
        assert_eq!(
            state.runtime_errors(),
            vec!["container runtime is down".to_string()]
        );
        fake.set_down(false);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD + Duration::from_millis(10)).await;
        assert!(
            state.runtime_errors().is_empty(),
            "{:?}",
            state.runtime_errors()
        );
        fake.set_network_down(true);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD).await;
        assert_eq!(state.network_errors(), vec![NETWORK_DOWN.to_string()]);
        assert!(state.runtime_errors().is_empty());
        *pleg_ok.lock() = Err("pleg was last seen active 3m1s ago".into());
        assert_eq!(
            state.runtime_errors(),
            vec!["PLEG is not healthy: pleg was last seen active 3m1s ago".to_string()]
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn node_status_is_woken_when_the_runtime_is_back_not_on_every_check() {
        let fake = FakeRuntime::new();
        let state = RuntimeState::new(vec![]);
        let changed = kubelet_node::RuntimeState::status_changed(&state);
        let woken = || async {
            tokio::time::timeout(Duration::from_millis(1), changed.notified())
                .await
                .is_ok()
        };
        // The first ready answer is news (the node was not ready before).
        state.update_runtime_up(&fake).await;
        assert!(woken().await, "first ready answer");
        // Ready again while up: nothing to report early.
        tokio::time::sleep(RUNTIME_CHECK_PERIOD).await;
        state.update_runtime_up(&fake).await;
        assert!(!woken().await, "no change, no wake-up");
        // Down (a containerd restart) for longer than the threshold ...
        fake.set_down(true);
        tokio::time::sleep(BASE_RUNTIME_SYNC_THRESHOLD).await;
        state.update_runtime_up(&fake).await;
        assert_eq!(
            state.runtime_errors(),
            vec!["container runtime is down".to_string()]
        );
        assert!(!woken().await, "a failed check wakes nothing");
        // ... and back: node status is woken at once, not a period later.
        fake.set_down(false);
        state.update_runtime_up(&fake).await;
        assert!(state.runtime_errors().is_empty());
        assert!(woken().await, "the runtime is back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_shutting_down_is_not_ready_with_upstreams_message() {
        let fake = FakeRuntime::new();
        fake.set_network_down(true);
        let state = RuntimeState::new(vec![]);
        state.update_runtime_up(&fake).await;
        let changed = kubelet_node::RuntimeState::status_changed(&state);
        // The first ready answer's wake-up, not what this test is about.
        let _ = tokio::time::timeout(Duration::from_millis(1), changed.notified()).await;
        assert!(state.runtime_errors().is_empty());
        state.set_shutdown_status(Some("node is shutting down".into()));
        // What the Ready condition lists, in upstream's order: runtime,
        // network, shutdown.
        let mut not_ready = state.runtime_errors();
        not_ready.extend(state.network_errors());
        not_ready.extend(state.shutdown_errors());
        assert_eq!(
            kubelet_node::nodestatus::setters::aggregate_message(&not_ready),
            format!("[{NETWORK_DOWN}, node is shutting down]")
        );
        assert_eq!(
            state.shutdown_status().as_deref(),
            Some("node is shutting down")
        );
        // Node status is woken at once, for the start and for the cancel.
        tokio::time::timeout(Duration::from_millis(1), changed.notified())
            .await
            .expect("woken on shutdown");
        state.set_shutdown_status(None);
        assert!(state.shutdown_errors().is_empty());
        tokio::time::timeout(Duration::from_millis(1), changed.notified())
            .await
            .expect("woken on cancel");
        state.set_shutdown_status(None);
        assert!(
            tokio::time::timeout(Duration::from_millis(1), changed.notified())
                .await
                .is_err(),
            "no change, no wake-up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtime_version_is_read_again_on_every_check() {
        let fake = FakeRuntime::new();
        let state = RuntimeState::new(vec![]);
        assert_eq!(state.runtime_name(), "containerd");
        state.update_runtime_up(&fake).await;
        assert_eq!(state.runtime_name(), "fake");
        // Restarted and upgraded between two checks, never seen down.
        fake.set_version("containerd", "1.7.99");
        state.update_runtime_up(&fake).await;
        assert_eq!(
            state.version(),
            Some(RuntimeVersion {
                name: "containerd".into(),
                version: "1.7.99".into()
            })
        );
        assert_eq!(state.runtime_name(), "containerd");
    }
}
