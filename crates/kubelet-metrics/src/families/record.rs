//! The recording side of [`KubeletMetrics`]: one method per thing the
//! kubelet observes (upstream's call sites of `pkg/kubelet/metrics`).

use std::time::Duration;

use super::*;

impl KubeletMetrics {
    /// `kubelet_node_name{node} 1` (upstream sets it once at startup).
    pub fn set_node_name(&self, node: &str) {
        self.node_name.clear();
        self.node_name
            .get_or_create(&NodeLabel {
                node: node.to_string(),
            })
            .set(1);
    }

    /// `kubelet_apiserver_fallback_info{request, choice, server_version} 1`:
    /// the form of `request` in use (`choice`) with the apiserver of
    /// `server_version` (empty when unknown); replaces the request's earlier
    /// sample.
    pub fn set_apiserver_fallback(
        &self,
        request: &'static str,
        choice: &'static str,
        server_version: &str,
    ) {
        let labels = FallbackLabels {
            request,
            choice,
            server_version: server_version.to_string(),
        };
        let mut last = self.apiserver_fallback_last.lock();
        if let Some(before) = last.insert(request, labels.clone()) {
            self.apiserver_fallback.remove(&before);
        }
        self.apiserver_fallback.get_or_create(&labels).set(1);
    }

    /// `kubelet_running_pods` and `kubelet_running_containers{container_state}`,
    /// from one relist of the runtime. `containers` holds a count per CRI
    /// state (`created`, `running`, `exited`, `unknown`).
    pub fn set_running(&self, pods: usize, containers: &[(&'static str, usize)]) {
        self.running_pods
            .set(i64::try_from(pods).unwrap_or(i64::MAX));
        for (state, n) in containers {
            self.running_containers
                .get_or_create(&ContainerStateLabel {
                    container_state: state,
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// `kubelet_pod_start_duration_seconds`: the kubelet first saw the pod `d` ago and it now runs.
    pub fn observe_pod_start(&self, d: Duration) {
        self.pod_start_duration.observe(seconds(d));
    }

    /// `kubelet_pod_worker_duration_seconds{operation_type}`; see [`pod_worker_operation`].
    pub fn observe_pod_worker(&self, operation_type: &'static str, d: Duration) {
        self.pod_worker_duration
            .get_or_create(&OperationLabel { operation_type })
            .observe(seconds(d));
    }

    /// One PLEG relist took `duration`; `interval` since the previous
    /// successful relist started, if this one succeeded and one came before.
    pub fn observe_pleg_relist(&self, duration: Duration, interval: Option<Duration>) {
        self.pleg_relist_duration.observe(seconds(duration));
        if let Some(i) = interval {
            self.pleg_relist_interval.observe(seconds(i));
        }
    }

    /// `kubelet_pleg_last_seen_seconds`: when the PLEG last relisted
    /// successfully, in seconds since the Unix epoch.
    pub fn set_pleg_last_seen(&self, unix_seconds: f64) {
        self.pleg_last_seen.set(unix_seconds);
    }

    /// One CRI call (`operation_type` as upstream's instrumented services name it).
    pub fn record_runtime_operation(
        &self,
        operation_type: &'static str,
        d: Duration,
        failed: bool,
    ) {
        let l = OperationLabel { operation_type };
        self.runtime_operations.get_or_create(&l).inc();
        self.runtime_operations_duration
            .get_or_create(&l)
            .observe(seconds(d));
        if failed {
            self.runtime_operations_errors.get_or_create(&l).inc();
        }
    }

    /// One `RunPodSandbox` with `runtime_handler`.
    pub fn record_run_pod_sandbox(&self, runtime_handler: &str, d: Duration, failed: bool) {
        let l = RuntimeHandlerLabel {
            runtime_handler: runtime_handler.to_string(),
        };
        self.run_podsandbox_duration
            .get_or_create(&l)
            .observe(seconds(d));
        if failed {
            self.run_podsandbox_errors.get_or_create(&l).inc();
        }
    }

    /// `kubelet_evictions{eviction_signal}`.
    pub fn inc_evictions(&self, eviction_signal: &str) {
        self.evictions
            .get_or_create(&EvictionLabel {
                eviction_signal: eviction_signal.to_string(),
            })
            .inc();
    }

    /// `kubelet_eviction_stats_age_seconds{eviction_signal}`: the stats a
    /// met threshold was judged on were `age` old when eviction acted.
    pub fn observe_eviction_stats_age(&self, eviction_signal: &str, age: Duration) {
        self.eviction_stats_age
            .get_or_create(&EvictionLabel {
                eviction_signal: eviction_signal.to_string(),
            })
            .observe(seconds(age));
    }

    /// `kubelet_image_garbage_collected_total{reason}`: `n` images removed
    /// for `reason` (`age`: unused longer than `imageMaximumGCAge`;
    /// `space`: above `imageGCHighThresholdPercent`).
    pub fn add_images_garbage_collected(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.image_garbage_collected
                .get_or_create(&ReasonLabel { reason })
                .inc_by(n);
        }
    }

    /// `kubelet_container_gc_removed_total{object}`: `n` objects
    /// (`container`, `sandbox`, `log_dir`) removed by container GC.
    pub fn add_container_gc_removed(&self, object: &'static str, n: u64) {
        if n > 0 {
            self.container_gc_removed
                .get_or_create(&ObjectLabel { object })
                .inc_by(n);
        }
    }

    /// `kubelet_container_log_rotations_total` and
    /// `kubelet_container_log_rotation_failures_total`.
    pub fn add_container_log_rotations(&self, rotations: u64, failures: u64) {
        self.container_log_rotations.inc_by(rotations);
        self.container_log_rotation_failures.inc_by(failures);
    }

    /// A sandbox creation was attempted (`kubelet_started_pods_total`,
    /// and `kubelet_started_pods_errors_total` when it failed).
    pub fn record_started_pod(&self, failed: bool) {
        self.started_pods.inc();
        if failed {
            self.started_pods_errors.inc();
        }
    }

    /// A container start was attempted (`kubelet_started_containers_total`;
    /// `code` is the failure's reason, e.g. `CreateContainerError`).
    pub fn record_started_container(&self, container_type: &'static str, error_code: Option<&str>) {
        self.started_containers
            .get_or_create(&ContainerTypeLabel { container_type })
            .inc();
        if let Some(code) = error_code {
            self.started_containers_errors
                .get_or_create(&ContainerErrorLabel {
                    container_type,
                    code: code.to_string(),
                })
                .inc();
        }
    }

    /// `kubelet_pod_start_phase_duration_seconds{phase}` (kubelet-rs's breakdown).
    pub fn observe_start_phase(&self, phase: StartPhase, d: Duration) {
        self.start_phase
            .get_or_create(&PhaseLabel {
                phase: phase.as_str(),
            })
            .observe(seconds(d));
    }

    /// A successful image pull of `size_in_bytes` (0 when unknown) took `d`,
    /// waiting for its turn included (`kubelet_image_pull_duration_seconds`).
    pub fn observe_image_pull(&self, size_in_bytes: u64, d: Duration) {
        self.image_pull_duration
            .get_or_create(&ImageSizeLabel {
                image_size_in_bytes: image_size_bucket(size_in_bytes),
            })
            .observe(seconds(d));
    }

    /// A request arrived: counts it and marks it in flight.
    pub fn http_request_started(&self, l: &HttpLabels) {
        self.http_requests.get_or_create(l).inc();
        self.http_inflight.get_or_create(l).inc();
    }

    /// A request finished after `d` (its response, or its upgraded stream, ended).
    pub fn http_request_finished(&self, l: &HttpLabels, d: Duration) {
        self.http_inflight.get_or_create(l).dec();
        self.http_duration.get_or_create(l).observe(seconds(d));
    }

    /// One request to the apiserver (`verb` is the method, as client-go labels it).
    pub fn record_rest_client_request(&self, labels: RestClientLabels, d: Duration) {
        self.rest_client_duration
            .get_or_create(&RestClientLatencyLabels {
                verb: labels.method.clone(),
                host: labels.host.clone(),
            })
            .observe(seconds(d));
        self.rest_client_requests.get_or_create(&labels).inc();
    }
}
