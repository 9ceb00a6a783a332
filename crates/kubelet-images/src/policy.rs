//! Upstream `ImageGCPolicy` and `ImageGCPeriod`.

use std::time::Duration;

/// How often the kubelet collects images (upstream `ImageGCPeriod`, fixed).
pub const GC_PERIOD: Duration = Duration::from_secs(5 * 60);

/// The band garbage collection keeps the image filesystem in, and the ages
/// that protect images (upstream `ImageGCPolicy`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// Usage at or above this percentage starts a collection
    /// (`imageGCHighThresholdPercent`).
    pub high_threshold_percent: u8,
    /// A collection frees down to this percentage
    /// (`imageGCLowThresholdPercent`).
    pub low_threshold_percent: u8,
    /// An image first seen less than this long ago is kept
    /// (`imageMinimumGCAge`).
    pub min_age: Duration,
    /// An image unused for longer than this is removed whatever the usage;
    /// zero turns it off (`imageMaximumGCAge`).
    pub max_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

impl ImageGcPolicy {
    /// Upstream turns the periodic collection off at 100%
    /// (`ImageGCHighThresholdPercent == 100`); eviction still reclaims.
    pub fn periodic_gc_enabled(&self) -> bool {
        self.high_threshold_percent < 100
    }
}
