//! Resource stats of a kubelet under test on real containerd: the summary
//! provider called directly, and `/stats/summary` and `/metrics/resource`
//! over the secure port, as metrics-server reads them.

use std::collections::BTreeMap;
use std::time::Duration;

use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;
use kubelet_server::stats::summary::PodStats;
use kubelet_server::stats::{StatsProvider, Summary};

const T: Duration = Duration::from_secs(60);

fn our_pod<'a>(s: &'a Summary, name: &str) -> Option<&'a PodStats> {
    s.pods.iter().find(|p| p.pod_ref.name == name)
}

/// A plain-HTTP GET (the read-only port).
async fn plain_get(
    addr: std::net::SocketAddr,
    path: &str,
) -> anyhow::Result<(http::StatusCode, String)> {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = tokio::time::timeout(T, send.send_request(req)).await??;
    let status = resp.status();
    let body = tokio::time::timeout(T, resp.into_body().collect())
        .await??
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).to_string()))
}

/// A sample line: metric name, labels, value and timestamp.
type Sample = (String, String, f64, Option<i64>);

/// Every sample line of a text exposition.
fn parse_samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, rest) = match l.find('}') {
                Some(i) => (&l[..=i], l[i + 1..].trim()),
                None => l.split_once(' ').unwrap(),
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let mut parts = rest.split(' ');
            let value = parts.next().unwrap().parse().unwrap();
            let ts = parts.next().map(|t| t.parse().unwrap());
            (name.to_string(), labels.to_string(), value, ts)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pod_reports_cpu_and_memory() -> anyhow::Result<()> {
    let node = Node::start(|f| f.read_only_port = Some(free_port())).await;
    node.write_manifest(
        "busy.yaml",
        &pod_yaml("busy", "Always", BUSYBOX, "while :; do :; done"),
    );
    node.wait_status("busy", T, "running", |s| is_running(s, "c"))
        .await?;
    let pod_name = node.pod_name("busy");
    let host = node.handle().host.clone();

    // Two samples a few seconds apart: the second carries a rate. A scrape
    // may be served a summary collected up to `SUMMARY_REUSE` before the pod
    // started (the eviction manager collects too), so the first waits for
    // the pod as upstream's summary e2e test does.
    let mut first = host.summary().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while our_pod(&first, &pod_name).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        first = host.summary().await?;
    }
    assert!(our_pod(&first, &pod_name).is_some(), "{first:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = host.summary().await?;

    assert_eq!(s.node.node_name, node.name);
    let ncpu = s.node.cpu.clone().ctx("node cpu")?;
    assert!(ncpu.usage_core_nano_seconds.unwrap_or(0) > 0, "{ncpu:?}");
    assert!(ncpu.usage_nano_cores.unwrap_or(0) > 0, "{ncpu:?}");
    let nmem = s.node.memory.clone().ctx("node memory")?;
    assert!(nmem.working_set_bytes.unwrap_or(0) > 0, "{nmem:?}");
    assert!(nmem.available_bytes.unwrap_or(0) > 0, "{nmem:?}");
    let nfs = s.node.fs.clone().ctx("node fs")?;
    assert!(
        nfs.capacity_bytes.unwrap_or(0) > 0 && nfs.used_bytes.unwrap_or(0) > 0,
        "{nfs:?}"
    );
    let image_fs = s
        .node
        .runtime
        .clone()
        .and_then(|r| r.image_fs)
        .ctx("imageFs")?;
    assert!(image_fs.used_bytes.unwrap_or(0) > 0, "{image_fs:?}");

    let pod = our_pod(&s, &pod_name).ctx("pod stats")?;
    assert_eq!(pod.pod_ref.uid, node.uid_of("busy").ctx("uid")?);
    assert_eq!(pod.pod_ref.namespace, "default");
    let pcpu = pod.cpu.clone().ctx("pod cpu")?;
    // A busy loop uses most of a core.
    assert!(pcpu.usage_nano_cores.unwrap_or(0) > 100_000_000, "{pcpu:?}");
    assert!(pcpu.usage_core_nano_seconds.unwrap_or(0) > 0, "{pcpu:?}");
    let pmem = pod.memory.clone().ctx("pod memory")?;
    assert!(pmem.working_set_bytes.unwrap_or(0) > 0, "{pmem:?}");
    assert!(pod.volume.is_empty(), "no volume plugins yet");
    let net = pod.network.clone().ctx("pod network")?;
    assert!(
        net.time.is_some() && net.default_interface.name == "eth0",
        "{net:?}"
    );

    assert_eq!(pod.containers.len(), 1, "{pod:?}");
    let c = &pod.containers[0];
    assert_eq!(c.name, "c");
    assert!(c.start_time.is_some());
    let ccpu = c.cpu.clone().ctx("container cpu")?;
    assert!(ccpu.usage_nano_cores.unwrap_or(0) > 100_000_000, "{ccpu:?}");
    assert!(ccpu.usage_core_nano_seconds.unwrap_or(0) > 0, "{ccpu:?}");
    let cmem = c.memory.clone().ctx("container memory")?;
    assert!(cmem.working_set_bytes.unwrap_or(0) > 0, "{cmem:?}");
    assert!(c.logs.is_some() && c.rootfs.is_some(), "{c:?}");

    // The same over the secure port.
    let addr = node.handle().server_addr.ctx("server port")?;
    let client = NodeApiClient::new(addr, &node.serving_ca(), &node.name, Credentials::None)?;
    let a = client.get("/stats/summary").await?;
    assert_eq!(a.status, http::StatusCode::OK, "{}", a.text());
    let served: Summary = serde_json::from_slice(&a.body)?;
    let pod = our_pod(&served, &pod_name).ctx("served pod")?;
    assert!(
        pod.containers[0]
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0)
            > 0
    );
    let v = a.json()?;
    assert!(
        v["node"]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{v}"
    );

    let a = client
        .get("/stats/summary?only_cpu_and_memory=true")
        .await?;
    assert_eq!(a.status, http::StatusCode::OK, "{}", a.text());
    let v = a.json()?;
    assert!(v["node"].get("fs").is_none(), "{v}");
    assert!(
        v["node"]["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0,
        "{v}"
    );

    let a = client.get("/metrics/resource").await?;
    assert_eq!(a.status, http::StatusCode::OK, "{}", a.text());
    let samples = parse_samples(&a.text());
    let by_name: BTreeMap<&str, Vec<&Sample>> = samples.iter().fold(BTreeMap::new(), |mut m, s| {
        m.entry(s.0.as_str()).or_default().push(s);
        m
    });
    let ours = |family: &str| {
        by_name
            .get(family)
            .into_iter()
            .flatten()
            .find(|s| s.1.contains(&format!("pod=\"{pod_name}\"")))
            .copied()
    };
    for family in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "pod_cpu_usage_seconds_total",
        "pod_memory_working_set_bytes",
    ] {
        let s = ours(family).ctx(family)?;
        assert!(s.2 > 0.0 && s.3.is_some(), "{family}: {s:?}");
    }
    assert!(ours("container_start_time_seconds").ctx("start time")?.2 > 0.0);
    for family in [
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
    ] {
        let s = by_name.get(family).and_then(|v| v.first()).ctx(family)?;
        assert!(s.2 > 0.0 && s.3.is_some(), "{family}: {s:?}");
    }
    assert_eq!(by_name["scrape_error"][0].2, 0.0);

    // Upstream serves stats on the read-only port too.
    let ro = node.handle().read_only_addr.ctx("read-only port")?;
    let (status, body) = plain_get(ro, "/stats/summary?only_cpu_and_memory=true").await?;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    let served: Summary = serde_json::from_str(&body)?;
    assert!(our_pod(&served, &pod_name).is_some(), "{body}");
    let (status, body) = plain_get(ro, "/metrics/resource").await?;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    assert!(
        parse_samples(&body)
            .iter()
            .any(|s| s.0 == "pod_cpu_usage_seconds_total" && s.1.contains(&pod_name)),
        "{body}"
    );

    node.cleanup().await;
    Ok(())
}
