//! Eviction settings (upstream `evictionHard`, `evictionSoft`,
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`,
//! `evictionPressureTransitionPeriod`, `evictionMaxPodGracePeriod`), as
//! written: the eviction manager parses the thresholds (upstream
//! `eviction.ParseThresholdConfig`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Inputs;
use crate::ConfigError;

/// The eviction manager's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    /// `evictionSoft`: signal -> threshold.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal -> duration.
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`: signal -> quantity or percentage.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (5m).
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (0).
    pub max_pod_grace_period: i64,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
        }
    }
}

/// Resolves the fields (`evictionHard` is in [`crate::ClusterConfig`]).
pub fn resolve(_inputs: &Inputs<'_>) -> Result<EvictionConfig, ConfigError> {
    Ok(EvictionConfig::default())
}
