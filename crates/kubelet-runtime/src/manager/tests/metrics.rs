//! Started pods and containers and the startup breakdown, recorded by the sync path.

use super::*;
use cri::CriError;
use kubelet_metrics::parse::{MetricFamily, parse};

fn value(f: &MetricFamily, pred: impl Fn(&kubelet_metrics::parse::Sample) -> bool) -> Option<f64> {
    f.samples.iter().find(|s| pred(s)).map(|s| s.value)
}

#[tokio::test]
async fn a_pod_start_counts_the_pod_and_its_container_and_times_each_step() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let metrics = Arc::new(KubeletMetrics::new());
    let m = manager(&fake, dir.path()).with_metrics(metrics.clone());
    let (_, r) = sync(&m, &pod("Always"), SystemTime::now()).await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(
        r.timings.sandbox.is_some(),
        "the sandbox was created by this sync"
    );

    let f = parse(&metrics.render()).unwrap();
    assert_eq!(f["kubelet_started_pods_total"].samples[0].value, 1.0);
    assert_eq!(
        value(&f["kubelet_started_containers_total"], |s| s
            .label("container_type")
            == Some("container")),
        Some(1.0)
    );
    assert!(!f.contains_key("kubelet_started_containers_errors_total"));
    let pulls = value(&f["kubelet_image_pull_duration_seconds"], |s| {
        s.name.ends_with("_count") && s.label("image_size_in_bytes") == Some("0-10MB")
    });
    assert_eq!(pulls, Some(1.0), "the fake's images are 1 byte");
    let phases = &f["kubelet_pod_start_phase_duration_seconds"];
    for phase in [
        "sandbox",
        "image_pull",
        "container_create",
        "container_start",
    ] {
        let count = value(phases, |s| {
            s.name.ends_with("_count") && s.label("phase") == Some(phase)
        });
        assert_eq!(count, Some(1.0), "{phase}");
    }

    // A second sync starts nothing and records nothing more.
    let (_, r) = sync(&m, &pod("Always"), SystemTime::now()).await;
    assert_eq!(r.timings, StartTimings::default());
    let f = parse(&metrics.render()).unwrap();
    assert_eq!(f["kubelet_started_pods_total"].samples[0].value, 1.0);
}

#[tokio::test]
async fn failed_starts_count_as_errors_with_their_reason() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let metrics = Arc::new(KubeletMetrics::new());
    let m = manager(&fake, dir.path()).with_metrics(metrics.clone());
    fake.fail_next(
        "RunPodSandbox",
        CriError::Unavailable {
            op: "RunPodSandbox",
            message: "connection refused".into(),
        },
    );
    let (_, r) = sync(&m, &pod("Always"), SystemTime::now()).await;
    assert!(!r.errors.is_empty());
    fake.fail_next(
        "CreateContainer",
        CriError::Unavailable {
            op: "CreateContainer",
            message: "no space".into(),
        },
    );
    let (_, r) = sync(&m, &pod("Always"), SystemTime::now()).await;
    assert!(!r.errors.is_empty());

    let f = parse(&metrics.render()).unwrap();
    assert_eq!(f["kubelet_started_pods_total"].samples[0].value, 2.0);
    assert_eq!(f["kubelet_started_pods_errors_total"].samples[0].value, 1.0);
    let errors = &f["kubelet_started_containers_errors_total"];
    assert_eq!(
        value(errors, |s| s.label("code") == Some("CreateContainerError")
            && s.label("container_type") == Some("container")),
        Some(1.0)
    );
    let phases = &f["kubelet_pod_start_phase_duration_seconds"];
    let starts = value(phases, |s| {
        s.name.ends_with("_count") && s.label("phase") == Some("container_start")
    });
    assert_eq!(starts, None, "no container started");
}
