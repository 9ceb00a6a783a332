//! One probe of one container (upstream `pkg/kubelet/prober/prober.go`):
//! picks the handler (exec, httpGet, tcpSocket, grpc), runs it with
//! retries on errors (`runProbeWithRetries`), records the `Unhealthy` or
//! `ProbeWarning` event, and maps the outcome to a result.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Probe};
use kubelet_runtime::ProbeResult;
use kubelet_types::events::{EventType, Recorder, pod_ref, reason};
use kubelet_types::pod;
use tracing::{debug, trace};

use crate::ProbeType;
use crate::probe::{self, Output, ProbeError, ProbeOutcome};

/// Upstream `maxProbeRetries`: tries per probe when the probe errors.
const MAX_PROBE_RETRIES: usize = 3;

/// Upstream `events.ContainerProbeWarning`.
pub(crate) const PROBE_WARNING: &str = "ProbeWarning";

/// Upstream's defaults for unset probe fields.
pub(crate) const DEFAULT_PERIOD_SECONDS: i32 = 10;
const DEFAULT_TIMEOUT_SECONDS: i32 = 1;
pub(crate) const DEFAULT_SUCCESS_THRESHOLD: i32 = 1;
pub(crate) const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

/// A probe field or its default when unset or not positive.
pub(crate) fn or_default(v: Option<i32>, default: i32) -> i32 {
    v.filter(|v| *v > 0).unwrap_or(default)
}

/// The container's probe of this kind.
pub(crate) fn spec_of(container: &Container, kind: ProbeType) -> Option<&Probe> {
    match kind {
        ProbeType::Liveness => container.liveness_probe.as_ref(),
        ProbeType::Readiness => container.readiness_probe.as_ref(),
        ProbeType::Startup => container.startup_probe.as_ref(),
    }
}

/// Runs probes and records their events.
pub(crate) struct Prober {
    runtime: Arc<dyn cri::RuntimeService>,
    http: probe::http::HttpProber,
    recorder: Arc<dyn Recorder>,
    /// `prober_probe_total` and `prober_probe_duration_seconds`.
    pub(crate) metrics: Option<Arc<kubelet_metrics::KubeletMetrics>>,
}

/// The metric labels of one worker's probe (upstream's `probe_type`,
/// `container`, `pod`, `namespace`).
pub(crate) fn metric_labels(
    kind: ProbeType,
    pod: &Pod,
    container: &Container,
) -> kubelet_metrics::ProbeLabels {
    kubelet_metrics::ProbeLabels {
        probe_type: kind.as_str(),
        container: container.name.clone(),
        pod: pod::name(pod).to_string(),
        namespace: pod::namespace(pod).to_string(),
    }
}

impl Prober {
    pub(crate) fn new(runtime: Arc<dyn cri::RuntimeService>, recorder: Arc<dyn Recorder>) -> Self {
        Self {
            runtime,
            http: probe::http::HttpProber::new(),
            recorder,
            metrics: None,
        }
    }

    /// Probes `container` (runtime ID `container_id`) once. An error means
    /// the result must be thrown away (upstream returns it with Failure).
    pub(crate) async fn probe(
        &self,
        kind: ProbeType,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> Result<ProbeResult, ProbeError> {
        let start = tokio::time::Instant::now();
        let out = self
            .probe_once(kind, pod, status, container, container_id)
            .await;
        if let Some(m) = &self.metrics {
            let result = match &out {
                Ok(ProbeResult::Success) => "successful",
                Ok(ProbeResult::Failure) => "failed",
                Ok(ProbeResult::Unknown) | Err(_) => "unknown",
            };
            m.prober().observe(
                &metric_labels(kind, pod, container),
                pod::uid(pod),
                result,
                start.elapsed(),
            );
        }
        out
    }

    async fn probe_once(
        &self,
        kind: ProbeType,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> Result<ProbeResult, ProbeError> {
        let Some(spec) = spec_of(container, kind) else {
            return Ok(ProbeResult::Success);
        };
        let event = |reason: &str, message: String| {
            self.recorder.event(
                &pod_ref(pod, Some(&container.name)),
                EventType::Warning,
                reason,
                message,
            );
        };
        match self
            .run_with_retries(spec, pod, status, container, container_id)
            .await
        {
            Err(e) => {
                debug!(probe = %kind, pod = %pod::describe(pod), container = %container.name, error = %e, "probe errored");
                event(
                    reason::UNHEALTHY,
                    format!(
                        "{kind} probe errored and resulted in {} state: {e}",
                        e.outcome()
                    ),
                );
                Err(e)
            }
            Ok((ProbeOutcome::Success, _)) => {
                trace!(probe = %kind, pod = %pod::describe(pod), container = %container.name, "probe succeeded");
                Ok(ProbeResult::Success)
            }
            Ok((ProbeOutcome::Warning, output)) => {
                event(PROBE_WARNING, format!("{kind} probe warning: {output}"));
                Ok(ProbeResult::Success)
            }
            Ok((ProbeOutcome::Failure, output)) => {
                debug!(probe = %kind, pod = %pod::describe(pod), container = %container.name, %output, "probe failed");
                event(reason::UNHEALTHY, format!("{kind} probe failed: {output}"));
                Ok(ProbeResult::Failure)
            }
            Ok((ProbeOutcome::Unknown, _)) => Ok(ProbeResult::Failure),
        }
    }

    /// Upstream `runProbeWithRetries`: tries again only when the probe errored.
    async fn run_with_retries(
        &self,
        spec: &Probe,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> Result<Output, ProbeError> {
        let mut last = None;
        for _ in 0..MAX_PROBE_RETRIES {
            match self.run(spec, pod, status, container, container_id).await {
                Ok(out) => return Ok(out),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ProbeError::MissingHandler {
            pod: pod::describe(pod),
            container: container.name.clone(),
        }))
    }

    /// Upstream `runProbe`.
    async fn run(
        &self,
        spec: &Probe,
        pod: &Pod,
        status: &PodStatus,
        container: &Container,
        container_id: &str,
    ) -> Result<Output, ProbeError> {
        let secs = or_default(spec.timeout_seconds, DEFAULT_TIMEOUT_SECONDS);
        let timeout = Duration::from_secs(u64::try_from(secs).unwrap_or(1));
        let pod_ip = status.pod_ip.as_deref().unwrap_or("");
        if let Some(exec) = &spec.exec {
            let cmd = probe::exec::expand_static(
                exec.command.as_deref().unwrap_or_default(),
                container.env.as_deref().unwrap_or_default(),
            );
            return probe::exec::probe(&*self.runtime, container_id, cmd, timeout).await;
        }
        if let Some(action) = &spec.http_get {
            let req = probe::http::request_for(action, container, pod_ip)?;
            return self.http.probe(&req, timeout).await;
        }
        if let Some(tcp) = &spec.tcp_socket {
            let port = probe::resolve_port(&tcp.port, container)?;
            let host = tcp
                .host
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or(pod_ip);
            return Ok(probe::tcp::probe(host, port, timeout).await);
        }
        if let Some(grpc) = &spec.grpc {
            let port = u16::try_from(grpc.port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ProbeError::Port(format!("invalid port number: {}", grpc.port)))?;
            let service = grpc.service.as_deref().unwrap_or("");
            return Ok(probe::grpc::probe(pod_ip, service, port, timeout).await);
        }
        Err(ProbeError::MissingHandler {
            pod: pod::describe(pod),
            container: container.name.clone(),
        })
    }
}
