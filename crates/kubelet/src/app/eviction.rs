//! The eviction manager (`kubelet-eviction`), upstream `evictionManager.Start`
//! with the kubelet behind its seams: stats from `/stats/summary` (node
//! memory read fresh from the root cgroup, emptyDir usage measured under
//! the pod's directory, as upstream's volume stats do), the pod manager's
//! non-terminal pods, the pod killer, image and container GC, and the
//! metrics.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kubelet_config::{KubeletConfig, SettingValue};
use kubelet_eviction::stats::{
    ContainerStats, FsSignal, FsUsage, MemorySignal, NodeStats, PodStats, Summary,
};
use kubelet_eviction::{EvictionError, Pressure};
use kubelet_server::stats::summary as api;
use kubelet_types::pod;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info_span, warn};

use super::housekeeping::Housekeeping;
use super::spawn::spawn_in;
use crate::pod_killer::{KillRequest, PodKiller};
use crate::pod_manager::PodManager;
use crate::status::StatusManager;

/// What eviction reclaims disk with before it evicts a pod.
pub(super) struct Reclaimers {
    pub images: Option<Arc<dyn kubelet_eviction::ImageGc>>,
    pub containers: Option<Arc<dyn kubelet_eviction::ContainerGc>>,
}

/// Upstream `evictionMonitoringPeriod`.
const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Deadline of one stats collection for eviction.
const STATS_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of the root memory read and of the emptyDir usage walk.
const FILE_TIMEOUT: Duration = Duration::from_secs(5);

fn boxed(e: impl std::error::Error + Send + Sync + 'static) -> EvictionError {
    EvictionError::Stats(Box::new(e))
}

fn time_of(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<SystemTime> {
    let ns = t?.0.as_nanosecond();
    let ns = u64::try_from(ns).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

fn fs_signal(f: &api::FsStats) -> FsSignal {
    FsSignal {
        available_bytes: f.available_bytes,
        capacity_bytes: f.capacity_bytes,
        inodes_free: f.inodes_free,
        inodes: f.inodes,
        time: time_of(f.time.as_ref()),
    }
}

fn fs_usage(f: Option<&api::FsStats>) -> FsUsage {
    FsUsage {
        used_bytes: f.and_then(|f| f.used_bytes),
        inodes_used: f.and_then(|f| f.inodes_used),
    }
}

/// Bytes and inodes under `dir`, never crossing into another filesystem
/// (blocking).
fn du(dir: &Path) -> FsUsage {
    use std::os::unix::fs::MetadataExt;
    let Ok(root) = std::fs::symlink_metadata(dir) else {
        return FsUsage::default();
    };
    let dev = root.dev();
    let (mut bytes, mut inodes) = (root.blocks() * 512, 1u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            bytes += m.blocks() * 512;
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    FsUsage {
        used_bytes: Some(bytes),
        inodes_used: Some(inodes),
    }
}

/// The summary as eviction reads it.
struct Stats {
    host: Arc<crate::host::KubeletHost>,
    pods: PodManager,
    root_dir: PathBuf,
    roots: kubelet_eviction::notifier::Roots,
    volumes: Arc<VolumeUsage>,
}

/// EmptyDir usage, measured by a walk that may outlast a pass: a pass waits
/// [`FILE_TIMEOUT`] for it, then uses the last complete walk's values; one
/// walk runs at a time.
#[derive(Default)]
struct VolumeUsage {
    last: parking_lot::Mutex<PodVolumes>,
    walking: AtomicBool,
    /// A slow walk was logged (once, until a walk finishes in time).
    slow_logged: AtomicBool,
}

impl VolumeUsage {
    async fn measure<F>(self: &Arc<Self>, deadline: Duration, walk: F) -> PodVolumes
    where
        F: FnOnce() -> PodVolumes + Send + 'static,
    {
        if self.walking.swap(true, Ordering::AcqRel) {
            return self.last.lock().clone();
        }
        let this = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            let v = walk();
            *this.last.lock() = v.clone();
            this.walking.store(false, Ordering::Release);
            v
        });
        match tokio::time::timeout(deadline, task).await {
            Ok(Ok(v)) => {
                self.slow_logged.store(false, Ordering::Relaxed);
                v
            }
            Ok(Err(e)) => {
                self.walking.store(false, Ordering::Release);
                warn!(error = %e, "Eviction manager: emptyDir usage walk failed; using the last known usage");
                self.last.lock().clone()
            }
            Err(_) => {
                if !self.slow_logged.swap(true, Ordering::Relaxed) {
                    warn!(
                        timeout = ?deadline,
                        "Eviction manager: emptyDir usage walk did not finish in time; using the last known usage"
                    );
                }
                self.last.lock().clone()
            }
        }
    }
}

/// A pod's emptyDir usage by volume name, and whether it is on disk
/// (blocking). Memory-backed ones count too: their limit is theirs.
fn empty_dirs(root_dir: &Path, p: &Pod) -> Vec<(String, FsUsage, bool)> {
    let dir = root_dir
        .join("pods")
        .join(pod::uid(p))
        .join("volumes/kubernetes.io~empty-dir");
    p.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            let on_disk = e.medium.as_deref().unwrap_or("").is_empty();
            Some((v.name.clone(), du(&dir.join(&v.name)), on_disk))
        })
        .collect()
}

type PodVolumes = Vec<(String, Vec<(String, FsUsage, bool)>)>;

fn pod_stats(p: &api::PodStats, volumes: &PodVolumes) -> PodStats {
    let vols = volumes
        .iter()
        .find(|(uid, _)| *uid == p.pod_ref.uid)
        .map(|(_, v)| v.as_slice())
        .unwrap_or_default();
    let on_disk: u64 = vols
        .iter()
        .filter(|(_, _, d)| *d)
        .filter_map(|(_, u, _)| u.used_bytes)
        .sum();
    PodStats {
        uid: p.pod_ref.uid.clone(),
        memory_working_set: p.memory.as_ref().and_then(|m| m.working_set_bytes),
        process_count: p.process_stats.as_ref().and_then(|s| s.process_count),
        containers: p
            .containers
            .iter()
            .map(|c| ContainerStats {
                name: c.name.clone(),
                memory_working_set: c.memory.as_ref().and_then(|m| m.working_set_bytes),
                rootfs: fs_usage(c.rootfs.as_ref()),
                logs: fs_usage(c.logs.as_ref()),
            })
            .collect(),
        volumes: vols.iter().map(|(n, u, _)| (n.clone(), *u)).collect(),
        ephemeral_used_bytes: Some(
            p.ephemeral_storage
                .as_ref()
                .and_then(|e| e.used_bytes)
                .unwrap_or(0)
                + on_disk,
        ),
    }
}

#[async_trait::async_trait]
impl kubelet_eviction::SummaryProvider for Stats {
    async fn summary(&self) -> Result<Summary, EvictionError> {
        // Pod stats collected from now on: a summary another reader took
        // moments ago may predate a pod that now fills memory, and ranking
        // it as a pod without stats would put it behind the others.
        let s = tokio::time::timeout(
            STATS_TIMEOUT,
            self.host.summary_since(tokio::time::Instant::now()),
        )
        .await
        .map_err(boxed)?
        .map_err(boxed)?;
        let roots = self.roots.clone();
        let memory = tokio::time::timeout(
            FILE_TIMEOUT,
            tokio::task::spawn_blocking(move || {
                kubelet_eviction::notifier::read_root_memory(&roots.cgroup, &roots.proc)
            }),
        )
        .await;
        let pods: Vec<Arc<Pod>> = self.pods.get_pods();
        let root_dir = self.root_dir.clone();
        let volumes = self
            .volumes
            .measure(FILE_TIMEOUT, move || {
                pods.iter()
                    .map(|p| (pod::uid(p).to_string(), empty_dirs(&root_dir, p)))
                    .collect()
            })
            .await;
        let memory = match memory {
            Ok(Ok(Ok(m))) => Some(MemorySignal {
                available_bytes: m.available(),
                working_set_bytes: m.working_set(),
                time: Some(SystemTime::now()),
            }),
            // The summary's, as upstream reads it.
            _ => s.node.memory.as_ref().and_then(|m| {
                Some(MemorySignal {
                    available_bytes: m.available_bytes?,
                    working_set_bytes: m.working_set_bytes?,
                    time: time_of(m.time.as_ref()),
                })
            }),
        };
        let nodefs = s.node.fs.as_ref().map(fs_signal);
        let imagefs = s
            .node
            .runtime
            .as_ref()
            .and_then(|r| r.image_fs.as_ref())
            .map(fs_signal);
        let dedicated_imagefs = match (&nodefs, &imagefs) {
            (Some(n), Some(i)) => (n.capacity_bytes, n.inodes) != (i.capacity_bytes, i.inodes),
            _ => false,
        };
        let pids = s.node.rlimit.as_ref().and_then(|r| {
            Some((
                u64::try_from(r.maxpid?).ok()?,
                u64::try_from(r.curproc?).ok()?,
                time_of(r.time.as_ref()),
            ))
        });
        Ok(Summary {
            node: NodeStats {
                memory,
                allocatable_memory: None,
                nodefs,
                imagefs,
                pids,
                dedicated_imagefs,
            },
            pods: s.pods.iter().map(|p| pod_stats(p, &volumes)).collect(),
        })
    }
}

/// The pod manager's pods that are not terminal.
struct Active {
    pods: PodManager,
    status: Arc<StatusManager>,
    root_dir: PathBuf,
}

fn terminal(status: &StatusManager, uid: &str) -> bool {
    status
        .get_pod_status(uid)
        .and_then(|s| s.phase)
        .is_some_and(|p| p == "Failed" || p == "Succeeded")
}

#[async_trait::async_trait]
impl kubelet_eviction::ActivePods for Active {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.pods
            .get_pods()
            .into_iter()
            .filter(|p| !terminal(&self.status, pod::uid(p)))
            .collect()
    }

    async fn cleaned_up(&self, p: &Pod) -> bool {
        let uid = pod::uid(p);
        // A pod deleted since (gone from the pod manager or its status
        // removed) is as done as a terminal one; its mounts still count.
        let gone = !self.pods.contains(uid) || self.status.get_pod_status(uid).is_none();
        if !gone && !terminal(&self.status, uid) {
            return false;
        }
        let dir = self.root_dir.join("pods").join(pod::uid(p));
        let mounted = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::fs::read_to_string("/proc/self/mountinfo"),
        )
        .await;
        match mounted {
            Ok(Ok(text)) => {
                let prefix = dir.display().to_string();
                let mounts: HashSet<&str> = text
                    .lines()
                    .filter_map(|l| l.split(' ').nth(4))
                    .filter(|m| m.starts_with(&prefix))
                    .collect();
                mounts.is_empty()
            }
            _ => true,
        }
    }
}

/// Kills through the pod killer with `Evicted`.
struct Killer(Arc<dyn PodKiller>);

#[async_trait::async_trait]
impl kubelet_eviction::PodEvictor for Killer {
    async fn evict(
        &self,
        p: &Arc<Pod>,
        e: kubelet_eviction::Eviction,
    ) -> Result<(), EvictionError> {
        let conditions = if e.disruption_target {
            vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("TerminationByKubelet".into()),
                message: Some(e.message.clone()),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::now(),
                )),
                ..Default::default()
            }]
        } else {
            vec![]
        };
        self.0
            .kill_pod(
                p,
                KillRequest {
                    reason: kubelet_eviction::message::REASON.into(),
                    message: e.message,
                    conditions,
                    grace_period_override: Some(e.grace_period_seconds),
                },
            )
            .await
            .map_err(|e| EvictionError::Kill(Box::new(e)))
    }
}

struct Metrics(Arc<kubelet_metrics::KubeletMetrics>);

impl kubelet_eviction::EvictionMetrics for Metrics {
    fn evicted(&self, signal: &str) {
        self.0.inc_evictions(signal);
    }
    fn stats_age(&self, signal: &str, age: Duration) {
        self.0.observe_eviction_stats_age(signal, age);
    }
}

/// The manager's thresholds from `evictionHard` and the soft settings
/// (upstream `ParseThresholdConfig` in `NewMainKubelet`): an invalid
/// setting fails the kubelet's start.
pub(super) fn thresholds(
    cfg: &KubeletConfig,
) -> Result<Vec<kubelet_eviction::Threshold>, EvictionError> {
    let e = &cfg.housekeeping.eviction;
    let grace = kubelet_config::housekeeping::eviction::soft_grace_periods(e);
    let enforce = match cfg.settings.get("enforceNodeAllocatable") {
        Some(SettingValue::List(l)) => l.iter().any(|k| k == "pods"),
        // Upstream's default is `pods`.
        _ => true,
    };
    kubelet_eviction::parse_thresholds(&kubelet_eviction::ThresholdConfig {
        hard: &cfg.cluster.eviction_hard,
        soft: &e.soft,
        soft_grace_period: &grace,
        minimum_reclaim: &e.minimum_reclaim,
        enforce_allocatable_pods: enforce,
    })
}

/// Starts it on `tasks` under `stop`, publishing node conditions on `pressure`.
pub(super) fn spawn(
    h: &Housekeeping<'_>,
    thresholds: Vec<kubelet_eviction::Threshold>,
    reclaim: Reclaimers,
    pressure: kubelet_eviction::admit::PressureSender,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    let roots = kubelet_eviction::notifier::Roots::default();
    let manager = Arc::new(kubelet_eviction::Manager::new(
        kubelet_eviction::Config {
            thresholds: thresholds.clone(),
            pressure_transition_period: h.cfg.housekeeping.eviction.pressure_transition_period,
            max_pod_grace_period_seconds: h.cfg.housekeeping.eviction.max_pod_grace_period,
            monitoring_interval: MONITORING_INTERVAL,
            local_storage_capacity_isolation: h
                .cfg
                .housekeeping
                .eviction
                .local_storage_capacity_isolation,
            node_name: h.cfg.node_name.clone(),
        },
        kubelet_eviction::Deps {
            summary: Arc::new(Stats {
                host: h.host.clone(),
                pods: h.pods.clone(),
                root_dir: h.cfg.root_dir.clone(),
                roots: roots.clone(),
                volumes: Arc::default(),
            }),
            pods: Arc::new(Active {
                pods: h.pods.clone(),
                status: h.status.clone(),
                root_dir: h.cfg.root_dir.clone(),
            }),
            evictor: Arc::new(Killer(h.killer.clone())),
            images: reclaim.images,
            containers: reclaim.containers,
            recorder: h.recorder.clone(),
            metrics: Arc::new(Metrics(h.metrics.clone())),
        },
        pressure,
    ));
    spawn_in(
        tasks,
        info_span!("eviction_notifier"),
        kubelet_eviction::notifier::run(thresholds, roots, manager.waker(), stop.child_token()),
    );
    spawn_in(
        tasks,
        info_span!("eviction_manager"),
        manager.run(stop.child_token()),
    );
}

/// Node status reads the conditions through `kubelet-node`'s seam.
pub(super) struct NodePressure(pub Pressure);

impl kubelet_node::NodePressure for NodePressure {
    fn memory_pressure(&self) -> bool {
        self.0.has(kubelet_eviction::NodeCondition::MemoryPressure)
    }
    fn disk_pressure(&self) -> bool {
        self.0.has(kubelet_eviction::NodeCondition::DiskPressure)
    }
    fn pid_pressure(&self) -> bool {
        self.0.has(kubelet_eviction::NodeCondition::PidPressure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> KubeletConfig {
        let flags = kubelet_config::Flags::parse_args(
            std::iter::once("kubelet").chain(args.iter().copied()),
        )
        .expect("flags");
        KubeletConfig::resolve(&flags, None, "n1").expect("config")
    }

    #[test]
    fn default_thresholds_parse() {
        let t = thresholds(&config(&[])).expect("upstream defaults");
        assert!(
            t.iter()
                .any(|t| t.signal == kubelet_eviction::Signal::MemoryAvailable)
        );
    }

    #[tokio::test]
    async fn build_refuses_an_invalid_threshold_with_upstreams_message() {
        for (flag, message) in [
            (
                "--eviction-hard=memory.avaliable<1Gi",
                "unsupported eviction signal memory.avaliable",
            ),
            (
                "--eviction-hard=memory.available<110%",
                "eviction percentage threshold memory.available must be <= 100%: 110%",
            ),
            (
                "--eviction-soft=memory.available<1Gi",
                "grace period must be specified for the soft eviction threshold memory.available",
            ),
        ] {
            let cfg = config(&[flag]);
            let err = thresholds(&cfg).expect_err(flag);
            assert_eq!(err.to_string(), message);
            match crate::app::App::build(cfg).await {
                Err(e @ crate::error::Error::Eviction(_)) => assert_eq!(e.to_string(), message),
                Err(e) => panic!("{flag}: wrong error {e}"),
                Ok(_) => panic!("{flag}: the kubelet started"),
            }
        }
    }

    fn usage(bytes: u64) -> PodVolumes {
        vec![(
            "uid".into(),
            vec![(
                "v".into(),
                FsUsage {
                    used_bytes: Some(bytes),
                    inodes_used: Some(1),
                },
                true,
            )],
        )]
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_emptydir_walk_does_not_hold_the_pass() {
        let v = Arc::new(VolumeUsage::default());
        assert_eq!(v.measure(FILE_TIMEOUT, || usage(1)).await, usage(1));
        // A walk that hangs: the pass goes on with the last values. (Paused
        // time does not auto-advance while a blocking task runs.)
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let past_deadline = || tokio::time::advance(FILE_TIMEOUT + Duration::from_millis(1));
        let (got, ()) = tokio::join!(
            v.measure(FILE_TIMEOUT, move || {
                let _ = hung.recv();
                usage(2)
            }),
            past_deadline()
        );
        assert_eq!(got, usage(1), "last known usage on timeout");
        // No second walk while the first still runs.
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        let got = v
            .measure(FILE_TIMEOUT, move || {
                s.store(true, Ordering::SeqCst);
                usage(3)
            })
            .await;
        assert_eq!(got, usage(1));
        assert!(!started.load(Ordering::SeqCst), "one walk at a time");
        // The hung walk finishes: its values are kept, the next walk runs.
        release.send(()).expect("release");
        for _ in 0..500 {
            if !v.walking.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(*v.last.lock(), usage(2));
        assert_eq!(v.measure(FILE_TIMEOUT, || usage(4)).await, usage(4));
    }
}
