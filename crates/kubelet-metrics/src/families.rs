//! The metric families (upstream `pkg/kubelet/metrics/metrics.go`,
//! `pkg/kubelet/server/metrics/metrics.go`, component-base's
//! `prometheus/restclient`), with upstream's names, help, labels and buckets,
//! and one recording method per thing the kubelet observes.

use std::collections::HashMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

mod podresources;
mod record;

use crate::render::Descriptor;
use crate::seconds;

/// Prometheus' default buckets (`prometheus.DefBuckets`).
const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upstream `podStartupDurationBuckets`.
const POD_STARTUP_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// Buckets of the startup breakdown: 10 ms to 5 min, roughly 2-2.5x apart.
const START_PHASE_BUCKETS: [f64; 16] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0,
];

/// Upstream `imagePullDurationBuckets`.
const IMAGE_PULL_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];

/// Upstream `imageSizeBuckets`: (lower bound in MiB, label).
const IMAGE_SIZE_BUCKETS: [(u64, &str); 12] = [
    (0, "0-10MB"),
    (10, "10MB-100MB"),
    (100, "100MB-500MB"),
    (500, "500MB-1GB"),
    (1024, "1GB-5GB"),
    (5 * 1024, "5GB-10GB"),
    (10 * 1024, "10GB-20GB"),
    (20 * 1024, "20GB-30GB"),
    (30 * 1024, "30GB-40GB"),
    (40 * 1024, "40GB-60GB"),
    (60 * 1024, "60GB-100GB"),
    (100 * 1024, "GT100GB"),
];

/// Upstream `GetImageSizeBucket`: `N/A` for an unknown (zero) size.
pub fn image_size_bucket(size_in_bytes: u64) -> &'static str {
    if size_in_bytes == 0 {
        return "N/A";
    }
    IMAGE_SIZE_BUCKETS
        .iter()
        .rev()
        .find(|(mib, _)| size_in_bytes > mib * 1024 * 1024)
        .map_or("", |(_, label)| label)
}

/// client-go's `rest_client_request_duration_seconds` buckets.
const REST_CLIENT_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// `container_type` label values (upstream `metrics.Container` and friends).
pub mod container_type {
    /// A regular container.
    pub const CONTAINER: &str = "container";
    /// An init container.
    pub const INIT_CONTAINER: &str = "init_container";
    /// An ephemeral container.
    pub const EPHEMERAL_CONTAINER: &str = "ephemeral_container";
}

/// `operation_type` label values of `kubelet_pod_worker_duration_seconds`
/// (upstream `kubetypes.SyncPodType` strings).
pub mod pod_worker_operation {
    /// The first sync of a pod.
    pub const CREATE: &str = "create";
    /// A sync after the pod's spec changed.
    pub const UPDATE: &str = "update";
    /// A periodic or event-driven resync.
    pub const SYNC: &str = "sync";
    /// A kill.
    pub const KILL: &str = "kill";
}

/// A step of a pod's startup (kubelet-rs's breakdown, beyond upstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StartPhase {
    /// `RunPodSandbox`, including the pod's log directory.
    Sandbox,
    /// Ensuring a container's image (a pull, or the presence check).
    ImagePull,
    /// `CreateContainer`, including its config and log directory.
    ContainerCreate,
    /// `StartContainer`.
    ContainerStart,
    /// From the kubelet first seeing the pod to the pod reported Ready.
    FirstReady,
}

impl StartPhase {
    /// The `phase` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sandbox => "sandbox",
            Self::ImagePull => "image_pull",
            Self::ContainerCreate => "container_create",
            Self::ContainerStart => "container_start",
            Self::FirstReady => "first_ready",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    request: &'static str,
    choice: &'static str,
    server_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerStateLabel {
    container_state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuntimeHandlerLabel {
    runtime_handler: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabel {
    eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabel {
    object: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerTypeLabel {
    container_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerErrorLabel {
    container_type: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ImageSizeLabel {
    image_size_in_bytes: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

/// Labels of the kubelet server's request metrics (upstream
/// `servermetrics.HTTPRequests`): the method and path already bucketed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The HTTP method, or `other` for a method upstream does not list.
    pub method: &'static str,
    /// The path bucket (`pods`, `exec`, `metrics/resource`, ...), or `other`.
    pub path: &'static str,
    /// `readwrite` (10250) or `readonly` (10255).
    pub server_type: &'static str,
    /// `true` for exec, attach, portforward and debug.
    pub long_running: &'static str,
}

/// Labels of `rest_client_requests_total` (client-go).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestClientLabels {
    /// The response's status code, or `<error>` when there was none.
    pub code: String,
    /// The request method.
    pub method: String,
    /// The apiserver's host (and port).
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestClientLatencyLabels {
    verb: String,
    host: String,
}

pub(crate) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub(crate) fn hf<L: Clone + std::hash::Hash + Eq>(f: fn() -> Histogram) -> HistogramFamily<L> {
    Family::new_with_constructor(f)
}

pub(crate) fn def_histogram() -> Histogram {
    Histogram::new(DEF_BUCKETS)
}
fn runtime_op_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}
fn start_phase_histogram() -> Histogram {
    Histogram::new(START_PHASE_BUCKETS)
}
fn image_pull_histogram() -> Histogram {
    Histogram::new(IMAGE_PULL_BUCKETS)
}
fn rest_client_histogram() -> Histogram {
    Histogram::new(REST_CLIENT_BUCKETS)
}

/// Every kubelet metric family, and the registry that exposes them.
pub struct KubeletMetrics {
    registry: Registry,
    descriptors: HashMap<String, Descriptor>,

    node_name: Family<NodeLabel, Gauge>,
    apiserver_fallback: Family<FallbackLabels, Gauge>,
    /// The sample of each request in `apiserver_fallback`.
    apiserver_fallback_last: parking_lot::Mutex<HashMap<&'static str, FallbackLabels>>,
    running_pods: Gauge,
    running_containers: Family<ContainerStateLabel, Gauge>,
    pod_start_duration: Histogram,
    pod_worker_duration: HistogramFamily<OperationLabel>,
    pleg_relist_duration: Histogram,
    pleg_relist_interval: Histogram,
    pleg_last_seen: Gauge<f64, std::sync::atomic::AtomicU64>,
    runtime_operations: Family<OperationLabel, Counter>,
    runtime_operations_errors: Family<OperationLabel, Counter>,
    runtime_operations_duration: HistogramFamily<OperationLabel>,
    run_podsandbox_duration: HistogramFamily<RuntimeHandlerLabel>,
    run_podsandbox_errors: Family<RuntimeHandlerLabel, Counter>,
    evictions: Family<EvictionLabel, Counter>,
    eviction_stats_age: HistogramFamily<EvictionLabel>,
    image_garbage_collected: Family<ReasonLabel, Counter>,
    container_gc_removed: Family<ObjectLabel, Counter>,
    container_log_rotations: Counter,
    container_log_rotation_failures: Counter,
    started_pods: Counter,
    started_pods_errors: Counter,
    started_containers: Family<ContainerTypeLabel, Counter>,
    started_containers_errors: Family<ContainerErrorLabel, Counter>,
    start_phase: HistogramFamily<PhaseLabel>,
    image_pull_duration: HistogramFamily<ImageSizeLabel>,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: HistogramFamily<HttpLabels>,
    http_inflight: Family<HttpLabels, Gauge>,
    rest_client_requests: Family<RestClientLabels, Counter>,
    rest_client_duration: HistogramFamily<RestClientLatencyLabels>,
    prober: crate::ProberMetrics,
    pod_resources: podresources::PodResourcesCounters,
}

impl std::fmt::Debug for KubeletMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletMetrics").finish_non_exhaustive()
    }
}

impl Default for KubeletMetrics {
    fn default() -> Self {
        Self::new()
    }
}

pub(crate) struct Builder {
    pub(crate) registry: Registry,
    pub(crate) descriptors: HashMap<String, Descriptor>,
}

impl Builder {
    /// Registers an ALPHA component-base metric: upstream's help carries the
    /// `[ALPHA] ` prefix component-base adds.
    pub(crate) fn add<M: Metric + Clone>(
        &mut self,
        name: &'static str,
        help: &'static str,
        m: &M,
    ) -> M {
        self.register(name, format!("[ALPHA] {help}"), m)
    }

    /// Registers `metric` so that it is exposed as `name` with `help`.
    /// Counters are registered without `_total` (the library appends it
    /// to samples); the renderer puts the exposed name back on HELP/TYPE.
    fn register<M: Metric + Clone>(&mut self, name: &'static str, help: String, m: &M) -> M {
        let registered = name.strip_suffix("_total").unwrap_or(name);
        self.registry.register(registered, help.clone(), m.clone());
        self.descriptors
            .insert(registered.to_string(), Descriptor { name, help });
        m.clone()
    }
}

impl KubeletMetrics {
    /// A registry with every family registered and no samples yet.
    pub fn new() -> Self {
        let mut b = Builder {
            registry: Registry::default(),
            descriptors: HashMap::new(),
        };
        let node_name = b.add(
            "kubelet_node_name",
            "The node's name. The count is always 1.",
            &Family::default(),
        );
        let apiserver_fallback = b.add(
            "kubelet_apiserver_fallback_info",
            "A kubelet-rs addition: which form of a request the kubelet uses with this apiserver, for requests older apiservers refuse. The count is always 1.",
            &Family::default(),
        );
        let running_pods = b.add(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            &Gauge::default(),
        );
        let running_containers = b.add(
            "kubelet_running_containers",
            "Number of containers currently running",
            &Family::default(),
        );
        let pod_start_duration = b.add(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            &Histogram::new(POD_STARTUP_BUCKETS),
        );
        let pod_worker_duration = b.add(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            &hf(def_histogram),
        );
        let pleg_relist_duration = b.add(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.",
            &def_histogram(),
        );
        let pleg_relist_interval = b.add(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG.",
            &def_histogram(),
        );
        let pleg_last_seen = b.add(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
            &Gauge::default(),
        );
        let runtime_operations = b.add(
            "kubelet_runtime_operations_total",
            "Cumulative number of runtime operations by operation type.",
            &Family::default(),
        );
        let runtime_operations_errors = b.add(
            "kubelet_runtime_operations_errors_total",
            "Cumulative number of runtime operation errors by operation type.",
            &Family::default(),
        );
        let runtime_operations_duration = b.add(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            &hf(runtime_op_histogram),
        );
        let run_podsandbox_duration = b.add(
            "kubelet_run_podsandbox_duration_seconds",
            "Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler.",
            &hf(def_histogram),
        );
        let run_podsandbox_errors = b.add(
            "kubelet_run_podsandbox_errors_total",
            "Cumulative number of the run_podsandbox operation errors by RuntimeClass.Handler.",
            &Family::default(),
        );
        let evictions = b.add(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            &Family::default(),
        );
        let eviction_stats_age = b.add(
            "kubelet_eviction_stats_age_seconds",
            "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            &hf(def_histogram),
        );
        let image_garbage_collected = b.add(
            "kubelet_image_garbage_collected_total",
            "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
            &Family::default(),
        );
        let container_gc_removed = b.add(
            "kubelet_container_gc_removed_total",
            "A kubelet-rs addition: dead containers, sandboxes and pod log directories removed by container garbage collection.",
            &Family::default(),
        );
        let container_log_rotations = b.add(
            "kubelet_container_log_rotations_total",
            "A kubelet-rs addition: container logs rotated (renamed and reopened by the runtime).",
            &Counter::default(),
        );
        let container_log_rotation_failures = b.add(
            "kubelet_container_log_rotation_failures_total",
            "A kubelet-rs addition: container log rotations that failed.",
            &Counter::default(),
        );
        let started_pods = b.add(
            "kubelet_started_pods_total",
            "Cumulative number of pods started",
            &Counter::default(),
        );
        let started_pods_errors = b.add(
            "kubelet_started_pods_errors_total",
            "Cumulative number of errors when starting pods",
            &Counter::default(),
        );
        let started_containers = b.add(
            "kubelet_started_containers_total",
            "Cumulative number of containers started",
            &Family::default(),
        );
        let started_containers_errors = b.add(
            "kubelet_started_containers_errors_total",
            "Cumulative number of errors when starting containers",
            &Family::default(),
        );
        let start_phase = b.register(
            "kubelet_pod_start_phase_duration_seconds",
            "kubelet-rs addition (not in upstream): duration in seconds of each step of a pod's startup. \
             Broken down by phase: sandbox, image_pull, container_create, container_start, \
             first_ready (from the kubelet first seeing the pod to the pod Ready)".into(),
            &hf(start_phase_histogram),
        );
        let image_pull_duration = b.add(
            "kubelet_image_pull_duration_seconds",
            "Duration in seconds to pull an image.",
            &hf(image_pull_histogram),
        );
        let http_requests = b.register(
            "kubelet_http_requests_total",
            "Number of the http requests received since the server started".into(),
            &Family::default(),
        );
        let http_duration = b.register(
            "kubelet_http_requests_duration_seconds",
            "Duration in seconds to serve http requests".into(),
            &hf(def_histogram),
        );
        let http_inflight = b.register(
            "kubelet_http_inflight_requests",
            "Number of the inflight http requests".into(),
            &Family::default(),
        );
        let rest_client_requests = b.add(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            &Family::default(),
        );
        let rest_client_duration = b.add(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            &hf(rest_client_histogram),
        );
        let pod_resources = podresources::PodResourcesCounters::register(&mut b);
        Self {
            registry: b.registry,
            descriptors: b.descriptors,
            node_name,
            apiserver_fallback,
            apiserver_fallback_last: Default::default(),
            running_pods,
            running_containers,
            pod_start_duration,
            pod_worker_duration,
            pleg_relist_duration,
            pleg_relist_interval,
            pleg_last_seen,
            runtime_operations,
            runtime_operations_errors,
            runtime_operations_duration,
            run_podsandbox_duration,
            run_podsandbox_errors,
            evictions,
            eviction_stats_age,
            image_garbage_collected,
            container_gc_removed,
            container_log_rotations,
            container_log_rotation_failures,
            started_pods,
            started_pods_errors,
            started_containers,
            started_containers_errors,
            start_phase,
            image_pull_duration,
            http_requests,
            http_duration,
            http_inflight,
            rest_client_requests,
            rest_client_duration,
            prober: crate::ProberMetrics::default(),
            pod_resources,
        }
    }

    /// The prober's families, served on their own at `/metrics/probes`.
    pub fn prober(&self) -> &crate::ProberMetrics {
        &self.prober
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn descriptor(&self, registered: &str) -> Option<&Descriptor> {
        self.descriptors.get(registered)
    }
}
