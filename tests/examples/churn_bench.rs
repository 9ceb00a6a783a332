//! Churn benchmark (issue 20, used by hack/bench-churn.sh):
//! `churn_bench KUBELET_BIN WAVES PODS [kubelet flags...]` starts the
//! apiserver double in this process and the kubelet-rs binary as its own
//! process (bench_support/cluster.rs), then runs WAVES waves: PODS pods of
//! the density shape (a projected service-account token, a ConfigMap and an
//! emptyDir; a sleeping busybox) created at once, awaited until all are
//! Running, deleted, and awaited until the kubelet has finished them and
//! they are gone from the API (while they run, it checks that the counters
//! below see all of them). 2 s later it prints one line per wave (and a
//! baseline, wave 0, before the first):
//!
//! `wave=W running_ms gone_ms rss_kib rss_anon_kib fds threads sandboxes
//! containers mounts pod_dirs pod_cgroups log_dirs` (as `key=value`): the
//! milliseconds until all were Running and until all were gone, the
//! kubelet's VmRSS, RssAnon, open descriptors and threads, then what this
//! node's pods hold on the host: sandboxes and containers in the runtime
//! (by their `io.kubernetes.pod.name` label), mounts under the kubelet's
//! root dir, directories under `<root>/pods`, `pod<uid>` cgroups under the
//! memory controller's kubepods tree of `--cgroup-root`, and pod log
//! directories under `podLogsDir` (read from the `--config` file, default
//! `/var/log/pods`).
//!
//! After the last wave it waits (180 s at most) for the runtime's garbage
//! collection and the kubelet's housekeeping to remove what the pods left,
//! prints an `end` line and a `summary` line (what leaked, which must be
//! nothing; descriptors, threads and RSS at the end against after wave 1),
//! and exits non-zero if anything leaked.
//!
//! Env: `CHURN_PAUSE` seconds between waves (default 0; with a pause, a
//! `rest` line after it, and the summary compares RSS at rest); `CHURN_ENDPOINT`
//! the CRI endpoint to count in (default: the kubelet's
//! `--container-runtime-endpoint` flag if given, else lane 1's socket).

#[path = "bench_support/cluster.rs"]
mod cluster;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use apiserver_double::Options;
use cluster::{Cluster, Start};
use cri::RuntimeService;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

const IMAGE: &str = "localhost:5000/busybox:1.35";
const LANE1_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const CONFIGMAP: &str = "churn-cm";
const WAIT: Duration = Duration::from_secs(300);

/// Where the node keeps what its pods leave behind.
struct Places {
    endpoint: String,
    root: PathBuf,
    cgroup_root: String,
    pod_logs: PathBuf,
}

/// One measurement: the kubelet process, and what this node's pods hold.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    rss_kib: u64,
    rss_anon_kib: u64,
    fds: usize,
    threads: u64,
    sandboxes: usize,
    containers: usize,
    mounts: usize,
    pod_dirs: usize,
    pod_cgroups: usize,
    log_dirs: usize,
}

impl Counts {
    fn leftovers(&self) -> usize {
        self.sandboxes
            + self.containers
            + self.mounts
            + self.pod_dirs
            + self.pod_cgroups
            + self.log_dirs
    }

    fn kv(&self) -> String {
        format!(
            "rss_kib={} rss_anon_kib={} fds={} threads={} sandboxes={} containers={} mounts={} pod_dirs={} pod_cgroups={} log_dirs={}",
            self.rss_kib,
            self.rss_anon_kib,
            self.fds,
            self.threads,
            self.sandboxes,
            self.containers,
            self.mounts,
            self.pod_dirs,
            self.pod_cgroups,
            self.log_dirs
        )
    }
}

/// The value of kubelet flag `--name` (`--name=v` or `--name v`).
fn flag(extra: &[String], name: &str) -> Option<String> {
    let long = format!("--{name}");
    let eq = format!("{long}=");
    extra.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&eq) {
            Some(v.to_string())
        } else if *a == long {
            extra.get(i + 1).cloned()
        } else {
            None
        }
    })
}

/// `podLogsDir` of the `--config` file, if there is one that sets it.
fn pod_logs_dir(extra: &[String]) -> PathBuf {
    flag(extra, "config")
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|text| {
            text.lines().find_map(|l| {
                let v = l.trim().strip_prefix("podLogsDir:")?;
                Some(v.trim().trim_matches(['"', '\'']).to_string())
            })
        })
        .map_or_else(|| PathBuf::from("/var/log/pods"), PathBuf::from)
}

/// A `kB` field of /proc/PID/status (`VmRSS`, `RssAnon`) or a count
/// (`Threads`).
fn status_field(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let prefix = format!("{key}:");
    status
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.split_whitespace().next())
        .with_context(|| format!("{key} in /proc/{pid}/status"))?
        .parse()
        .map_err(Into::into)
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| rd.count())
}

fn mounts_under(dir: &Path) -> usize {
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&prefix)))
        .count()
}

/// `pod<uid>` cgroups of `uids` in the memory controller's kubepods tree
/// under `cgroup_root` (cgroupfs driver; v1 or v2).
fn pod_cgroups(cgroup_root: &str, uids: &HashSet<String>) -> usize {
    let base = Path::new("/sys/fs/cgroup");
    let controller = if base.join("cgroup.controllers").exists() {
        base.to_path_buf()
    } else {
        base.join("memory")
    };
    let kubepods = controller
        .join(cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    ["", "burstable", "besteffort"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(kubepods.join(sub)).ok())
        .flat_map(|rd| rd.flatten())
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("pod"))
                .is_some_and(|uid| uids.contains(uid))
        })
        .count()
}

/// Pod log directories (`<namespace>_<name>_<uid>`) of pods named
/// `*<node>`.
fn log_dirs(dir: &Path, node: &str) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.split_once('_'))
                .and_then(|(_, rest)| rest.rsplit_once('_'))
                .is_some_and(|(name, _)| name.ends_with(node))
        })
        .count()
}

fn ours(labels: &std::collections::HashMap<String, String>, node: &str) -> bool {
    labels
        .get("io.kubernetes.pod.name")
        .is_some_and(|p| p.ends_with(node))
}

async fn measure(
    c: &Cluster,
    rt: &cri::RemoteRuntime,
    places: &Places,
    uids: &HashSet<String>,
) -> anyhow::Result<Counts> {
    let pid = c.pid()?;
    let sandboxes = rt.list_pod_sandbox(None).await?;
    let containers = rt.list_containers(None).await?;
    Ok(Counts {
        rss_kib: status_field(pid, "VmRSS")?,
        rss_anon_kib: status_field(pid, "RssAnon")?,
        fds: entries(Path::new(&format!("/proc/{pid}/fd"))),
        threads: status_field(pid, "Threads")?,
        sandboxes: sandboxes
            .iter()
            .filter(|s| ours(&s.labels, &c.node))
            .count(),
        containers: containers
            .iter()
            .filter(|s| ours(&s.labels, &c.node))
            .count(),
        mounts: mounts_under(&places.root),
        pod_dirs: entries(&places.root.join("pods")),
        pod_cgroups: pod_cgroups(&places.cgroup_root, uids),
        log_dirs: log_dirs(&places.pod_logs, &c.node),
    })
}

fn pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    let mut spec = json!({"nodeName": node, "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]});
    cluster::add_volumes(&mut spec, CONFIGMAP);
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

/// Waits until `done` holds for every pod in `names` (by the double's
/// store), or fails after [`WAIT`] saying how many did not get there.
async fn wait_all(
    c: &Cluster,
    names: &[String],
    what: &str,
    done: impl Fn(Option<serde_json::Value>) -> bool,
) -> anyhow::Result<u128> {
    let start = Instant::now();
    loop {
        let n = names
            .iter()
            .filter(|name| done(c.api.get("pods", "default", name)))
            .count();
        if n == names.len() {
            return Ok(start.elapsed().as_millis());
        }
        if start.elapsed() > WAIT {
            bail!(
                "only {n}/{} pods {what} after {} s; see {}",
                names.len(),
                WAIT.as_secs(),
                c.log().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One wave: create, all Running, delete, all gone. Returns the ms to all
/// Running (from the first create) and to all gone (from the first delete).
/// While the pods run, checks that the counters see them (so that their
/// zeros later mean something).
async fn wave(
    c: &Cluster,
    rt: &cri::RemoteRuntime,
    places: &Places,
    w: usize,
    n: usize,
    uids: &mut HashSet<String>,
) -> anyhow::Result<(u128, u128)> {
    let pods: Api<Pod> = Api::namespaced(c.admin.clone(), "default");
    let names: Vec<String> = (0..n).map(|i| format!("w{w}-p{i}-{}", c.node)).collect();
    let creates = names.iter().map(|name| {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &pod(name, &c.node)?)
                .await
                .map_err(anyhow::Error::from)
        }
    });
    let start = Instant::now();
    for p in futures::future::join_all(creates).await {
        uids.extend(p?.metadata.uid);
    }
    wait_all(c, &names, "Running", |p| {
        p.is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await?;
    let running = start.elapsed().as_millis();
    let live = measure(c, rt, places, uids).await?;
    let seen = [
        live.sandboxes,
        live.containers,
        live.pod_dirs,
        live.pod_cgroups,
        live.log_dirs,
    ];
    // At least n: the previous wave's dead sandboxes, containers and log
    // directories stay until the runtime's GC (every minute).
    if seen.iter().any(|&k| k < n) || live.mounts < n {
        bail!("wave {w}: the counters do not see the {n} running pods: {live:?}");
    }
    let deletes = names.iter().map(|name| {
        let pods = pods.clone();
        async move { pods.delete(name, &DeleteParams::default()).await }
    });
    let start = Instant::now();
    for r in futures::future::join_all(deletes).await {
        r?;
    }
    wait_all(c, &names, "gone", |p| p.is_none()).await?;
    Ok((running, start.elapsed().as_millis()))
}

/// Runs the waves; `Ok(true)` if nothing leaked.
async fn churn(
    c: &Cluster,
    rt: &cri::RemoteRuntime,
    places: &Places,
    waves: usize,
    n: usize,
) -> anyhow::Result<bool> {
    let pause = std::env::var("CHURN_PAUSE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0u64);
    let cms: Api<ConfigMap> = Api::namespaced(c.admin.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": CONFIGMAP}, "data": {"key": "v1"}
    }))?;
    cms.create(&PostParams::default(), &cm).await?;
    let mut uids = HashSet::new();
    let base = measure(c, rt, places, &uids).await?;
    println!("wave=0 running_ms=0 gone_ms=0 {}", base.kv());
    let mut first = base;
    for w in 1..=waves {
        let (running, gone) = wave(c, rt, places, w, n, &mut uids).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let m = measure(c, rt, places, &uids).await?;
        println!("wave={w} running_ms={running} gone_ms={gone} {}", m.kv());
        if w == 1 {
            first = m;
        }
        if pause > 0 {
            // At rest: what the kubelet holds once it has had time to give
            // freed heap back (its allocator task trims 30-60 s after the
            // last pod left).
            tokio::time::sleep(Duration::from_secs(pause)).await;
            let r = measure(c, rt, places, &uids).await?;
            println!("rest wave={w} {}", r.kv());
            if w == 1 {
                first = r;
            }
        }
    }
    // Dead sandboxes and containers go with the runtime's garbage
    // collection (every minute), log directories with them.
    let start = Instant::now();
    let end = loop {
        let m = measure(c, rt, places, &uids).await?;
        if m.leftovers() == 0 || start.elapsed() > Duration::from_secs(180) {
            break m;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!("end settle_ms={} {}", start.elapsed().as_millis(), end.kv());
    // With pauses, the RSS compared is at rest after the last wave too.
    let end = if pause > 0 {
        tokio::time::sleep(Duration::from_secs(pause)).await;
        let r = measure(c, rt, places, &uids).await?;
        println!("rest end {}", r.kv());
        r
    } else {
        end
    };
    let rss_delta = end.rss_kib as i64 - first.rss_kib as i64;
    let rss_pct = if first.rss_kib > 0 {
        rss_delta as f64 * 100.0 / first.rss_kib as f64
    } else {
        0.0
    };
    println!(
        "summary waves={waves} pods={n} leaked: sandboxes={} containers={} mounts={} pod_dirs={} pod_cgroups={} log_dirs={}; fds {} (after wave 1: {}); threads {} (after wave 1: {}); rss {} KiB (after wave 1{}: {} KiB, {rss_delta:+} KiB, {rss_pct:+.1}%); {}",
        end.sandboxes,
        end.containers,
        end.mounts,
        end.pod_dirs,
        end.pod_cgroups,
        end.log_dirs,
        end.fds,
        first.fds,
        end.threads,
        first.threads,
        end.rss_kib,
        if pause > 0 { ", at rest" } else { "" },
        first.rss_kib,
        if end.leftovers() == 0 { "OK" } else { "LEAKED" }
    );
    Ok(end.leftovers() == 0)
}

/// After a failure: deletes the pods that are left and waits (120 s at
/// most) for the kubelet to finish them, so that no mounts stay behind.
async fn drain(c: &Cluster) {
    let pods: Api<Pod> = Api::namespaced(c.admin.clone(), "default");
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return;
    };
    let names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    for name in &names {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline
        && names
            .iter()
            .any(|name| c.api.get("pods", "default", name).is_some())
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let (bin, waves, n) = match args.as_slice() {
        [_, bin, waves, n, ..] => (bin.clone(), waves.parse::<usize>()?, n.parse::<usize>()?),
        _ => bail!("usage: churn_bench KUBELET_BIN WAVES PODS [kubelet flags...]"),
    };
    let extra = &args[4..];
    let endpoint = std::env::var("CHURN_ENDPOINT")
        .ok()
        .or_else(|| flag(extra, "container-runtime-endpoint"))
        .unwrap_or_else(|| LANE1_ENDPOINT.to_string());
    // The double keeps its last changes (whole objects) for watches to
    // resume from; a smaller window keeps this process small over 1,000 pods.
    let options = Options {
        history_limit: 2_000,
        ..Options::default()
    };
    let mut c = Cluster::start(Start {
        bin: &bin,
        node_prefix: "churn",
        read_only_port: 0,
        extra,
        options,
        config: None,
    })
    .await?;
    let places = Places {
        endpoint,
        root: c.root_dir(),
        cgroup_root: flag(extra, "cgroup-root").unwrap_or_else(|| "/".to_string()),
        pod_logs: pod_logs_dir(extra),
    };
    let rt = cri::RemoteRuntime::new(&places.endpoint, None, Duration::from_secs(30))?;
    let result = churn(&c, &rt, &places, waves, n).await;
    if result.is_err() {
        drain(&c).await;
    }
    c.cleanup(&places.endpoint).await?;
    if !result? {
        bail!("the pods left something behind (see the summary line)");
    }
    Ok(())
}
