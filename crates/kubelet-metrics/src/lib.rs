//! The kubelet's Prometheus metrics (upstream `pkg/kubelet/metrics`,
//! `pkg/kubelet/server/metrics` and client-go's `rest_client_*` metrics): one
//! registry with upstream's metric names, help, labels and buckets, shared by
//! the runtime, the PLEG, the pod workers, the API client and the server.
//!
//! There is no global registry: the agent builds one [`KubeletMetrics`] and
//! hands an `Arc` of it to whoever records. [`KubeletMetrics::render`] writes
//! the classic Prometheus text format (`text/plain; version=0.0.4`, the
//! format upstream's `/metrics` serves; see [`CONTENT_TYPE`]).

mod families;
pub mod parse;
pub mod prober;
mod render;

use std::time::Duration;

pub use families::{
    HttpLabels, KubeletMetrics, RestClientLabels, StartPhase, container_type, image_size_bucket,
    pod_worker_operation,
};
pub use prober::{ProbeLabels, ProberMetrics};
pub use render::CONTENT_TYPE;

/// Seconds in `d`, as Prometheus observes them.
pub fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
