//! What the eviction manager reads and acts through (upstream
//! `stats.SummaryProvider`, `ActivePodsFunc`, `PodCleanedUpFunc`,
//! `PodTerminator`, and the eviction metrics); the kubelet implements them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::EvictionError;
use crate::stats::Summary;

/// Node and pod stats (upstream `SummaryProvider.Get`).
#[async_trait::async_trait]
pub trait SummaryProvider: Send + Sync + 'static {
    /// A current summary.
    async fn summary(&self) -> Result<Summary, EvictionError>;
}

/// The pods eviction may pick from.
#[async_trait::async_trait]
pub trait ActivePods: Send + Sync + 'static {
    /// Admitted pods that are not terminal (upstream `GetActivePods`).
    fn active_pods(&self) -> Vec<Arc<Pod>>;
    /// Whether an evicted pod's resources are reclaimed: containers gone,
    /// volumes unmounted (upstream `podResourcesAreReclaimed`).
    async fn cleaned_up(&self, pod: &Pod) -> bool;
}

/// How a pod is ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    /// The pod's `status.message`.
    pub message: String,
    /// Seconds every container gets.
    pub grace_period_seconds: i64,
    /// Whether the pod gets the `DisruptionTarget` condition
    /// (`TerminationByKubelet`).
    pub disruption_target: bool,
    /// The `Evicted` event's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Ends a pod and waits for it (upstream `TerminatePodAbnormallyAndWait`).
#[async_trait::async_trait]
pub trait PodEvictor: Send + Sync + 'static {
    /// Stops `pod` with `Failed`/`Evicted`; returns once it is stopped.
    async fn evict(&self, pod: &Arc<Pod>, eviction: Eviction) -> Result<(), EvictionError>;
}

/// Eviction's metrics (upstream `kubelet_evictions`,
/// `kubelet_eviction_stats_age_seconds`).
pub trait EvictionMetrics: Send + Sync + 'static {
    /// A pod was evicted for `signal`.
    fn evicted(&self, signal: &str);
    /// The stats a met threshold was judged on were `age` old.
    fn stats_age(&self, signal: &str, age: Duration);
}

/// No metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoMetrics;

impl EvictionMetrics for NoMetrics {
    fn evicted(&self, _: &str) {}
    fn stats_age(&self, _: &str, _: Duration) {}
}
