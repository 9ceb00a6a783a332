//! Local health endpoint (upstream `pkg/kubelet/server` `/healthz` on
//! `healthzBindAddress:healthzPort`, plain HTTP; `kubeadm join` polls it).
//! Healthy while the sync loop turns, the PLEG relists and the container
//! runtime answers its status call.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use cri::RuntimeService;
use kubelet_runtime::pleg::GenericPleg;
use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::sync_loop::Heartbeat;

/// How often the runtime's status is checked.
pub const RUNTIME_CHECK_PERIOD: Duration = Duration::from_secs(5);

/// What `/healthz` looks at.
pub struct Health {
    /// Sync loop liveness.
    pub heartbeat: Arc<Heartbeat>,
    /// The loop is stalled when it has not turned for this long.
    pub max_loop_stall: Duration,
    /// PLEG health.
    pub pleg: Arc<GenericPleg>,
    /// Last runtime check error, if the last check failed.
    pub runtime_error: RwLock<Option<String>>,
    /// The runtime's NetworkReady=false, if so (upstream `runtimeState.networkErrors`);
    /// it makes the node NotReady but the kubelet itself stays healthy.
    pub network_error: RwLock<Option<String>>,
}

impl Health {
    /// The failing checks, upstream style (`[-]name failed: reason`), or empty when healthy.
    pub fn failures(&self) -> Vec<String> {
        let mut out = vec![];
        let age = self.heartbeat.age();
        if age > self.max_loop_stall {
            out.push(format!(
                "[-]syncloop failed: sync loop took longer than expected ({age:?})"
            ));
        }
        if let Err(e) = self.pleg.healthy() {
            out.push(format!("[-]pleg failed: {e}"));
        }
        if let Some(e) = self.runtime_error.read().as_ref() {
            out.push(format!("[-]runtime failed: {e}"));
        }
        out
    }
}

async fn healthz(State(h): State<Arc<Health>>) -> (StatusCode, String) {
    let failures = h.failures();
    if failures.is_empty() {
        (StatusCode::OK, "ok".into())
    } else {
        let mut body = String::from("[+]ping ok\n");
        for f in failures {
            body.push_str(&f);
            body.push('\n');
        }
        body.push_str("healthz check failed\n");
        (StatusCode::INTERNAL_SERVER_ERROR, body)
    }
}

/// Serves `/healthz` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, health: Arc<Health>, stop: CancellationToken) {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .with_state(health);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "Serving healthz");
    }
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        warn!(error = %e, "healthz server stopped");
    }
}

/// Checks the runtime every [`RUNTIME_CHECK_PERIOD`] until `stop` (upstream `updateRuntimeUp`).
pub async fn watch_runtime(
    runtime: Arc<dyn RuntimeService>,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(RUNTIME_CHECK_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (err, network) = match runtime.status().await {
            Ok(s) => {
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
            Err(e) => (Some(format!("container runtime is down: {e}")), None),
        };
        *health.network_error.write() = network;
        let mut cur = health.runtime_error.write();
        match (&*cur, &err) {
            (None, Some(e)) => warn!(error = %e, "Container runtime check failed"),
            (Some(_), None) => info!("Container runtime is back"),
            _ => {}
        }
        *cur = err;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::fake::FakeRuntime;
    use kubelet_runtime::{KubeRuntimeManager, RuntimeConfig};

    fn health(fake: &FakeRuntime) -> Arc<Health> {
        let m = Arc::new(KubeRuntimeManager::new(
            Arc::new(fake.clone()),
            Arc::new(fake.clone()),
            RuntimeConfig::default(),
        ));
        let (pleg, _rx) = GenericPleg::new(m, 1, Duration::from_secs(1));
        Arc::new(Health {
            heartbeat: Arc::new(Heartbeat::default()),
            max_loop_stall: Duration::from_secs(300),
            pleg,
            runtime_error: RwLock::new(None),
            network_error: RwLock::new(None),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_sync_loop_fails_healthz() {
        let h = health(&FakeRuntime::new());
        assert!(h.failures().is_empty());
        tokio::time::advance(Duration::from_secs(301)).await;
        let f = h.failures();
        assert!(
            f.iter().any(|l| l.starts_with("[-]syncloop failed")),
            "{f:?}"
        );
        let (code, body) = healthz(State(h)).await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.ends_with("healthz check failed\n"), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_down_is_noticed_and_recovery_clears_it() {
        let fake = FakeRuntime::new();
        let h = health(&fake);
        let stop = CancellationToken::new();
        fake.set_down(true);
        tokio::spawn(watch_runtime(
            Arc::new(fake.clone()),
            h.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            h.failures()
                .iter()
                .any(|l| l.starts_with("[-]runtime failed"))
        );
        fake.set_down(false);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD + Duration::from_millis(10)).await;
        assert!(h.failures().is_empty(), "{:?}", h.failures());
        // Network not ready: recorded for node status, but the kubelet stays healthy.
        fake.set_network_down(true);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD).await;
        assert_eq!(
            h.network_error.read().as_deref(),
            Some(
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized"
            )
        );
        assert!(h.failures().is_empty(), "{:?}", h.failures());
        stop.cancel();
    }
}
