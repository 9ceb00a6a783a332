//! Cluster-mode end-to-end benchmark (used by hack/bench-api.sh):
//! `api_bench KUBELET_BIN N [extra kubelet flags...]` starts the apiserver
//! double in this process and the kubelet-rs binary as its own process, which
//! TLS-bootstraps and registers; then binds N pods to the node at once and
//! prints the milliseconds until all N are Running and Ready in the API, and
//! how many status patches the kubelet sent. Cleans up after itself.
//!
//! With `API_BENCH_VOLUMES=1` every pod also mounts a projected
//! service-account token (the `kube-api-access` shape: token, `ca.crt` from
//! `kube-root-ca.crt`, the namespace), a ConfigMap and an emptyDir; after the
//! start it updates the ConfigMap and prints a third number, the
//! milliseconds until the new value is in every pod's mounted file.
//!
//! With `API_BENCH_PROBES=1` every pod has a 1-second exec readiness probe
//! and a 1-second HTTP liveness probe (see `api_bench_probes.rs`); once all
//! are Ready it samples the kubelet for `API_BENCH_WINDOW` seconds (default
//! 60) and prints, after the two numbers: kubelet CPU (cores), RSS (KiB),
//! then readiness probes run, p50 ms, p99 ms, and the same for liveness.
//!
//! With `API_BENCH_DENSITY=1` (issue 20's density shape, with
//! `API_BENCH_VOLUMES=1` for the token and ConfigMap) every pod sleeps with
//! an exec readiness probe every 10 s; once all are Ready it samples the
//! kubelet for `API_BENCH_WINDOW` seconds and prints, after the two
//! numbers: CPU (cores), RSS (KiB), PLEG relists in the window, relist p50
//! and p99 ms since the start.

#[path = "bench_support/cluster.rs"]
mod cluster;
#[path = "bench_support/probes.rs"]
mod probes;

use std::time::Duration;

use anyhow::bail;
use apiserver_double::Options;
use cluster::{Cluster, Start};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

const IMAGE: &str = "localhost:5000/busybox:1.35";

fn ready(p: &serde_json::Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let (bin, n) = match args.as_slice() {
        [_, bin, n, ..] => (bin.clone(), n.parse::<usize>()?),
        _ => bail!("usage: api_bench KUBELET_BIN N [kubelet flags...]"),
    };
    let extra = &args[3..];
    let with_probes = std::env::var("API_BENCH_PROBES").is_ok_and(|v| v == "1");
    let density = std::env::var("API_BENCH_DENSITY").is_ok_and(|v| v == "1");
    let read_only_port = if with_probes || density {
        std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
    } else {
        0
    };
    let mut cluster = Cluster::start(Start {
        bin: &bin,
        node_prefix: "apibench",
        read_only_port,
        extra,
        options: Options::default(),
        config: None,
    })
    .await?;
    let (api, node) = (&cluster.api, cluster.node.clone());
    let volumes = std::env::var("API_BENCH_VOLUMES").is_ok_and(|v| v == "1");
    let cms: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), "default");
    if volumes {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "bench-cm"}, "data": {"key": "v1"}
        }))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    let names: Vec<String> = (0..n).map(|i| format!("p{i}-{node}")).collect();
    let start = Instant::now();
    let creates = names.iter().map(|name| {
        let mut spec = json!({"nodeName": node, "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}]});
        if with_probes {
            spec["containers"][0] = probes::container(IMAGE);
        } else if density {
            spec["containers"][0] = probes::density_container(IMAGE);
        }
        if volumes {
            cluster::add_volumes(&mut spec, "bench-cm");
        }
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
            .expect("pod");
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &p).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    loop {
        let done = names
            .iter()
            .filter(|name| api.get("pods", "default", name).is_some_and(|p| ready(&p)))
            .count();
        if done == n {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("only {done}/{n} pods Running and Ready after 300s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ms = start.elapsed().as_millis();
    let patches = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status") && r.path.contains("/pods/"))
        .count();
    if density {
        let window = std::env::var("API_BENCH_WINDOW")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or(60);
        let pid = cluster.pid()?;
        let before = probes::scrape_path(read_only_port, "/metrics").await?;
        let (cpu, rss) = probes::sample(pid, Duration::from_secs(window)).await?;
        let after = probes::scrape_path(read_only_port, "/metrics").await?;
        let relist = "kubelet_pleg_relist_duration_seconds";
        let (n0, _, _) = probes::histogram_quantiles(&before, relist, "");
        let (n1, p50, p99) = probes::histogram_quantiles(&after, relist, "");
        println!(
            "{ms} {patches} {cpu:.3} {rss} {} {p50:.1} {p99:.1}",
            n1 - n0
        );
    } else if with_probes {
        let window = std::env::var("API_BENCH_WINDOW")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or(60);
        let pid = cluster.pid()?;
        let before = probes::scrape(read_only_port).await?;
        let (cpu, rss) = probes::sample(pid, Duration::from_secs(window)).await?;
        let after = probes::scrape(read_only_port).await?;
        // Probes run in the window, and the latency quantiles since the start.
        let (r0, _, _) = probes::quantiles(&before, "Readiness");
        let (l0, _, _) = probes::quantiles(&before, "Liveness");
        let (rn, r50, r99) = probes::quantiles(&after, "Readiness");
        let (ln, l50, l99) = probes::quantiles(&after, "Liveness");
        println!(
            "{ms} {patches} {cpu:.3} {rss} {} {r50:.1} {r99:.1} {} {l50:.1} {l99:.1}",
            rn - r0,
            ln - l0
        );
    } else if volumes {
        let files: Vec<std::path::PathBuf> = names
            .iter()
            .filter_map(|name| api.get("pods", "default", name))
            .filter_map(|p| p["metadata"]["uid"].as_str().map(String::from))
            .map(|uid| {
                cluster
                    .root_dir()
                    .join("pods")
                    .join(uid)
                    .join("volumes/kubernetes.io~configmap/cm/key")
            })
            .collect();
        let changed = Instant::now();
        cms.patch(
            "bench-cm",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"key": "v2"}})),
        )
        .await?;
        loop {
            let done = files
                .iter()
                .filter(|f| std::fs::read_to_string(f).is_ok_and(|s| s == "v2"))
                .count();
            if done == files.len() {
                break;
            }
            if changed.elapsed() > Duration::from_secs(120) {
                bail!(
                    "the ConfigMap update reached {done}/{} pods in 120s",
                    files.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        println!("{ms} {patches} {}", changed.elapsed().as_millis());
    } else {
        println!("{ms} {patches}");
    }
    // Clean up: delete the pods, let the kubelet stop them and confirm.
    for name in &names {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while names
        .iter()
        .any(|name| api.get("pods", "default", name).is_some())
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster
        .cleanup("unix:///run/containerd/containerd.sock")
        .await
}
