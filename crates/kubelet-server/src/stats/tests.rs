//! Tests of the stats routes against a fake provider.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tower::ServiceExt;

use super::summary::*;
use super::*;

fn at(secs: i64) -> Option<Time> {
    Some(Time(jiff::Timestamp::from_second(secs).unwrap()))
}

fn cpu(t: i64, nano_cores: u64, core_ns: u64) -> Option<CpuStats> {
    Some(CpuStats {
        time: at(t),
        usage_nano_cores: Some(nano_cores),
        usage_core_nano_seconds: Some(core_ns),
    })
}

fn mem(t: i64, ws: u64) -> Option<MemoryStats> {
    Some(MemoryStats {
        time: at(t),
        usage_bytes: Some(ws + 100),
        working_set_bytes: Some(ws),
        rss_bytes: Some(ws / 2),
        ..Default::default()
    })
}

fn swap(t: i64, used: u64) -> Option<SwapStats> {
    Some(SwapStats {
        time: at(t),
        swap_available_bytes: Some(1000),
        swap_usage_bytes: Some(used),
    })
}

fn fs(t: i64) -> Option<FsStats> {
    Some(FsStats {
        time: at(t),
        available_bytes: Some(1),
        capacity_bytes: Some(2),
        used_bytes: Some(1),
        ..Default::default()
    })
}

fn sample() -> Summary {
    Summary {
        node: NodeStats {
            node_name: "n1".into(),
            start_time: at(1_000),
            cpu: cpu(2_000, 5, 7_500_000_000),
            memory: mem(2_000, 4096),
            network: Some(NetworkStats {
                time: at(2_000),
                default_interface: InterfaceStats {
                    name: "eth0".into(),
                    rx_bytes: Some(10),
                    ..Default::default()
                },
                interfaces: vec![InterfaceStats {
                    name: "eth0".into(),
                    rx_bytes: Some(10),
                    ..Default::default()
                }],
            }),
            fs: fs(2_000),
            runtime: Some(RuntimeStats {
                image_fs: fs(2_000),
                container_fs: fs(2_000),
            }),
            swap: swap(2_000, 0),
            ..Default::default()
        },
        pods: vec![PodStats {
            pod_ref: PodReference {
                name: "web".into(),
                namespace: "ns".into(),
                uid: "u1".into(),
            },
            start_time: at(1_500),
            containers: vec![ContainerStats {
                name: "app".into(),
                start_time: at(1_600),
                cpu: cpu(2_001, 3, 2_000_000_000),
                memory: mem(2_001, 512),
                rootfs: fs(2_001),
                logs: fs(2_001),
                swap: swap(2_001, 8),
            }],
            cpu: cpu(2_002, 3, 2_500_000_000),
            memory: mem(2_002, 1024),
            ephemeral_storage: fs(2_002),
            swap: swap(2_002, 8),
            ..Default::default()
        }],
    }
}

struct Fake(Option<Summary>);

#[async_trait::async_trait]
impl StatsProvider for Fake {
    async fn summary(&self) -> Result<Summary, StatsError> {
        self.0.clone().ok_or_else(|| {
            StatsError::Runtime(cri::CriError::Unavailable {
                op: "ListPodSandboxStats",
                message: "down".into(),
            })
        })
    }
}

async fn call(fake: Fake, req: Request<Body>) -> (StatusCode, String, String) {
    let resp = routes(Arc::new(fake)).oneshot(req).await.unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8(body.to_vec()).unwrap())
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn summary_uses_upstream_field_names() {
    let (status, ct, body) = call(Fake(Some(sample())), get("/stats/summary")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let node = &v["node"];
    assert_eq!(node["nodeName"], "n1");
    assert_eq!(node["startTime"], "1970-01-01T00:16:40Z");
    assert_eq!(node["cpu"]["usageNanoCores"], 5);
    assert_eq!(node["cpu"]["usageCoreNanoSeconds"], 7_500_000_000u64);
    assert_eq!(node["memory"]["workingSetBytes"], 4096);
    assert_eq!(node["memory"]["rssBytes"], 2048);
    assert!(
        node["memory"].get("pageFaults").is_none(),
        "omitted when unset"
    );
    assert_eq!(node["network"]["name"], "eth0", "default interface inline");
    assert_eq!(node["network"]["rxBytes"], 10);
    assert_eq!(node["network"]["interfaces"][0]["name"], "eth0");
    assert_eq!(node["fs"]["capacityBytes"], 2);
    assert_eq!(node["runtime"]["imageFs"]["usedBytes"], 1);
    assert_eq!(node["swap"]["swapAvailableBytes"], 1000);
    assert!(node.get("systemContainers").is_none());
    assert!(node.get("rlimit").is_none());
    let pod = &v["pods"][0];
    assert_eq!(pod["podRef"]["name"], "web");
    assert_eq!(pod["podRef"]["namespace"], "ns");
    assert_eq!(pod["podRef"]["uid"], "u1");
    assert_eq!(pod["ephemeral-storage"]["usedBytes"], 1);
    assert!(pod.get("volume").is_none(), "no volumes: omitted");
    assert!(pod.get("process_stats").is_none());
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "app");
    assert_eq!(c["rootfs"]["availableBytes"], 1);
    assert_eq!(c["logs"]["usedBytes"], 1);
    assert_eq!(c["swap"]["swapUsageBytes"], 8);
    // And it reads back to the same document.
    let back: Summary = serde_json::from_str(&body).unwrap();
    assert_eq!(back, sample());
}

#[tokio::test]
async fn unset_times_are_null() {
    let s = Summary {
        node: NodeStats {
            node_name: "n".into(),
            cpu: Some(CpuStats::default()),
            ..Default::default()
        },
        pods: Vec::new(),
    };
    let v = serde_json::to_value(&s).unwrap();
    assert!(v["node"]["startTime"].is_null());
    assert!(v["node"]["cpu"]["time"].is_null());
    assert!(v["node"]["cpu"].get("usageNanoCores").is_none());
    assert_eq!(v["pods"], serde_json::json!([]));
}

#[tokio::test]
async fn only_cpu_and_memory_trims_the_summary() {
    for req in [
        get("/stats/summary?only_cpu_and_memory=true"),
        get("/stats/summary/?only_cpu_and_memory=true"),
        Request::post("/stats/summary")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("only_cpu_and_memory=true"))
            .unwrap(),
    ] {
        let (status, _, body) = call(Fake(Some(sample())), req).await;
        assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["node"]["cpu"]["usageNanoCores"], 5);
        assert_eq!(v["node"]["memory"]["workingSetBytes"], 4096);
        assert!(v["node"].get("fs").is_none());
        assert!(v["node"].get("network").is_none());
        assert!(v["node"].get("runtime").is_none());
        let pod = &v["pods"][0];
        assert_eq!(pod["cpu"]["usageNanoCores"], 3);
        assert!(pod.get("ephemeral-storage").is_none());
        let c = &pod["containers"][0];
        assert_eq!(c["memory"]["workingSetBytes"], 512);
        assert!(c.get("rootfs").is_none() && c.get("logs").is_none());
    }
    // Anything but exactly one "true" is the full summary.
    for uri in [
        "/stats/summary?only_cpu_and_memory=false",
        "/stats/summary?only_cpu_and_memory=true&only_cpu_and_memory=true",
        "/stats/summary?only_cpu_and_memory=1",
    ] {
        let (_, _, body) = call(Fake(Some(sample())), get(uri)).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["node"].get("fs").is_some(), "{uri}");
    }
}

#[tokio::test]
async fn a_provider_error_is_500() {
    let (status, _, body) = call(Fake(None), get("/stats/summary")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("Internal Error: "), "{body}");
}

/// A parsed family: help, type, and samples (labels, value, timestamp).
#[derive(Debug, Default)]
struct Family {
    help: String,
    kind: String,
    samples: Vec<(BTreeMap<String, String>, f64, Option<i64>)>,
}

/// A tiny parser of the text format (no escapes in label values needed here).
fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            out.entry(name.into()).or_default().help = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.entry(name.into()).or_default().kind = kind.into();
        } else {
            let (series, rest) = match line.find('}') {
                Some(i) => (&line[..=i], line[i + 1..].trim()),
                None => line.split_once(' ').unwrap(),
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').unwrap();
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            let mut parts = rest.split(' ');
            let value: f64 = parts.next().unwrap().parse().unwrap();
            let ts = parts.next().map(|t| t.parse().unwrap());
            assert!(out.contains_key(name), "sample before its TYPE: {line}");
            out.get_mut(name).unwrap().samples.push((labels, value, ts));
        }
    }
    out
}

#[tokio::test]
async fn resource_metrics_expose_every_family_with_timestamps() {
    let (status, ct, body) = call(Fake(Some(sample())), get("/metrics/resource")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, resource::CONTENT_TYPE);
    let fams = parse(&body);
    let names: Vec<&str> = fams.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "container_cpu_usage_seconds_total",
            "container_memory_working_set_bytes",
            "container_start_time_seconds",
            "container_swap_limit_bytes",
            "container_swap_usage_bytes",
            "node_cpu_usage_seconds_total",
            "node_memory_working_set_bytes",
            "node_swap_usage_bytes",
            "pod_cpu_usage_seconds_total",
            "pod_memory_working_set_bytes",
            "pod_swap_usage_bytes",
            "resource_scrape_error",
            "scrape_error",
        ]
    );
    let c_labels: BTreeMap<String, String> =
        [("container", "app"), ("namespace", "ns"), ("pod", "web")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let one = |name: &str| {
        let f = &fams[name];
        assert_eq!(f.samples.len(), 1, "{name}");
        f.samples[0].clone()
    };
    assert_eq!(fams["node_cpu_usage_seconds_total"].kind, "counter");
    assert_eq!(
        fams["node_cpu_usage_seconds_total"].help,
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds"
    );
    assert_eq!(one("node_cpu_usage_seconds_total").1, 7.5);
    assert_eq!(one("node_cpu_usage_seconds_total").2, Some(2_000_000));
    assert_eq!(one("node_memory_working_set_bytes").1, 4096.0);
    assert_eq!(one("node_swap_usage_bytes").2, Some(2_000_000));
    let cc = one("container_cpu_usage_seconds_total");
    assert_eq!(
        (cc.0.clone(), cc.1, cc.2),
        (c_labels.clone(), 2.0, Some(2_001_000))
    );
    assert_eq!(one("container_memory_working_set_bytes").1, 512.0);
    assert_eq!(one("container_swap_usage_bytes").1, 8.0);
    assert_eq!(one("container_swap_limit_bytes").1, 1008.0);
    let start = one("container_start_time_seconds");
    assert_eq!((start.0, start.1, start.2), (c_labels, 1600.0, None));
    let pc = one("pod_cpu_usage_seconds_total");
    assert_eq!(pc.0.keys().collect::<Vec<_>>(), ["namespace", "pod"]);
    assert_eq!((pc.1, pc.2), (2.5, Some(2_002_000)));
    assert_eq!(one("pod_memory_working_set_bytes").1, 1024.0);
    assert_eq!(one("pod_swap_usage_bytes").1, 8.0);
    assert_eq!(one("scrape_error").1, 0.0);
    assert_eq!(one("resource_scrape_error").1, 0.0);
    for (name, f) in &fams {
        if !name.ends_with("scrape_error") && name != "container_start_time_seconds" {
            assert!(
                f.samples.iter().all(|s| s.2.is_some()),
                "{name} has timestamps"
            );
        }
    }
}

#[tokio::test]
async fn resource_metrics_report_a_scrape_error() {
    let (status, _, body) = call(Fake(None), get("/metrics/resource")).await;
    assert_eq!(status, StatusCode::OK);
    let fams = parse(&body);
    assert_eq!(fams.len(), 2, "{body}");
    assert_eq!(fams["scrape_error"].samples[0].1, 1.0);
    assert_eq!(fams["resource_scrape_error"].samples[0].1, 1.0);
}
