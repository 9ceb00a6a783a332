//! The summary stats provider (upstream `pkg/kubelet/stats`: the CRI stats
//! provider and the summary provider it feeds): pods and containers from the
//! runtime's `ListPodSandboxStats` and `ListContainerStats`, the node from the
//! root cgroup and `/proc` (what upstream reads through cAdvisor), the image
//! filesystem from `ImageFsInfo`. `usageNanoCores` comes from the runtime when
//! it fills it, else from the previous sample of the same container, sandbox
//! or node (upstream `getAndUpdateContainerUsageNanoCores`). Pods report their
//! CSI volumes' stats ([`volumes`]); ephemeral storage counts only writable
//! layers and logs. A sandbox or container whose stats the runtime
//! fails is left out alone, never the node's summary (see [`cri_stats`], and
//! [`pod_cgroup`] for pods the runtime gave nothing for); the failures are
//! counted in `kubelet_runtime_operations_errors_total{operation_type}`.

mod batch_backoff;
mod cpu;
mod cri_stats;
mod node;
mod pod_cgroup;
mod provider;
mod summary_cache;
mod volumes;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cri::pb;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_metrics::KubeletMetrics;
use kubelet_runtime::pleg::PodCache;
use kubelet_server::stats::summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats,
    PodReference, PodStats, RlimitStats, RuntimeStats, SwapStats,
};
use kubelet_server::stats::{StatsError, Summary};

pub use self::batch_backoff::StatsFallback;
pub use self::cpu::CpuUsageCache;
pub use self::cri_stats::StatsRuntime;
pub use self::pod_cgroup::PodCgroupDirs;
pub use self::summary_cache::{SUMMARY_REUSE, SummaryCache};

/// Key of the node's own CPU sample.
const NODE_KEY: &str = "/";

fn time_ns(ns: i64) -> Option<Time> {
    if ns <= 0 {
        return None;
    }
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .ok()
        .map(Time)
}

fn now_ns() -> i64 {
    i64::try_from(jiff::Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX)
}

fn val(v: &Option<pb::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

/// CPU stats of a runtime sample, `usageNanoCores` from the runtime when it
/// fills it, else from the previous sample under `key`.
fn cpu_stats(cache: &CpuUsageCache, key: &str, cpu: &pb::CpuUsage) -> CpuStats {
    let core_ns = val(&cpu.usage_core_nano_seconds);
    let runtime_rate = val(&cpu.usage_nano_cores).filter(|v| *v > 0);
    let derived = core_ns.and_then(|c| cache.update(key, cpu.timestamp, c));
    CpuStats {
        time: time_ns(cpu.timestamp),
        usage_nano_cores: runtime_rate.or(derived),
        usage_core_nano_seconds: core_ns,
    }
}

fn memory_stats(m: &pb::MemoryUsage) -> MemoryStats {
    MemoryStats {
        time: time_ns(m.timestamp),
        available_bytes: val(&m.available_bytes),
        usage_bytes: val(&m.usage_bytes),
        working_set_bytes: val(&m.working_set_bytes),
        rss_bytes: val(&m.rss_bytes),
        page_faults: val(&m.page_faults),
        major_page_faults: val(&m.major_page_faults),
    }
}

fn interface(i: &pb::NetworkInterfaceUsage) -> InterfaceStats {
    InterfaceStats {
        name: i.name.clone(),
        rx_bytes: val(&i.rx_bytes),
        rx_errors: val(&i.rx_errors),
        tx_bytes: val(&i.tx_bytes),
        tx_errors: val(&i.tx_errors),
    }
}

/// Adds `b` to `a`, keeping the later time.
fn sum_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// The usage part of `usage` with capacity and free space of the filesystem `fs`.
fn with_capacity(fs: Option<&FsStats>, used: Option<u64>, inodes_used: Option<u64>) -> FsStats {
    FsStats {
        time: Some(Time(jiff::Timestamp::now())),
        available_bytes: fs.and_then(|f| f.available_bytes),
        capacity_bytes: fs.and_then(|f| f.capacity_bytes),
        used_bytes: used,
        inodes_free: fs.and_then(|f| f.inodes_free),
        inodes: fs.and_then(|f| f.inodes),
        inodes_used,
    }
}

/// A running container chosen for the summary.
struct Chosen {
    container: pb::Container,
    log_dir: PathBuf,
}

/// A sandbox chosen for the summary, with its running containers.
struct ChosenPod {
    sandbox: pb::PodSandbox,
    containers: Vec<Chosen>,
}

/// The newest ready sandbox of each pod (else its newest), and its running
/// containers (upstream `removeTerminatedPods`, `removeTerminatedContainers`).
fn choose(
    sandboxes: Vec<pb::PodSandbox>,
    containers: Vec<pb::Container>,
    pod_logs_dir: &Path,
) -> Vec<ChosenPod> {
    let ready = pb::PodSandboxState::SandboxReady as i32;
    let mut by_uid: HashMap<String, pb::PodSandbox> = HashMap::new();
    for s in sandboxes {
        let uid = s
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let better = match by_uid.get(&uid) {
            None => true,
            Some(cur) => (s.state == ready, s.created_at) > (cur.state == ready, cur.created_at),
        };
        if better {
            by_uid.insert(uid, s);
        }
    }
    let running = pb::ContainerState::ContainerRunning as i32;
    let mut pods: Vec<ChosenPod> = by_uid
        .into_values()
        .map(|sandbox| {
            let (ns, name, uid) = sandbox
                .metadata
                .as_ref()
                .map(|m| (m.namespace.as_str(), m.name.as_str(), m.uid.as_str()))
                .unwrap_or_default();
            let pod_dir = pod_logs_dir.join(format!("{ns}_{name}_{uid}"));
            let containers = containers
                .iter()
                .filter(|c| c.pod_sandbox_id == sandbox.id && c.state == running)
                .map(|c| Chosen {
                    container: c.clone(),
                    log_dir: pod_dir.join(c.metadata.as_ref().map_or("", |m| m.name.as_str())),
                })
                .collect();
            ChosenPod {
                sandbox,
                containers,
            }
        })
        .collect();
    pods.sort_by_key(|p| p.sandbox.created_at);
    pods
}

/// What the blocking host reads return.
struct HostRead {
    node: node::NodeUsage,
    boot: Option<i64>,
    rlimit: (Option<i64>, Option<i64>),
    interfaces: Vec<InterfaceStats>,
    root_fs: Option<FsStats>,
    image_fs: Option<FsStats>,
    logs_fs: Option<FsStats>,
    log_usage: HashMap<PathBuf, (u64, u64)>,
    /// Pod cgroups read for pods the runtime gave no stats for, by UID.
    pod_cgroups: HashMap<String, pod_cgroup::PodUsage>,
}

/// What one collection reads: the runtime, the host's files under
/// `cgroup_root` and `proc_root`, and the kubelet's caches.
pub(crate) struct Collector<'a> {
    pub rt: &'a dyn StatsRuntime,
    pub metrics: &'a KubeletMetrics,
    pub pod_cache: &'a PodCache,
    pub cpu_usage: &'a CpuUsageCache,
    pub fallback: &'a StatsFallback,
    pub node_name: &'a str,
    pub root_dir: &'a Path,
    pub pod_logs_dir: &'a Path,
    pub cgroup_root: &'a Path,
    pub proc_root: &'a Path,
    pub pod_cgroups: Option<Arc<dyn PodCgroupDirs>>,
}

impl Collector<'_> {
    /// Gathers the summary; `full` adds filesystems, network and limits.
    async fn collect(self, full: bool) -> Result<Summary, StatsError> {
        let sample = cri_stats::gather(
            self.rt,
            self.metrics,
            self.fallback,
            self.pod_logs_dir,
            full,
        )
        .await?;
        let pods = sample.pods;
        let image_fs_usage = sample.image_fs;

        let log_dirs: Vec<PathBuf> = if full {
            pods.iter()
                .flat_map(|p| p.containers.iter().map(|c| c.log_dir.clone()))
                .collect()
        } else {
            Vec::new()
        };
        // A running pod the runtime gave no stats for at all: its pod cgroup.
        let ready = pb::PodSandboxState::SandboxReady as i32;
        let no_stats: Vec<String> = pods
            .iter()
            .filter(|p| {
                p.sandbox.state == ready
                    && !sample.sandboxes.contains_key(&p.sandbox.id)
                    && !p
                        .containers
                        .iter()
                        .any(|c| sample.containers.contains_key(&c.container.id))
            })
            .filter_map(|p| Some(p.sandbox.metadata.as_ref()?.uid.clone()))
            .collect();
        let cgroups = self.pod_cgroups.clone().filter(|_| !no_stats.is_empty());
        let root_dir = self.root_dir.to_path_buf();
        let pod_logs_dir = self.pod_logs_dir.to_path_buf();
        let cgroup_root = self.cgroup_root.to_path_buf();
        let proc_root = self.proc_root.to_path_buf();
        let image_mount = image_fs_usage
            .as_ref()
            .and_then(|u| u.fs_id.as_ref())
            .map(|id| PathBuf::from(&id.mountpoint));
        let host = tokio::task::spawn_blocking(move || -> Result<HostRead, StatsError> {
            let node = node::node_usage(&cgroup_root, &proc_root)?;
            let boot = node::boot_time(&proc_root);
            let pod_cgroups = match cgroups {
                Some(c) => {
                    let dirs = c.pod_cgroup_dirs();
                    no_stats
                        .into_iter()
                        .filter_map(|uid| {
                            Some((uid.clone(), pod_cgroup::pod_usage(dirs.get(&uid)?)?))
                        })
                        .collect()
                }
                None => HashMap::new(),
            };
            if !full {
                return Ok(HostRead {
                    node,
                    boot,
                    rlimit: (None, None),
                    interfaces: Vec::new(),
                    root_fs: None,
                    image_fs: None,
                    logs_fs: None,
                    log_usage: HashMap::new(),
                    pod_cgroups,
                });
            }
            let fs_of = |p: &Path| match node::statvfs(p) {
                Ok(fs) => Some(fs),
                Err(e) => {
                    tracing::warn!(error = %e, "Unable to get filesystem stats");
                    None
                }
            };
            Ok(HostRead {
                node,
                boot,
                rlimit: node::rlimit(&proc_root),
                interfaces: node::net_dev(&proc_root),
                root_fs: fs_of(&root_dir),
                image_fs: image_mount.as_deref().and_then(fs_of),
                logs_fs: fs_of(&pod_logs_dir),
                log_usage: log_dirs
                    .into_iter()
                    .map(|d| {
                        let u = node::dir_usage(&d);
                        (d, u)
                    })
                    .collect(),
                pod_cgroups,
            })
        })
        .await??;

        let cstats = sample.containers;
        let sbstats = sample.sandboxes;

        let image_fs = image_fs_usage.as_ref().map(|u| {
            let mut fs = with_capacity(
                host.image_fs.as_ref(),
                val(&u.used_bytes),
                val(&u.inodes_used),
            );
            fs.time = time_ns(u.timestamp).or(fs.time);
            fs
        });

        let mut out = Vec::with_capacity(pods.len());
        for pod in &pods {
            out.push(self.pod_stats(
                pod,
                &cstats,
                sbstats.get(&pod.sandbox.id),
                &host,
                image_fs.as_ref(),
                full,
            ));
        }

        let sampled = now_ns();
        let n = &host.node;
        let node = NodeStats {
            node_name: self.node_name.to_string(),
            start_time: host
                .boot
                .and_then(|b| time_ns(b.saturating_mul(1_000_000_000))),
            cpu: Some(CpuStats {
                time: time_ns(sampled),
                usage_nano_cores: self.cpu_usage.update(NODE_KEY, sampled, n.cpu_core_ns),
                usage_core_nano_seconds: Some(n.cpu_core_ns),
            }),
            memory: Some(MemoryStats {
                time: time_ns(sampled),
                available_bytes: Some(n.capacity_bytes.saturating_sub(n.working_set_bytes)),
                usage_bytes: Some(n.usage_bytes),
                working_set_bytes: Some(n.working_set_bytes),
                rss_bytes: n.rss_bytes,
                page_faults: n.page_faults,
                major_page_faults: n.major_page_faults,
            }),
            network: (full && !host.interfaces.is_empty()).then(|| {
                let default = host
                    .interfaces
                    .iter()
                    .find(|i| i.name == "eth0")
                    .or_else(|| host.interfaces.first())
                    .cloned()
                    .unwrap_or_default();
                NetworkStats {
                    time: time_ns(sampled),
                    default_interface: default,
                    interfaces: host.interfaces.clone(),
                }
            }),
            fs: host.root_fs.clone().map(|mut f| {
                f.time = time_ns(sampled);
                f
            }),
            runtime: image_fs.clone().map(|fs| RuntimeStats {
                image_fs: Some(fs.clone()),
                container_fs: Some(fs),
            }),
            rlimit: full.then(|| RlimitStats {
                time: time_ns(sampled),
                maxpid: host.rlimit.0,
                curproc: host.rlimit.1,
            }),
            swap: n.swap.map(|(used, free)| SwapStats {
                time: time_ns(sampled),
                swap_available_bytes: Some(free),
                swap_usage_bytes: Some(used),
            }),
            system_containers: Vec::new(),
        };
        self.cpu_usage.prune();
        Ok(Summary { node, pods: out })
    }

    fn pod_stats(
        &self,
        pod: &ChosenPod,
        cstats: &HashMap<String, pb::ContainerStats>,
        sb: Option<&pb::PodSandboxStats>,
        host: &HostRead,
        image_fs: Option<&FsStats>,
        full: bool,
    ) -> PodStats {
        let meta = pod.sandbox.metadata.clone().unwrap_or_default();
        let cached = self.pod_cache.get(&meta.uid);
        let mut containers = Vec::with_capacity(pod.containers.len());
        for c in &pod.containers {
            let id = &c.container.id;
            let started = cached
                .as_ref()
                .and_then(|s| s.containers.iter().find(|cs| &cs.id == id))
                .and_then(|cs| cs.started_at)
                .and_then(|t| jiff::Timestamp::try_from(t).ok())
                .map(Time);
            let s = cstats.get(id);
            let rootfs = s
                .and_then(|s| s.writable_layer.as_ref())
                .filter(|_| full)
                .map(|w| {
                    let mut fs = with_capacity(image_fs, val(&w.used_bytes), val(&w.inodes_used));
                    fs.time = time_ns(w.timestamp).or(fs.time);
                    fs
                });
            let logs = host.log_usage.get(&c.log_dir).map(|&(bytes, inodes)| {
                with_capacity(host.logs_fs.as_ref(), Some(bytes), Some(inodes))
            });
            containers.push(ContainerStats {
                name: c
                    .container
                    .metadata
                    .as_ref()
                    .map(|m| m.name.clone())
                    .unwrap_or_default(),
                // Upstream reports the creation time as the start time; the
                // PLEG's start time only when the runtime gave none.
                start_time: time_ns(c.container.created_at).or(started),
                cpu: s
                    .and_then(|s| s.cpu.as_ref())
                    .map(|cpu| cpu_stats(self.cpu_usage, id, cpu)),
                memory: s.and_then(|s| s.memory.as_ref()).map(memory_stats),
                rootfs,
                logs,
                swap: s.and_then(|s| s.swap.as_ref()).map(|sw| SwapStats {
                    time: time_ns(sw.timestamp),
                    swap_available_bytes: val(&sw.swap_available_bytes),
                    swap_usage_bytes: val(&sw.swap_usage_bytes),
                }),
            });
        }
        let linux = sb.and_then(|s| s.linux.as_ref());
        let cgroup = host.pod_cgroups.get(&meta.uid);
        let sampled = now_ns();
        let cpu = match linux.and_then(|l| l.cpu.as_ref()) {
            Some(cpu) => Some(cpu_stats(self.cpu_usage, &pod.sandbox.id, cpu)),
            // No sandbox stats: the sum of the containers.
            None => containers
                .iter()
                .filter_map(|c| c.cpu.clone())
                .reduce(|a, b| CpuStats {
                    time: a.time.max(b.time),
                    usage_nano_cores: sum_opt(a.usage_nano_cores, b.usage_nano_cores),
                    usage_core_nano_seconds: sum_opt(
                        a.usage_core_nano_seconds,
                        b.usage_core_nano_seconds,
                    ),
                })
                .or_else(|| {
                    // Nothing from the runtime: the pod cgroup.
                    let u = cgroup?;
                    let core_ns = u.cpu_core_ns?;
                    let key = format!("pod-cgroup/{}", meta.uid);
                    Some(CpuStats {
                        time: time_ns(sampled),
                        usage_nano_cores: self.cpu_usage.update(&key, sampled, core_ns),
                        usage_core_nano_seconds: Some(core_ns),
                    })
                }),
        };
        let memory = match linux.and_then(|l| l.memory.as_ref()) {
            Some(m) => Some(memory_stats(m)),
            None => containers
                .iter()
                .filter_map(|c| c.memory.clone())
                .reduce(|a, b| MemoryStats {
                    time: a.time.max(b.time),
                    available_bytes: None,
                    usage_bytes: sum_opt(a.usage_bytes, b.usage_bytes),
                    working_set_bytes: sum_opt(a.working_set_bytes, b.working_set_bytes),
                    rss_bytes: sum_opt(a.rss_bytes, b.rss_bytes),
                    page_faults: sum_opt(a.page_faults, b.page_faults),
                    major_page_faults: sum_opt(a.major_page_faults, b.major_page_faults),
                })
                .or_else(|| {
                    let u = cgroup.filter(|u| u.usage_bytes.is_some())?;
                    Some(MemoryStats {
                        time: time_ns(sampled),
                        available_bytes: None,
                        usage_bytes: u.usage_bytes,
                        working_set_bytes: u.working_set_bytes,
                        rss_bytes: u.rss_bytes,
                        page_faults: u.page_faults,
                        major_page_faults: u.major_page_faults,
                    })
                }),
        };
        let network = linux
            .and_then(|l| l.network.as_ref())
            .filter(|_| full)
            .map(|n| NetworkStats {
                // containerd 1.6 leaves the network sample unstamped.
                time: time_ns(n.timestamp).or_else(|| time_ns(now_ns())),
                default_interface: n
                    .default_interface
                    .as_ref()
                    .map(interface)
                    .unwrap_or_default(),
                interfaces: n.interfaces.iter().map(interface).collect(),
            });
        let swap = containers
            .iter()
            .filter_map(|c| c.swap.clone())
            .reduce(|a, b| SwapStats {
                time: a.time.max(b.time),
                swap_available_bytes: None,
                swap_usage_bytes: sum_opt(a.swap_usage_bytes, b.swap_usage_bytes),
            });
        let ephemeral_storage = full.then(|| {
            let parts = containers
                .iter()
                .flat_map(|c| [c.rootfs.as_ref(), c.logs.as_ref()])
                .flatten();
            let (used, inodes) = parts.fold((0, 0), |(u, i), f| {
                (
                    u + f.used_bytes.unwrap_or(0),
                    i + f.inodes_used.unwrap_or(0),
                )
            });
            with_capacity(host.root_fs.as_ref(), Some(used), Some(inodes))
        });
        PodStats {
            pod_ref: PodReference {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
            },
            start_time: time_ns(pod.sandbox.created_at),
            containers,
            cpu,
            memory,
            network,
            volume: Vec::new(),
            ephemeral_storage,
            process_stats: None,
            swap,
        }
    }
}

#[cfg(test)]
mod tests;
