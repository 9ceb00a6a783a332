//! Idle and 30-pod footprint benchmark (issues 21 and 28, used by
//! hack/bench-idle.sh): `idle_bench KUBELET_BIN PODS [kubelet flags...]`
//! starts the apiserver double in this process and the kubelet-rs binary as
//! its own process (bench_support/cluster.rs), shaped like a node `kubeadm
//! join` set up (bench_support/node_shape.rs): kubeadm's config file with an
//! empty static pod directory and client certificate rotation on, registered,
//! renewing its lease, posting status, watching its pods, with a CSI driver
//! and a device plugin registered and the pod-resources socket served. It
//! prints one line per phase, as `key=value`:
//!
//! - `idle`: after `IDLE_BENCH_SETTLE` seconds (default 60) with no pods, the
//!   kubelet's CPU seconds (from `stat`, 10 ms ticks; and in milliseconds
//!   from its threads' `schedstat`, threads that start or exit in the
//!   window included) and wake-ups (context switches of all its threads,
//!   the same way) in each of `IDLE_BENCH_WINDOWS` windows (default 3) of 30 s,
//!   then its system calls in one more 30 s window under `strace -c -f` (the
//!   total and the ten most frequent kinds), then VmRSS and RssAnon;
//! - `pods`: PODS plain pods (a sleeping busybox) created one after another
//!   and awaited Running and Ready, then the same measurements, and the
//!   milliseconds from the first create until all were Ready;
//! - `gone`: the pods deleted and awaited gone from the API, then the same
//!   measurements, and VmRSS and RssAnon 30 s after they were gone and again
//!   after `IDLE_BENCH_AFTER` seconds (default 360: `app::allocator` trims
//!   after removals settle).
//!
//! `IDLE_BENCH_HOLD=S` keeps the idle kubelet running S seconds after the
//! idle line (its pid printed), to profile it with `perf record -p`.
//! `IDLE_BENCH_STRACE=0` skips the strace windows.

// Not every helper of the shared bench support is used here.
#[allow(dead_code)]
#[path = "bench_support/cluster.rs"]
mod cluster;
#[path = "bench_support/node_shape.rs"]
mod node_shape;
#[path = "bench_support/proc_stats.rs"]
mod proc_stats;

use std::time::Duration;

use anyhow::bail;
use apiserver_double::Options;
use cluster::{Cluster, Start};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use proc_stats::{cpu_ms_and_wakeups, cpu_secs, memory_kib, syscalls};
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

/// Settles, then CPU seconds and wake-ups per 30 s window, system calls in
/// one more window, then memory; `extra` goes at the end of the line.
async fn measure(phase: &str, pid: u32, extra: &str) -> anyhow::Result<()> {
    tokio::time::sleep(env_secs("IDLE_BENCH_SETTLE", 60)).await;
    let windows = std::env::var("IDLE_BENCH_WINDOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut cpu = Vec::new();
    let mut cpu_ms = Vec::new();
    let mut wakeups = Vec::new();
    for _ in 0..windows {
        let t0 = cpu_secs(pid)?;
        let (ms, w) = cpu_ms_and_wakeups(pid, WINDOW).await?;
        cpu.push(format!("{:.2}", cpu_secs(pid)? - t0));
        cpu_ms.push(format!("{ms:.1}"));
        wakeups.push(w.to_string());
    }
    let calls = if std::env::var("IDLE_BENCH_STRACE").as_deref() == Ok("0") {
        String::new()
    } else {
        let (total, kinds) = syscalls(pid, WINDOW).await?;
        let top: Vec<String> = kinds
            .iter()
            .take(10)
            .map(|(k, n)| format!("{k}:{n}"))
            .collect();
        format!(" syscalls_per_30s={total} syscalls_top={}", top.join(","))
    };
    let (rss, anon) = memory_kib(pid)?;
    println!(
        "{phase} cpu_s_per_30s={} cpu_ms_per_30s={} wakeups_per_30s={}{calls} rss_kib={rss} rss_anon_kib={anon}{extra}",
        cpu.join(","),
        cpu_ms.join(","),
        wakeups.join(",")
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
    let settled = env_secs("IDLE_BENCH_AFTER", 360).saturating_sub(Duration::from_secs(30));
    tokio::time::sleep(settled).await;
    measure(
        "gone",
        pid,
        &format!(" rss_kib_30s={rss30} rss_anon_kib_30s={anon30}"),
    )
    .await
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
        config: Some(&node_shape::kubeadm_config),
    })
    .await?;
    let plugins = node_shape::register_plugins(&cluster.root_dir(), &cluster.node).await;
    let result = match plugins {
        Ok(_plugins) => run(&cluster, n).await,
        Err(e) => Err(e),
    };
    cluster.cleanup(LANE1_ENDPOINT).await?;
    result
}
