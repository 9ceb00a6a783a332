use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::{any, get};
use http_body_util::BodyExt;
use kubelet_metrics::KubeletMetrics;
use kubelet_metrics::parse::{MetricFamily, parse};
use tower::ServiceExt;

use super::*;

#[test]
fn paths_bucket_by_their_first_segment_as_upstream() {
    for (path, bucket) in [
        ("/pods", "pods"),
        ("/pods/", "pods"),
        ("/exec/ns/pod/c", "exec"),
        ("/containerLogs/ns/pod/c", "containerLogs"),
        ("/portForward/ns/pod", "portForward"),
        ("/stats/summary", "stats"),
        ("/metrics", "metrics"),
        ("/metrics/resource", "metrics/resource"),
        ("/metrics/probes", "metrics/probes"),
        ("/metrics/nonsense", "other"),
        ("/runningpods/", "runningpods"),
        ("/healthz/syncloop", "healthz"),
        ("/configz", "configz"),
        ("/", "other"),
        ("/spec/", "other"),
        ("/unknown/x", "other"),
    ] {
        assert_eq!(path_bucket(path), bucket, "{path}");
    }
    assert_eq!(method_bucket("GET"), "GET");
    assert_eq!(method_bucket("PATCH"), "other");
    assert_eq!(method_bucket("BREW"), "other");
}

fn family<'a>(
    f: &'a std::collections::BTreeMap<String, MetricFamily>,
    name: &str,
) -> &'a MetricFamily {
    f.get(name).unwrap_or_else(|| panic!("{name} missing"))
}

async fn call(app: &Router, method: Method, uri: &str) -> (StatusCode, String) {
    let resp = app
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn requests_are_counted_with_upstream_labels_and_leave_flight() {
    let metrics = Arc::new(KubeletMetrics::new());
    let app = instrument(
        Router::new()
            .route("/pods", get(|| async { "[]" }))
            .route("/exec/{ns}/{pod}/{c}", any(|| async { "exec" }))
            .merge(routes(metrics.clone())),
        metrics.clone(),
        ServerType::ReadWrite,
    );
    call(&app, Method::GET, "/pods").await;
    call(&app, Method::GET, "/pods").await;
    call(&app, Method::POST, "/exec/ns/p/c").await;
    call(&app, Method::GET, "/nope").await;
    let (status, text) = call(&app, Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let f = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    let total = family(&f, "kubelet_http_requests_total");
    let count = |path: &str, method: &str| {
        total
            .samples
            .iter()
            .find(|s| s.label("path") == Some(path) && s.label("method") == Some(method))
            .map(|s| {
                assert_eq!(s.label("server_type"), Some("readwrite"));
                (
                    s.value,
                    s.label("long_running").unwrap_or_default().to_string(),
                )
            })
    };
    assert_eq!(count("pods", "GET"), Some((2.0, "false".into())));
    assert_eq!(count("exec", "POST"), Some((1.0, "true".into())));
    assert_eq!(count("other", "GET"), Some((1.0, "false".into())));
    // The scrape itself is counted and still in flight while it renders.
    assert_eq!(count("metrics", "GET"), Some((1.0, "false".into())));

    let inflight = family(&f, "kubelet_http_inflight_requests");
    for s in &inflight.samples {
        let expected = if s.label("path") == Some("metrics") {
            1.0
        } else {
            0.0
        };
        assert_eq!(s.value, expected, "{s:?}");
    }
    let durations = family(&f, "kubelet_http_requests_duration_seconds");
    let pods_count = durations
        .samples
        .iter()
        .find(|s| s.name.ends_with("_count") && s.label("path") == Some("pods"))
        .map(|s| s.value);
    assert_eq!(pods_count, Some(2.0));
}

#[tokio::test]
async fn metrics_is_served_as_prometheus_text() {
    let metrics = Arc::new(KubeletMetrics::new());
    metrics.set_node_name("n1");
    let resp = routes(metrics)
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    let f = parse(&text).unwrap();
    assert_eq!(
        family(&f, "kubelet_node_name").samples[0].label("node"),
        Some("n1")
    );
}

#[tokio::test]
async fn the_readonly_server_is_labelled_readonly() {
    let metrics = Arc::new(KubeletMetrics::new());
    let app = instrument(
        Router::new().route("/pods", get(|| async { "[]" })),
        metrics.clone(),
        ServerType::ReadOnly,
    );
    call(&app, Method::GET, "/pods").await;
    let f = parse(&metrics.render()).unwrap();
    let s = &family(&f, "kubelet_http_requests_total").samples[0];
    assert_eq!(s.label("server_type"), Some("readonly"));
}
