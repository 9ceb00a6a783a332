//! Idle and 30-pod footprint benchmark (issue 21, used by hack/bench-idle.sh):
//! `idle_bench KUBELET_BIN PODS [kubelet flags...]` starts the apiserver
//! double in this process and the kubelet-rs binary as its own process
//! (bench_support/cluster.rs), the way an operator's node runs: registered,
//! renewing its lease, posting status, relisting. It prints one line per
//! phase, as `key=value`:
//!
//! - `idle`: after `IDLE_BENCH_SETTLE` seconds (default 60) with no pods, the
//!   kubelet's CPU seconds in each of `IDLE_BENCH_WINDOWS` windows (default 3)
//!   of 30 s, then VmRSS and RssAnon;
//! - `pods`: PODS plain pods (a sleeping busybox) created one after another
//!   and awaited Running and Ready, then the same settle and windows, and the
//!   milliseconds from the first create until all were Ready;
//! - `gone`: the pods deleted and awaited gone from the API, then VmRSS and
//!   RssAnon 30 s later and again after `IDLE_BENCH_AFTER` seconds (default
//!   360: `app::allocator` trims after removals settle).
//!
//! `IDLE_BENCH_HOLD=S` keeps the idle kubelet running S seconds after the
//! idle line (its pid printed), to profile it with `perf record -p`.

// Not every helper of the shared bench support is used here.
#[allow(dead_code)]
#[path = "bench_support/cluster.rs"]
mod cluster;

use std::time::Duration;

use anyhow::{Context, bail};
use apiserver_double::Options;
use cluster::{Cluster, Start};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

const IMAGE: &str = "localhost:5000/busybox:1.35";
const LANE1_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const WINDOW: Duration = Duration::from_secs(30);

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// utime + stime in seconds (USER_HZ is 100 on Linux).
fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit(')').next().context("stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks =
        f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

/// (VmRSS, RssAnon) in KiB.
fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .with_context(|| name.to_string())?
            .parse()
            .map_err(Into::into)
    };
    Ok((field("VmRSS:")?, field("RssAnon:")?))
}

/// Settles, then CPU seconds per 30 s window, then memory; `extra` goes at
/// the end of the line.
async fn measure(phase: &str, pid: u32, extra: &str) -> anyhow::Result<()> {
    tokio::time::sleep(env_secs("IDLE_BENCH_SETTLE", 60)).await;
    let windows = std::env::var("IDLE_BENCH_WINDOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut cpu = Vec::new();
    for _ in 0..windows {
        let t0 = cpu_secs(pid)?;
        tokio::time::sleep(WINDOW).await;
        cpu.push(format!("{:.2}", cpu_secs(pid)? - t0));
    }
    let (rss, anon) = memory_kib(pid)?;
    println!(
        "{phase} cpu_s_per_30s={} rss_kib={rss} rss_anon_kib={anon}{extra}",
        cpu.join(",")
    );
    Ok(())
}

fn ready(p: &serde_json::Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

async fn run(cluster: &Cluster, n: usize) -> anyhow::Result<()> {
    let pid = cluster.pid()?;
    measure("idle", pid, "").await?;
    let hold = env_secs("IDLE_BENCH_HOLD", 0);
    if !hold.is_zero() {
        println!("hold pid={pid} seconds={}", hold.as_secs());
        tokio::time::sleep(hold).await;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    let created = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("i{i}-{}", cluster.node)).collect();
    for name in &names {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "nodeName": cluster.node, "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]}}))?;
        pods.create(&PostParams::default(), &p).await?;
    }
    let start = Instant::now();
    while names.iter().any(|name| {
        !cluster
            .api
            .get("pods", "default", name)
            .is_some_and(|p| ready(&p))
    }) {
        if start.elapsed() > Duration::from_secs(300) {
            bail!("pods not Ready after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready_ms = created.elapsed().as_millis();
    measure("pods", pid, &format!(" ready_ms={ready_ms}")).await?;
    for name in &names {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    let start = Instant::now();
    while names
        .iter()
        .any(|name| cluster.api.get("pods", "default", name).is_some())
    {
        if start.elapsed() > Duration::from_secs(300) {
            bail!("pods not gone after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (rss30, anon30) = memory_kib(pid)?;
    tokio::time::sleep(env_secs("IDLE_BENCH_AFTER", 360)).await;
    let (rss, anon) = memory_kib(pid)?;
    println!(
        "gone rss_kib_30s={rss30} rss_anon_kib_30s={anon30} rss_kib={rss} rss_anon_kib={anon}"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let (bin, n) = match args.as_slice() {
        [_, bin, n, ..] => (bin.clone(), n.parse::<usize>()?),
        _ => bail!("usage: idle_bench KUBELET_BIN PODS [kubelet flags...]"),
    };
    let mut cluster = Cluster::start(Start {
        bin: &bin,
        node_prefix: "idlebench",
        read_only_port: 0,
        extra: &args[3..],
        options: Options::default(),
    })
    .await?;
    let result = run(&cluster, n).await;
    cluster.cleanup(LANE1_ENDPOINT).await?;
    result
}
