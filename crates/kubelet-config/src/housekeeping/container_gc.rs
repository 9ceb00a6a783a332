//! Container garbage collection settings (upstream `KubeletFlags`
//! `--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`,
//! `--maximum-dead-containers`, deprecated but still honoured upstream;
//! `kubecontainer.GCPolicy`).

use std::time::Duration;

use super::Inputs;
use crate::ConfigError;

/// Upstream `GCPolicy`.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerGcConfig {
    /// `--minimum-container-ttl-duration` (0).
    pub min_age: Duration,
    /// `--maximum-dead-containers-per-container` (1).
    pub max_per_pod_container: i32,
    /// `--maximum-dead-containers` (-1: no limit).
    pub max_containers: i32,
}

impl Default for ContainerGcConfig {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// Resolves the flags.
pub fn resolve(_inputs: &Inputs<'_>) -> Result<ContainerGcConfig, ConfigError> {
    Ok(ContainerGcConfig::default())
}
