//! The two seams of the shutdown manager: [`Logind`], what it asks of
//! systemd-logind (upstream `dbusInhibiter`), and [`Node`], what it asks of
//! the kubelet (upstream `GetPodsFunc`, `PodTerminator`, the recorder and
//! the shutdown status the Ready condition reads).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;

use crate::Error;

/// `PrepareForShutdown` signals: `true` when a shutdown starts, `false`
/// when it is cancelled. The stream ends when the bus connection does.
pub type ShutdownEvents = BoxStream<'static, bool>;

/// A delay inhibitor lock (upstream `InhibitLock`, the file descriptor
/// logind returned). Dropping it releases the lock, which lets a pending
/// shutdown go on.
pub struct InhibitLock(#[allow(dead_code)] Box<dyn Send + Sync>);

impl InhibitLock {
    /// A lock held for as long as `held` lives (a file descriptor, or a
    /// test's guard).
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self(Box::new(held))
    }
}

impl std::fmt::Debug for InhibitLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InhibitLock")
    }
}

/// systemd-logind as the shutdown manager uses it. Each call has its own
/// deadline.
#[async_trait::async_trait]
pub trait Logind: Send + Sync {
    /// logind's `InhibitDelayMaxUSec`: how long it waits for delay locks.
    async fn current_inhibit_delay(&self) -> Result<Duration, Error>;
    /// Takes a delay lock on `shutdown` (upstream `InhibitShutdown`).
    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error>;
    /// Writes the logind drop-in that raises `InhibitDelayMaxSec` to `max`
    /// (upstream `OverrideInhibitDelay`).
    async fn override_inhibit_delay(&self, max: Duration) -> Result<(), Error>;
    /// Makes logind read its configuration again (upstream
    /// `ReloadLogindConf`: systemd sends it SIGHUP).
    async fn reload_logind_conf(&self) -> Result<(), Error>;
    /// Watches `PrepareForShutdown` (upstream `MonitorShutdown`).
    async fn monitor_shutdown(&self) -> Result<ShutdownEvents, Error>;
}

/// Opens a connection to logind (the system bus), within a deadline.
#[async_trait::async_trait]
pub trait Connect: Send + Sync {
    /// A new connection.
    async fn connect(&self) -> Result<Arc<dyn Logind>, Error>;
}

/// An active pod, as the shutdown manager sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ShutdownPod {
    /// The pod's UID.
    pub uid: String,
    /// `namespace/name`, for the log.
    pub name: String,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// `spec.terminationGracePeriodSeconds`.
    pub termination_grace_period_seconds: Option<i64>,
}

/// A pod kill that did not finish.
#[derive(Debug, thiserror::Error)]
#[error("killing pod {pod} failed")]
pub struct KillFailed {
    /// The pod.
    pub pod: String,
    /// Why.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// The kubelet as the shutdown manager sees it.
#[async_trait::async_trait]
pub trait Node: Send + Sync {
    /// The pods admitted and not terminated (upstream `GetActivePods`).
    fn active_pods(&self) -> Vec<ShutdownPod>;
    /// Kills a pod with `grace_period_seconds` and waits until it is
    /// `Failed` with [`crate::POD_REASON`] and [`crate::POD_MESSAGE`] and
    /// the `DisruptionTarget` condition (upstream
    /// `TerminatePodAbnormallyAndWait`).
    async fn kill_pod(
        &self,
        pod: &ShutdownPod,
        grace_period_seconds: i64,
    ) -> Result<(), KillFailed>;
    /// Whether the node is shutting down: the Ready condition shows
    /// [`crate::SHUTTING_DOWN`] and admission refuses pods while it is.
    fn set_shutting_down(&self, shutting_down: bool);
    /// A Normal event with reason [`crate::EVENT_REASON`] on the Node.
    fn record_event(&self, message: &str);
}
