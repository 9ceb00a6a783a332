//! Pod startup latency (upstream `Kubelet.SyncPod` observing
//! `kubelet_pod_start_duration_seconds` from the pod's first-seen time), and
//! kubelet-rs's startup breakdown: the `first_ready` phase, and each sync's
//! step timings recorded on the pod worker's span.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_metrics::{KubeletMetrics, StartPhase};
use kubelet_runtime::StartTimings;
use kubelet_types::{labels, pod};
use parking_lot::Mutex;

/// Observes when pods start running and first become ready.
pub(crate) struct StartRecorder {
    metrics: Arc<KubeletMetrics>,
    /// Pods whose first readiness was observed (each pod counts once).
    ready_seen: Mutex<HashSet<String>>,
}

/// How long ago the kubelet first saw `p` (its `kubernetes.io/config.seen`
/// annotation, as upstream's `firstSeenTime`).
fn since_first_seen(p: &Pod, now: jiff::Timestamp) -> Option<Duration> {
    let seen: jiff::Timestamp = p
        .metadata
        .annotations
        .as_ref()?
        .get(labels::CONFIG_SEEN)?
        .parse()
        .ok()?;
    Duration::try_from(now.duration_since(seen)).ok()
}

fn phase(s: Option<&PodStatus>) -> Option<&str> {
    s.and_then(|s| s.phase.as_deref())
}

fn is_ready(s: &PodStatus) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

impl StartRecorder {
    pub(crate) fn new(metrics: Arc<KubeletMetrics>) -> Self {
        Self {
            metrics,
            ready_seen: Mutex::new(HashSet::new()),
        }
    }

    /// Called with each status the sync records: `old` the one it replaces.
    /// A pod going from Pending (or no status) to Running observes
    /// `kubelet_pod_start_duration_seconds`; a pod Ready for the first time
    /// observes the `first_ready` phase.
    pub(crate) fn observe(&self, p: &Pod, old: Option<&PodStatus>, new: &PodStatus) {
        self.observe_at(p, old, new, jiff::Timestamp::now());
    }

    fn observe_at(&self, p: &Pod, old: Option<&PodStatus>, new: &PodStatus, now: jiff::Timestamp) {
        let Some(since) = since_first_seen(p, now) else {
            return;
        };
        if matches!(phase(old), None | Some("Pending")) && phase(Some(new)) == Some("Running") {
            self.metrics.observe_pod_start(since);
        }
        if is_ready(new) && self.ready_seen.lock().insert(pod::uid(p).to_string()) {
            self.metrics
                .observe_start_phase(StartPhase::FirstReady, since);
            tracing::Span::current().record("start.first_ready_seconds", since.as_secs_f64());
        }
    }

    /// Forgets a pod that is gone.
    pub(crate) fn forget(&self, uid: &str) {
        self.ready_seen.lock().remove(uid);
    }
}

/// The span a pod's worker runs in, with the startup breakdown fields the
/// pod sync fills ([`record_timings`], first readiness).
pub(crate) fn pod_worker_span(p: &Pod) -> tracing::Span {
    tracing::info_span!(
        "pod_worker",
        pod = %pod::describe(p),
        start.sandbox_seconds = tracing::field::Empty,
        start.image_pull_seconds = tracing::field::Empty,
        start.container_create_seconds = tracing::field::Empty,
        start.container_start_seconds = tracing::field::Empty,
        start.first_ready_seconds = tracing::field::Empty,
    )
}

/// Records the steps a sync took on the current (pod worker) span.
pub(crate) fn record_timings(t: &StartTimings) {
    let span = tracing::Span::current();
    if let Some(d) = t.sandbox {
        span.record("start.sandbox_seconds", d.as_secs_f64());
    }
    for (field, d) in [
        ("start.image_pull_seconds", t.image_pull),
        ("start.container_create_seconds", t.container_create),
        ("start.container_start_seconds", t.container_start),
    ] {
        if !d.is_zero() {
            span.record(field, d.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodCondition;
    use kubelet_metrics::parse::parse;

    use super::*;

    fn pod_seen(at: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some("u1".into());
        p.metadata.annotations = Some([(labels::CONFIG_SEEN.to_string(), at.to_string())].into());
        p
    }

    fn status(phase: &str, ready: bool) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn count(m: &KubeletMetrics, family: &str, phase: Option<&str>) -> Option<(f64, f64)> {
        let f = parse(&m.render()).unwrap();
        let samples = &f.get(family)?.samples;
        let pick = |suffix: &str| {
            samples
                .iter()
                .find(|s| s.name.ends_with(suffix) && s.label("phase") == phase)
                .map(|s| s.value)
        };
        Some((pick("_count")?, pick("_sum")?))
    }

    #[test]
    fn running_and_first_ready_are_observed_once_from_first_seen() {
        let m = Arc::new(KubeletMetrics::new());
        let r = StartRecorder::new(m.clone());
        let p = pod_seen("2026-01-01T00:00:00Z");
        let at = |s: i64| jiff::Timestamp::from_second(1_767_225_600 + s).unwrap();

        r.observe_at(&p, None, &status("Pending", false), at(1));
        assert_eq!(
            count(&m, "kubelet_pod_start_duration_seconds", None),
            Some((0.0, 0.0))
        );
        r.observe_at(
            &p,
            Some(&status("Pending", false)),
            &status("Running", false),
            at(3),
        );
        r.observe_at(
            &p,
            Some(&status("Running", false)),
            &status("Running", false),
            at(4),
        );
        assert_eq!(
            count(&m, "kubelet_pod_start_duration_seconds", None),
            Some((1.0, 3.0))
        );

        r.observe_at(
            &p,
            Some(&status("Running", false)),
            &status("Running", true),
            at(5),
        );
        r.observe_at(
            &p,
            Some(&status("Running", false)),
            &status("Running", true),
            at(9),
        );
        let phases = "kubelet_pod_start_phase_duration_seconds";
        assert_eq!(count(&m, phases, Some("first_ready")), Some((1.0, 5.0)));
        r.forget("u1");
        r.observe_at(&p, None, &status("Running", true), at(6));
        assert_eq!(count(&m, phases, Some("first_ready")), Some((2.0, 11.0)));
    }

    type Fields = Arc<Mutex<Vec<(String, f64)>>>;

    /// Collects the f64 fields recorded on spans after their creation.
    struct Visitor(Fields);

    impl tracing::field::Visit for Visitor {
        fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
            self.0.lock().push((field.name().to_string(), value));
        }
        fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
    }

    /// A layer collecting what is recorded on spans after their creation.
    struct Collector(Fields);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Collector {
        fn on_record(
            &self,
            _: &tracing::span::Id,
            values: &tracing::span::Record<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            values.record(&mut Visitor(self.0.clone()));
        }
    }

    #[test]
    fn the_breakdown_is_recorded_on_the_pod_worker_span() {
        use tracing_subscriber::layer::SubscriberExt;
        let fields = Fields::default();
        let subscriber = tracing_subscriber::registry().with(Collector(fields.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let p = pod_seen("2026-01-01T00:00:00Z");
            let span = pod_worker_span(&p);
            let _in = span.enter();
            record_timings(&StartTimings {
                sandbox: Some(Duration::from_millis(1500)),
                image_pull: Duration::from_secs(4),
                container_create: Duration::ZERO,
                container_start: Duration::from_millis(250),
            });
            let r = StartRecorder::new(Arc::new(KubeletMetrics::new()));
            let at = jiff::Timestamp::from_second(1_767_225_600 + 7).unwrap();
            r.observe_at(&p, None, &status("Running", true), at);
        });
        let mut got = fields.lock().clone();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                ("start.container_start_seconds".to_string(), 0.25),
                ("start.first_ready_seconds".to_string(), 7.0),
                ("start.image_pull_seconds".to_string(), 4.0),
                ("start.sandbox_seconds".to_string(), 1.5),
            ],
            "a step this sync did not take is left empty"
        );
    }

    #[test]
    fn a_pod_without_a_first_seen_time_is_not_observed() {
        let m = Arc::new(KubeletMetrics::new());
        let r = StartRecorder::new(m.clone());
        r.observe(&Pod::default(), None, &status("Running", true));
        assert_eq!(
            count(&m, "kubelet_pod_start_duration_seconds", None),
            Some((0.0, 0.0))
        );
        assert_eq!(
            count(
                &m,
                "kubelet_pod_start_phase_duration_seconds",
                Some("first_ready")
            ),
            None
        );
    }
}
