//! The node's view of the container runtime (upstream `pkg/kubelet/runtime.go`
//! `runtimeState` and `updateRuntimeUp`): whether the runtime answers and is
//! ready, whether its network is ready, the runtime's name and version as of
//! the last (re)connect, and named health checks (the PLEG). Node status reads
//! it to set the Ready condition; `/healthz` does not, as upstream.

use std::sync::Arc;
use std::time::Duration;

use cri::RuntimeService;
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the runtime's status is checked (upstream: every 5s).
pub const RUNTIME_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// Deadline of one status or version call.
pub const RUNTIME_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

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
    runtime_error: RwLock<Option<String>>,
    network_error: RwLock<Option<String>>,
    version: RwLock<Option<RuntimeVersion>>,
    health_checks: RwLock<Vec<(&'static str, HealthCheck)>>,
}

impl RuntimeState {
    /// A state with no errors yet and `health_checks` run on every read.
    pub fn new(health_checks: Vec<(&'static str, HealthCheck)>) -> Self {
        Self {
            runtime_error: RwLock::new(None),
            network_error: RwLock::new(None),
            version: RwLock::new(None),
            health_checks: RwLock::new(health_checks),
        }
    }

    /// Adds a named health check (upstream `addHealthCheck`).
    pub fn add_health_check(&self, name: &'static str, check: HealthCheck) {
        self.health_checks.write().push((name, check));
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

    /// Records the result of one runtime `Status` call.
    fn set_errors(&self, runtime: Option<String>, network: Option<String>) {
        *self.network_error.write() = network;
        let mut cur = self.runtime_error.write();
        match (&*cur, &runtime) {
            (None, Some(e)) => warn!(error = %e, "Container runtime check failed"),
            (Some(_), None) => info!("Container runtime is back"),
            _ => {}
        }
        *cur = runtime;
    }

    /// One check (upstream `updateRuntimeUp`): the runtime's status, and its
    /// version whenever it was not known or the runtime was down before, so a
    /// runtime restarted or upgraded underneath is seen as it now is.
    pub async fn update_runtime_up(&self, runtime: &dyn RuntimeService) {
        let was_down = self.runtime_error.read().is_some() || self.version.read().is_none();
        let status = tokio::time::timeout(RUNTIME_CHECK_TIMEOUT, runtime.status()).await;
        let (err, network) = match status {
            Ok(Ok(s)) => {
                let down = |t: &str| s.conditions.iter().find(|c| c.r#type == t && !c.status);
                (
                    down("RuntimeReady").map(|c| {
                        format!("container runtime not ready: {}: {}", c.reason, c.message)
                    }),
                    down("NetworkReady").map(|c| {
                        format!(
                            "container runtime network not ready: NetworkReady=false reason:{} message:{}",
                            c.reason, c.message
                        )
                    }),
                )
            }
            Ok(Err(e)) => (Some(format!("container runtime is down: {e}")), None),
            Err(_) => (
                Some(format!(
                    "container runtime is down: no answer in {RUNTIME_CHECK_TIMEOUT:?}"
                )),
                None,
            ),
        };
        let up = err.is_none();
        self.set_errors(err, network);
        if up && was_down {
            match tokio::time::timeout(RUNTIME_CHECK_TIMEOUT, runtime.version()).await {
                Ok(Ok(v)) => {
                    info!(runtime = %v.runtime_name, version = %v.runtime_version,
                        api = %v.runtime_api_version, "Connected to container runtime");
                    *self.version.write() = Some(RuntimeVersion {
                        name: v.runtime_name,
                        version: v.runtime_version,
                    });
                }
                Ok(Err(e)) => warn!(error = %e, "Cannot read the runtime's version"),
                Err(_) => warn!("The runtime's version call timed out"),
            }
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
    fn runtime_errors(&self) -> Vec<String> {
        let mut out: Vec<String> = self.runtime_error.read().iter().cloned().collect();
        for (name, check) in self.health_checks.read().iter() {
            if let Err(e) = check() {
                out.push(format!("{name} is not healthy: {e}"));
            }
        }
        out
    }

    fn network_errors(&self) -> Vec<String> {
        self.network_error.read().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_node::RuntimeState as _;
    use kubelet_test_util::FakeRuntime;

    #[tokio::test(start_paused = true)]
    async fn runtime_down_is_noticed_and_recovery_clears_it() {
        let fake = FakeRuntime::new();
        let pleg_ok = Arc::new(parking_lot::Mutex::new(Ok(())));
        let check = pleg_ok.clone();
        let state = Arc::new(RuntimeState::new(vec![(
            "PLEG",
            Arc::new(move || check.lock().clone()) as HealthCheck,
        )]));
        let stop = CancellationToken::new();
        fake.set_down(true);
        tokio::spawn(state.clone().run(Arc::new(fake.clone()), stop.clone()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            state.runtime_errors()[0].starts_with("container runtime is down"),
            "{:?}",
            state.runtime_errors()
        );
        assert_eq!(state.version(), None);
        fake.set_down(false);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD + Duration::from_millis(10)).await;
        assert!(
            state.runtime_errors().is_empty(),
            "{:?}",
            state.runtime_errors()
        );
        fake.set_network_down(true);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD).await;
        assert_eq!(
            state.network_errors(),
            vec![
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized".to_string()
            ]
        );
        assert!(state.runtime_errors().is_empty());
        *pleg_ok.lock() = Err("pleg was last seen active 3m1s ago".into());
        assert_eq!(
            state.runtime_errors(),
            vec!["PLEG is not healthy: pleg was last seen active 3m1s ago".to_string()]
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtime_version_is_read_again_after_a_reconnect() {
        let fake = FakeRuntime::new();
        let state = RuntimeState::new(vec![]);
        assert_eq!(state.runtime_name(), "containerd");
        state.update_runtime_up(&fake).await;
        let first = state.version().expect("version read on connect");
        fake.set_version("containerd", "1.7.99");
        state.update_runtime_up(&fake).await;
        assert_eq!(state.version(), Some(first), "not re-read while connected");
        fake.set_down(true);
        state.update_runtime_up(&fake).await;
        fake.set_down(false);
        state.update_runtime_up(&fake).await;
        assert_eq!(
            state.version().map(|v| v.version),
            Some("1.7.99".to_string()),
            "re-read after the runtime came back"
        );
    }
}
