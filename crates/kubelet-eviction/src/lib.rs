//! The eviction manager (upstream `pkg/kubelet/eviction`): signals and
//! thresholds ([`api`]), observations from the node's stats ([`stats`]),
//! threshold bookkeeping ([`thresholds`]), ranking ([`rank`]), messages
//! ([`message`]), local storage limits ([`local_storage`]), the control
//! loop ([`manager`]), admission under pressure ([`admit`]) and the memory
//! threshold notifiers that wake the loop at once ([`notifier`]).
//!
//! The kubelet implements the seams in [`seams`] and the reclaimers in
//! [`reclaim`].

pub mod admit;
pub mod api;
pub mod local_storage;
pub mod manager;
pub mod message;
pub mod notifier;
pub mod rank;
pub mod reclaim;
pub mod seams;
pub mod stats;
pub mod thresholds;

#[cfg(test)]
mod manager_tests;

pub use admit::Pressure;
pub use api::{NodeCondition, Signal, Threshold, ThresholdConfig, parse_thresholds};
pub use manager::{Config, Deps, Manager};
pub use reclaim::{ContainerGc, ImageGc, ReclaimError};
pub use seams::{ActivePods, Eviction, EvictionMetrics, NoMetrics, PodEvictor, SummaryProvider};

/// Why eviction failed.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// An invalid eviction setting (upstream `ParseThresholdConfig`'s errors).
    #[error("{0}")]
    Config(String),
    /// Stats could not be read.
    #[error("failed to get summary stats: {0}")]
    Stats(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The pod could not be killed.
    #[error("failed to evict pod: {0}")]
    Kill(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A memory threshold notifier could not be set up.
    #[error("memory threshold notifier on {path}: {source}")]
    Notifier {
        /// The cgroup file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}
