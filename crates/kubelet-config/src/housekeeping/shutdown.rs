//! Graceful node shutdown settings (upstream `shutdownGracePeriod`,
//! `shutdownGracePeriodCriticalPods`, `shutdownGracePeriodByPodPriority`).

use std::time::Duration;

use super::Inputs;
use crate::ConfigError;

/// One `shutdownGracePeriodByPodPriority` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityGrace {
    /// Pods at this priority or above (up to the next entry).
    pub priority: i32,
    /// Their grace period, in seconds.
    pub shutdown_grace_period_seconds: i64,
}

/// The node shutdown manager's settings.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ShutdownConfig {
    /// `shutdownGracePeriod` (0: off).
    pub grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods` (0).
    pub grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority` (empty).
    pub by_pod_priority: Vec<PriorityGrace>,
}

/// Resolves the fields.
pub fn resolve(_inputs: &Inputs<'_>) -> Result<ShutdownConfig, ConfigError> {
    Ok(ShutdownConfig::default())
}
