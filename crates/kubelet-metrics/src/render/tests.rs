use std::time::Duration;

use crate::parse::parse;
use crate::{HttpLabels, KubeletMetrics, RestClientLabels, StartPhase, container_type};

fn record_everything(m: &KubeletMetrics) {
    let d = Duration::from_millis(30);
    m.set_node_name("node-a");
    m.add_images_garbage_collected("space", 2);
    m.add_container_gc_removed("container", 3);
    m.add_container_log_rotations(4, 1);
    m.set_running(3, &[("running", 4), ("exited", 1)]);
    m.observe_pod_start(Duration::from_secs(2));
    m.observe_pod_worker("sync", d);
    m.observe_pleg_relist(d, Some(Duration::from_secs(1)));
    m.set_pleg_last_seen(1_700_000_000.0);
    m.record_runtime_operation("list_podsandbox", d, false);
    m.record_runtime_operation("create_container", d, true);
    m.record_run_pod_sandbox("", d, false);
    m.inc_evictions("memory.available");
    m.record_started_pod(false);
    m.record_started_container(container_type::CONTAINER, Some("CreateContainerError"));
    m.observe_start_phase(StartPhase::ImagePull, d);
    m.observe_image_pull(50 * 1024 * 1024, Duration::from_secs(3));
    let l = HttpLabels {
        method: "GET",
        path: "pods",
        server_type: "readwrite",
        long_running: "false",
    };
    m.http_request_started(&l);
    m.http_request_finished(&l, d);
    m.record_rest_client_request(
        RestClientLabels {
            code: "200".into(),
            method: "GET".into(),
            host: "10.0.0.1:6443".into(),
        },
        d,
    );
}

/// (family, type, labels its samples carry besides `le`)
const FAMILIES: &[(&str, &str, &[&str])] = &[
    ("kubelet_node_name", "gauge", &["node"]),
    ("kubelet_running_pods", "gauge", &[]),
    ("kubelet_running_containers", "gauge", &["container_state"]),
    ("kubelet_pod_start_duration_seconds", "histogram", &[]),
    (
        "kubelet_pod_worker_duration_seconds",
        "histogram",
        &["operation_type"],
    ),
    ("kubelet_pleg_relist_duration_seconds", "histogram", &[]),
    ("kubelet_pleg_relist_interval_seconds", "histogram", &[]),
    ("kubelet_pleg_last_seen_seconds", "gauge", &[]),
    (
        "kubelet_runtime_operations_total",
        "counter",
        &["operation_type"],
    ),
    (
        "kubelet_runtime_operations_errors_total",
        "counter",
        &["operation_type"],
    ),
    (
        "kubelet_runtime_operations_duration_seconds",
        "histogram",
        &["operation_type"],
    ),
    (
        "kubelet_run_podsandbox_duration_seconds",
        "histogram",
        &["runtime_handler"],
    ),
    ("kubelet_evictions", "counter", &["eviction_signal"]),
    (
        "kubelet_image_garbage_collected_total",
        "counter",
        &["reason"],
    ),
    ("kubelet_container_gc_removed_total", "counter", &["object"]),
    ("kubelet_container_log_rotations_total", "counter", &[]),
    (
        "kubelet_container_log_rotation_failures_total",
        "counter",
        &[],
    ),
    ("kubelet_started_pods_total", "counter", &[]),
    ("kubelet_started_pods_errors_total", "counter", &[]),
    (
        "kubelet_started_containers_total",
        "counter",
        &["container_type"],
    ),
    (
        "kubelet_started_containers_errors_total",
        "counter",
        &["container_type", "code"],
    ),
    (
        "kubelet_pod_start_phase_duration_seconds",
        "histogram",
        &["phase"],
    ),
    (
        "kubelet_image_pull_duration_seconds",
        "histogram",
        &["image_size_in_bytes"],
    ),
    (
        "kubelet_http_requests_total",
        "counter",
        &["method", "path", "server_type", "long_running"],
    ),
    (
        "kubelet_http_requests_duration_seconds",
        "histogram",
        &["method", "path", "server_type", "long_running"],
    ),
    (
        "kubelet_http_inflight_requests",
        "gauge",
        &["method", "path", "server_type", "long_running"],
    ),
    (
        "rest_client_requests_total",
        "counter",
        &["code", "method", "host"],
    ),
    (
        "rest_client_request_duration_seconds",
        "histogram",
        &["verb", "host"],
    ),
];

#[test]
fn render_parses_as_prometheus_text_with_every_family_and_its_labels() {
    let m = KubeletMetrics::new();
    record_everything(&m);
    let text = m.render();
    assert!(!text.contains("# EOF"), "{text}");
    let families = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for (name, kind, labels) in FAMILIES {
        let f = families
            .get(*name)
            .unwrap_or_else(|| panic!("family {name} missing:\n{text}"));
        assert_eq!(f.kind, *kind, "{name}");
        assert!(!f.help.is_empty(), "{name}");
        assert!(!f.samples.is_empty(), "{name} has no samples");
        for s in &f.samples {
            let keys: Vec<&str> = s
                .labels
                .iter()
                .map(|(k, _)| k.as_str())
                .filter(|k| *k != "le")
                .collect();
            assert_eq!(&keys, labels, "{name}: {s:?}");
        }
    }
    // kubelet_run_podsandbox_errors_total has no sample yet, so it is not written.
    assert_eq!(families.len(), FAMILIES.len(), "{:?}", families.keys());
}

#[test]
fn help_is_upstream_verbatim_and_counters_keep_their_upstream_names() {
    let m = KubeletMetrics::new();
    record_everything(&m);
    let text = m.render();
    assert!(text.contains(
        "# HELP kubelet_started_pods_total [ALPHA] Cumulative number of pods started\n# TYPE kubelet_started_pods_total counter\nkubelet_started_pods_total 1\n"
    ), "{text}");
    assert!(
        text.contains("kubelet_evictions{eviction_signal=\"memory.available\"} 1\n"),
        "{text}"
    );
    assert!(!text.contains("_total_total"), "{text}");
    // client_golang metrics of the server carry no stability prefix.
    assert!(text.contains("# HELP kubelet_http_requests_total Number of the http requests received since the server started\n"), "{text}");
    assert!(
        text.contains("kubelet_node_name{node=\"node-a\"} 1\n"),
        "{text}"
    );
}

#[test]
fn runtime_operation_errors_count_only_failures_and_buckets_are_upstreams() {
    let m = KubeletMetrics::new();
    m.record_runtime_operation("create_container", Duration::from_millis(1), true);
    m.record_runtime_operation("create_container", Duration::from_millis(1), false);
    let f = parse(&m.render()).unwrap();
    let ops = &f["kubelet_runtime_operations_total"].samples;
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].value, 2.0);
    assert_eq!(
        f["kubelet_runtime_operations_errors_total"].samples[0].value,
        1.0
    );
    // ExponentialBuckets(.005, 2.5, 14) plus +Inf.
    let buckets = &f["kubelet_runtime_operations_duration_seconds"].samples;
    let les: Vec<&str> = buckets.iter().filter_map(|s| s.label("le")).collect();
    assert_eq!(les.len(), 15);
    assert_eq!(les[0], "0.005");
    assert_eq!(les[14], "+Inf");
}

#[test]
fn vectors_without_children_are_omitted_as_client_golang_does() {
    let m = KubeletMetrics::new();
    let f = parse(&m.render()).unwrap();
    assert!(!f.contains_key("kubelet_evictions"));
    assert_eq!(f["kubelet_running_pods"].samples[0].value, 0.0);
    assert_eq!(f["kubelet_started_pods_total"].samples[0].value, 0.0);
}

#[test]
fn the_parser_rejects_openmetrics_counters_and_eof() {
    let om = "# HELP c x.\n# TYPE c counter\nc_total 1\n";
    assert!(parse(om).is_err());
    assert!(parse("# TYPE c counter\nc 1\n# EOF\n").is_err());
    assert!(parse("# TYPE c counter\nc{a=\"q\\\"x\"} 1\n").is_ok());
}

#[test]
fn image_sizes_bucket_as_upstream() {
    use crate::image_size_bucket;
    assert_eq!(image_size_bucket(0), "N/A");
    assert_eq!(image_size_bucket(1), "0-10MB");
    assert_eq!(image_size_bucket(10 * 1024 * 1024), "0-10MB");
    assert_eq!(image_size_bucket(10 * 1024 * 1024 + 1), "10MB-100MB");
    assert_eq!(image_size_bucket(3 << 30), "1GB-5GB");
    assert_eq!(image_size_bucket(200 << 30), "GT100GB");
}
