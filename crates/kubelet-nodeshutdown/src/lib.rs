//! Graceful node shutdown (upstream `pkg/kubelet/nodeshutdown`).
//!
//! The kubelet takes a *delay* inhibitor lock from systemd-logind over
//! D-Bus, so that logind waits (at most its `InhibitDelayMaxSec`) before
//! shutting the machine down. When logind announces the shutdown with
//! `PrepareForShutdown(true)`, the [`Manager`] marks the node as shutting
//! down (NotReady, new pods refused), kills the active pods group by group
//! in priority order within each group's share of the grace period, and
//! then releases the lock. `PrepareForShutdown(false)` (the shutdown was
//! cancelled) takes the lock again.
//!
//! - [`groups`]: upstream `migrateConfig` and `groupByPriority`;
//! - [`logind`]: the [`Logind`] seam (upstream `dbusInhibiter`) and the
//!   kubelet seam ([`Node`]);
//! - [`systemd`]: logind and systemd over the system bus (upstream
//!   `nodeshutdown/systemd`);
//! - [`manager`]: the start sequence and the watch loop (upstream
//!   `managerImpl`).

pub mod groups;
pub mod logind;
pub mod manager;
pub mod systemd;
#[cfg(feature = "testing")]
pub mod testing;

use std::path::PathBuf;
use std::time::Duration;

pub use groups::{PriorityGrace, group_by_priority, migrate_config};
pub use logind::{Connect, InhibitLock, KillFailed, Logind, Node, ShutdownEvents, ShutdownPod};
pub use manager::Manager;
pub use systemd::{SystemdConnector, default_system_bus_address};

/// The pod's `status.reason` after a shutdown kill (upstream `nodeShutdownReason`).
pub const POD_REASON: &str = "Terminated";
/// The pod's `status.message` and its `DisruptionTarget` condition's message
/// (upstream `nodeShutdownMessage`).
pub const POD_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The `DisruptionTarget` condition's reason (upstream `PodReasonTerminationByKubelet`).
pub const DISRUPTION_REASON: &str = "TerminationByKubelet";
/// Admission's reason while the node shuts down (upstream `nodeShutdownNotAdmittedReason`).
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
/// Admission's message while the node shuts down (upstream `nodeShutdownNotAdmittedMessage`).
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The Node event's reason (upstream `events.NodeShutdown`).
pub const EVENT_REASON: &str = "Shutdown";
/// The Node event when logind announces a shutdown.
pub const EVENT_SHUTDOWN: &str = "Shutdown manager detected shutdown event";
/// The Node event when logind cancels it.
pub const EVENT_CANCELLED: &str = "Shutdown manager detected shutdown cancellation";
/// What upstream's `ShutdownStatus()` says while the node shuts down; the
/// Ready condition shows it as its message.
pub const SHUTTING_DOWN: &str = "node is shutting down";

/// Why talking to logind or systemd failed. Every variant means "run
/// without graceful shutdown for now"; none is fatal to the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The system bus could not be reached.
    #[error("failed to connect to the system bus at {address}")]
    Connect {
        /// The bus address tried.
        address: String,
        /// Why.
        #[source]
        source: zbus::Error,
    },
    /// A D-Bus call got no answer in time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// The call.
        what: &'static str,
        /// Its deadline.
        after: Duration,
    },
    /// Reading logind's `InhibitDelayMaxUSec` failed.
    #[error("failed reading InhibitDelayMaxUSec property from logind")]
    InhibitDelay(#[source] zbus::Error),
    /// logind refused the inhibitor lock.
    #[error("failed creating systemd inhibitor")]
    Inhibit(#[source] zbus::Error),
    /// systemd did not send logind its SIGHUP.
    #[error("unable to reload logind conf")]
    Reload(#[source] zbus::Error),
    /// The `PrepareForShutdown` watch could not be set up.
    #[error("failed to monitor shutdown")]
    Monitor(#[source] zbus::Error),
    /// The logind drop-in could not be written.
    #[error(
        "unable to override inhibit delay by shutdown manager: failed writing logind shutdown inhibit override file {path}"
    )]
    Override {
        /// The drop-in.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// `e` with its sources, `: `-separated, for one log line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
