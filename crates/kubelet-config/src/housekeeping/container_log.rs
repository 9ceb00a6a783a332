//! Container log rotation settings (upstream `containerLogMaxSize`,
//! `containerLogMaxFiles`, `containerLogMaxWorkers`,
//! `containerLogMonitorInterval`).

use std::time::Duration;

use super::Inputs;
use crate::ConfigError;

/// The log manager's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerLogConfig {
    /// `containerLogMaxSize` (`10Mi`), as written (a quantity).
    pub max_size: String,
    /// `containerLogMaxFiles` (5).
    pub max_files: i32,
    /// `containerLogMaxWorkers` (1).
    pub max_workers: i32,
    /// `containerLogMonitorInterval` (10s).
    pub monitor_interval: Duration,
}

impl Default for ContainerLogConfig {
    fn default() -> Self {
        Self {
            max_size: "10Mi".into(),
            max_files: 5,
            max_workers: 1,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

/// Resolves the fields.
pub fn resolve(_inputs: &Inputs<'_>) -> Result<ContainerLogConfig, ConfigError> {
    Ok(ContainerLogConfig::default())
}
