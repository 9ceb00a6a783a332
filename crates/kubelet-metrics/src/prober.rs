//! The prober's metrics (upstream `pkg/kubelet/prober/prober_manager.go`
//! `ProberResults` and `ProberDuration`), served on their own at
//! `/metrics/probes` as upstream does.

use std::collections::HashMap;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::families::{Builder, HistogramFamily, def_histogram, hf};
use crate::render::{Descriptor, render_registry};
use crate::seconds;

/// The probe a sample is about (upstream's label values).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: &'static str,
    /// The container's name.
    pub container: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    probe_type: &'static str,
    result: &'static str,
    container: String,
    pod: String,
    namespace: String,
    pod_uid: String,
}

/// `prober_probe_total` and `prober_probe_duration_seconds`.
pub struct ProberMetrics {
    registry: Registry,
    descriptors: HashMap<String, Descriptor>,
    results: Family<ResultLabels, Counter>,
    duration: HistogramFamily<ProbeLabels>,
}

impl std::fmt::Debug for ProberMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProberMetrics").finish_non_exhaustive()
    }
}

impl Default for ProberMetrics {
    fn default() -> Self {
        let mut b = Builder {
            registry: Registry::default(),
            descriptors: HashMap::new(),
        };
        let results = b.add(
            "prober_probe_total",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            &Family::default(),
        );
        let duration = b.add(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response.",
            &hf(def_histogram),
        );
        Self {
            registry: b.registry,
            descriptors: b.descriptors,
            results,
            duration,
        }
    }
}

impl ProberMetrics {
    /// One probe ran for `took` with `result` (`successful`, `failed` or
    /// `unknown`, upstream's values).
    pub fn observe(
        &self,
        labels: &ProbeLabels,
        pod_uid: &str,
        result: &'static str,
        took: Duration,
    ) {
        self.results
            .get_or_create(&ResultLabels {
                probe_type: labels.probe_type,
                result,
                container: labels.container.clone(),
                pod: labels.pod.clone(),
                namespace: labels.namespace.clone(),
                pod_uid: pod_uid.to_string(),
            })
            .inc();
        self.duration.get_or_create(labels).observe(seconds(took));
    }

    /// Drops a stopped worker's series (upstream deletes them with the worker).
    pub fn forget(&self, labels: &ProbeLabels, pod_uid: &str) {
        for result in ["successful", "failed", "unknown"] {
            self.results.remove(&ResultLabels {
                probe_type: labels.probe_type,
                result,
                container: labels.container.clone(),
                pod: labels.pod.clone(),
                namespace: labels.namespace.clone(),
                pod_uid: pod_uid.to_string(),
            });
        }
        self.duration.remove(labels);
    }

    /// `/metrics/probes` in the Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        render_registry(&self.registry, |r| self.descriptors.get(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_results_and_durations_render_with_upstream_names() {
        let m = ProberMetrics::default();
        let l = ProbeLabels {
            probe_type: "Readiness",
            container: "c".into(),
            pod: "p".into(),
            namespace: "ns".into(),
        };
        m.observe(&l, "u1", "successful", Duration::from_millis(3));
        m.observe(&l, "u1", "successful", Duration::from_millis(4));
        let text = m.render();
        assert!(text.contains("# HELP prober_probe_total [ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n"), "{text}");
        assert!(
            text.contains("# TYPE prober_probe_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("prober_probe_total{probe_type=\"Readiness\",result=\"successful\",container=\"c\",pod=\"p\",namespace=\"ns\",pod_uid=\"u1\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("prober_probe_duration_seconds_count{probe_type=\"Readiness\",container=\"c\",pod=\"p\",namespace=\"ns\"} 2\n"), "{text}");
        m.forget(&l, "u1");
        assert!(!m.render().contains("pod_uid=\"u1\""));
    }
}
