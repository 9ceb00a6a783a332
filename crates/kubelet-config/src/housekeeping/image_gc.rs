//! Image garbage collection settings (upstream `imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge`, `imageMaximumGCAge`).

use std::time::Duration;

use super::Inputs;
use crate::ConfigError;

/// Upstream `ImageGCPolicy`, as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageGcConfig {
    /// `imageGCHighThresholdPercent` (85).
    pub high_threshold_percent: i32,
    /// `imageGCLowThresholdPercent` (80).
    pub low_threshold_percent: i32,
    /// `imageMinimumGCAge` (2m).
    pub minimum_gc_age: Duration,
    /// `imageMaximumGCAge` (0: off).
    pub maximum_gc_age: Duration,
}

impl Default for ImageGcConfig {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_gc_age: Duration::from_secs(120),
            maximum_gc_age: Duration::ZERO,
        }
    }
}

/// Resolves the fields.
pub fn resolve(_inputs: &Inputs<'_>) -> Result<ImageGcConfig, ConfigError> {
    Ok(ImageGcConfig::default())
}
