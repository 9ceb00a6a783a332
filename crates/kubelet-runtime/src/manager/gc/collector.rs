//! The periodic container garbage collector (upstream `kuberuntime_gc.go`
//! `containerGC.GarbageCollect`, driven by `container_gc.go` every minute):
//! dead containers by age and count, dead sandboxes, and the log
//! directories of pods that are gone.
//!
//! Beyond upstream, the newest dead instance of each container of a pod
//! that stays is never removed, whatever the limits: it is what
//! `kubectl logs --previous` (or the logs of a completed pod) reads.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cri::pb;
use kubelet_types::labels;
use tracing::{debug, info, warn};

use super::super::KubeRuntimeManager;
use crate::Result;

/// Grace period for a container in an unknown state that is stopped before
/// its removal (upstream `minimumGracePeriodInSeconds`).
const UNKNOWN_STOP_GRACE: Duration = Duration::from_secs(2);

/// What one collection removed and kept, for its log line and callers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcSummary {
    /// Dead containers removed.
    pub containers_removed: usize,
    /// Of those, containers of pods whose content was removed whole.
    pub removed_with_pod: usize,
    /// Dead containers kept (within the limits, or the last instance).
    pub containers_kept: usize,
    /// Dead containers the global limit wanted gone but that are the last
    /// instance of a container of a pod that stays.
    pub kept_over_limit: usize,
    /// Sandboxes removed.
    pub sandboxes_removed: usize,
    /// Pod log directories removed.
    pub log_dirs_removed: usize,
    /// Removals that failed (retried at the next collection).
    pub failures: usize,
}

/// One dead container considered for removal (upstream `containerGCInfo`).
#[derive(Clone, Debug)]
struct Dead {
    id: String,
    created: i64,
    attempt: u32,
    unknown: bool,
}

/// Newest first: by attempt, then creation time (upstream `byAttempt`).
fn newest_first(a: &Dead, b: &Dead) -> std::cmp::Ordering {
    b.attempt
        .cmp(&a.attempt)
        .then_with(|| b.created.cmp(&a.created))
}

/// How the kubelet sees a pod the runtime holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodGc {
    /// Deleted or unknown: all of its content may go (upstream
    /// `ShouldPodContentBeRemoved`).
    Gone,
    /// Terminated but still wanted (upstream `ShouldPodRuntimeBeRemoved`).
    Terminated,
    /// Live.
    Live,
}

fn classify(state: Option<bool>, all_sources_ready: bool) -> PodGc {
    match state {
        // Until every source has reported, an unknown pod may be one not
        // seen yet: keep it (upstream's pod workers answer `podsSynced`).
        None if all_sources_ready => PodGc::Gone,
        None | Some(false) => PodGc::Live,
        Some(true) => PodGc::Terminated,
    }
}

fn to_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn pod_uid(labels: &HashMap<String, String>) -> Option<&str> {
    labels
        .get(labels::POD_UID)
        .map(String::as_str)
        .filter(|u| !u.is_empty())
}

/// The pod UID of a `<namespace>_<name>_<uid>` log directory (upstream
/// `parsePodUIDFromLogsDirectory`).
fn uid_of_log_dir(name: &str) -> &str {
    name.rsplit('_').next().unwrap_or(name)
}

impl KubeRuntimeManager {
    /// Upstream `GarbageCollect(gcPolicy, allSourcesReady, evictNonDeletedPods)`:
    ///
    /// - dead containers created more than `min_age` before `now`, grouped
    ///   by pod UID and container name: all of a pod that is gone (or
    ///   terminated, with `evict_non_deleted_pods`) once every source is
    ///   ready; otherwise the newest `max_per_pod_container` of each group
    ///   stay (negative: no limit; at least the newest), then at most
    ///   `max_containers` in all (negative: no limit), oldest removed first;
    /// - sandboxes that are not ready and hold no containers, but the newest
    ///   of a pod that stays;
    /// - once every source is ready, the log directories of pods that are gone.
    ///
    /// `pod_state(uid)` tells how the kubelet sees a pod: `None` when it is
    /// deleted or unknown, `Some(true)` when it is terminated but still
    /// wanted, `Some(false)` when it is live.
    ///
    /// Errors only when the runtime cannot list its containers or
    /// sandboxes; a failed removal is logged, counted and retried next time.
    pub async fn garbage_collect(
        &self,
        min_age: Duration,
        max_per_pod_container: i32,
        max_containers: i32,
        all_sources_ready: bool,
        evict_non_deleted_pods: bool,
        pod_state: &(dyn Fn(&str) -> Option<bool> + Send + Sync),
    ) -> Result<GcSummary> {
        let policy = Policy {
            min_age,
            max_per_pod_container,
            max_containers,
        };
        self.garbage_collect_at(
            &policy,
            all_sources_ready,
            evict_non_deleted_pods,
            pod_state,
            SystemTime::now(),
        )
        .await
    }

    pub(super) async fn garbage_collect_at(
        &self,
        policy: &Policy,
        all_sources_ready: bool,
        evict_non_deleted_pods: bool,
        pod_state: &(dyn Fn(&str) -> Option<bool> + Send + Sync),
        now: SystemTime,
    ) -> Result<GcSummary> {
        let mut summary = GcSummary::default();
        let removable = |uid: &str| match classify(pod_state(uid), all_sources_ready) {
            PodGc::Gone => true,
            PodGc::Terminated => evict_non_deleted_pods,
            PodGc::Live => false,
        };
        let containers = self.runtime.list_containers(None).await?;
        self.evict_containers(policy, &containers, &removable, now, &mut summary)
            .await;
        let sandbox_err = self.evict_sandboxes(&removable, &mut summary).await.err();
        if all_sources_ready {
            self.evict_pod_log_dirs(pod_state, &mut summary).await;
        }
        let removed =
            summary.containers_removed + summary.sandboxes_removed + summary.log_dirs_removed;
        if removed > 0 || summary.failures > 0 || summary.kept_over_limit > 0 {
            info!(
                containers_removed = summary.containers_removed,
                removed_with_pod = summary.removed_with_pod,
                containers_kept = summary.containers_kept,
                kept_over_limit = summary.kept_over_limit,
                sandboxes_removed = summary.sandboxes_removed,
                log_dirs_removed = summary.log_dirs_removed,
                failures = summary.failures,
                min_age = ?policy.min_age,
                max_per_pod_container = policy.max_per_pod_container,
                max_containers = policy.max_containers,
                all_sources_ready,
                "Container garbage collection removed dead containers, sandboxes and pod log directories"
            );
        } else {
            debug!(
                containers_kept = summary.containers_kept,
                "Container garbage collection found nothing to remove"
            );
        }
        match sandbox_err {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    }

    /// Upstream `evictContainers`.
    async fn evict_containers(
        &self,
        policy: &Policy,
        containers: &[pb::Container],
        removable: &(dyn Fn(&str) -> bool + Sync),
        now: SystemTime,
        summary: &mut GcSummary,
    ) {
        let min_age = i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX);
        let newest_gc = to_ns(now).saturating_sub(min_age);
        let mut units: HashMap<(String, String), Vec<Dead>> = HashMap::new();
        for c in containers {
            if c.state == pb::ContainerState::ContainerRunning as i32 || c.created_at > newest_gc {
                continue;
            }
            let (Some(uid), Some(meta)) = (pod_uid(&c.labels), c.metadata.as_ref()) else {
                continue; // not the kubelet's
            };
            units
                .entry((uid.to_string(), meta.name.clone()))
                .or_default()
                .push(Dead {
                    id: c.id.clone(),
                    created: c.created_at,
                    attempt: meta.attempt,
                    unknown: c.state == pb::ContainerState::ContainerUnknown as i32,
                });
        }
        for unit in units.values_mut() {
            unit.sort_by(newest_first);
        }
        // Pods that are gone go whole.
        let gone: Vec<_> = units
            .keys()
            .filter(|(uid, _)| removable(uid))
            .cloned()
            .collect();
        for key in gone {
            if let Some(unit) = units.remove(&key) {
                summary.removed_with_pod += unit.len();
                self.remove_dead(&unit, summary).await;
            }
        }
        // The per-container limit, never below the last instance.
        if policy.max_per_pod_container >= 0 {
            let keep = usize::try_from(policy.max_per_pod_container.max(1)).unwrap_or(1);
            self.trim_units(&mut units, keep, summary).await;
        }
        // The global limit: first an even share per container (at least
        // one), then the oldest across containers.
        if let Ok(max) = usize::try_from(policy.max_containers) {
            let total: usize = units.values().map(Vec::len).sum();
            if total > max && !units.is_empty() {
                let share = (max / units.len()).max(1);
                self.trim_units(&mut units, share, summary).await;
                let total: usize = units.values().map(Vec::len).sum();
                if total > max {
                    // Each container's newest is kept: only older ones go.
                    let mut older: Vec<Dead> = units
                        .values()
                        .flat_map(|u| u.iter().skip(1).cloned())
                        .collect();
                    older.sort_by(newest_first);
                    let excess = total - max;
                    let n = excess.min(older.len());
                    summary.kept_over_limit = excess - n;
                    let victims = older.split_off(older.len() - n);
                    let ids: HashSet<&str> = victims.iter().map(|d| d.id.as_str()).collect();
                    for unit in units.values_mut() {
                        unit.retain(|d| !ids.contains(d.id.as_str()));
                    }
                    self.remove_dead(&victims, summary).await;
                }
            }
        }
        summary.containers_kept = units.values().map(Vec::len).sum();
    }

    /// Keeps the newest `keep` of each unit (upstream
    /// `enforceMaxContainersPerEvictUnit`).
    async fn trim_units(
        &self,
        units: &mut HashMap<(String, String), Vec<Dead>>,
        keep: usize,
        summary: &mut GcSummary,
    ) {
        for unit in units.values_mut() {
            if unit.len() > keep {
                let old = unit.split_off(keep);
                self.remove_dead(&old, summary).await;
            }
        }
    }

    /// Removes dead containers, oldest first (upstream `removeOldestN`);
    /// one in an unknown state is stopped first.
    async fn remove_dead(&self, dead: &[Dead], summary: &mut GcSummary) {
        for d in dead.iter().rev() {
            if d.unknown
                && let Err(e) = self.runtime.stop_container(&d.id, UNKNOWN_STOP_GRACE).await
                && !e.is_not_found()
            {
                warn!(container.id = %d.id, error = %e, "Failed to stop container in unknown state before removal");
                summary.failures += 1;
                continue;
            }
            match self.remove_container(&d.id).await {
                Ok(()) => {
                    debug!(container.id = %d.id, attempt = d.attempt, "Removed dead container");
                    summary.containers_removed += 1;
                }
                Err(e) => {
                    warn!(container.id = %d.id, error = %e, "Failed to remove dead container");
                    summary.failures += 1;
                }
            }
        }
    }

    /// Upstream `evictSandboxes`: a sandbox that is not ready and holds no
    /// container may go, unless it is the newest of a pod that stays.
    async fn evict_sandboxes(
        &self,
        removable: &(dyn Fn(&str) -> bool + Sync),
        summary: &mut GcSummary,
    ) -> Result<()> {
        let (containers, sandboxes) = futures::try_join!(
            self.runtime.list_containers(None),
            self.runtime.list_pod_sandbox(None),
        )?;
        let in_use: HashSet<&str> = containers
            .iter()
            .map(|c| c.pod_sandbox_id.as_str())
            .collect();
        let mut by_pod: HashMap<&str, Vec<&pb::PodSandbox>> = HashMap::new();
        for s in &sandboxes {
            let Some(uid) = s.metadata.as_ref().map(|m| m.uid.as_str()) else {
                continue;
            };
            if uid.is_empty() {
                continue;
            }
            by_pod.entry(uid).or_default().push(s);
        }
        for (uid, mut list) in by_pod {
            list.sort_by(|a, b| {
                let attempt = |s: &pb::PodSandbox| s.metadata.as_ref().map_or(0, |m| m.attempt);
                attempt(b)
                    .cmp(&attempt(a))
                    .then_with(|| b.created_at.cmp(&a.created_at))
            });
            let skip = usize::from(!removable(uid));
            for s in list.into_iter().skip(skip) {
                let active = s.state == pb::PodSandboxState::SandboxReady as i32
                    || in_use.contains(s.id.as_str());
                if active {
                    continue;
                }
                // Stopped already in the normal course; stop again in case
                // it was not, as upstream does, before the removal.
                let r = match self.runtime.stop_pod_sandbox(&s.id).await {
                    Err(e) if !e.is_not_found() => Err(e),
                    _ => match self.runtime.remove_pod_sandbox(&s.id).await {
                        Err(e) if !e.is_not_found() => Err(e),
                        _ => Ok(()),
                    },
                };
                match r {
                    Ok(()) => {
                        debug!(pod.uid = %uid, sandbox.id = %s.id, "Removed dead sandbox");
                        summary.sandboxes_removed += 1;
                    }
                    Err(e) => {
                        warn!(pod.uid = %uid, sandbox.id = %s.id, error = %e, "Failed to remove dead sandbox");
                        summary.failures += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Upstream `evictPodLogsDirectories`: the `<ns>_<name>_<uid>`
    /// directories of pods that are gone. Call only once every source is
    /// ready.
    async fn evict_pod_log_dirs(
        &self,
        pod_state: &(dyn Fn(&str) -> Option<bool> + Send + Sync),
        summary: &mut GcSummary,
    ) {
        let root = &self.cfg.pod_logs_dir;
        let mut entries = match tokio::fs::read_dir(root).await {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!(dir = %root.display(), error = %e, "Cannot read the pod logs directory");
                summary.failures += 1;
                return;
            }
        };
        loop {
            let entry = match entries.next_entry().await {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => {
                    warn!(dir = %root.display(), error = %e, "Cannot read the pod logs directory");
                    summary.failures += 1;
                    break;
                }
            };
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if pod_state(uid_of_log_dir(name)).is_some() {
                continue;
            }
            let dir = entry.path();
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => {
                    debug!(dir = %dir.display(), "Removed log directory of a pod that is gone");
                    summary.log_dirs_removed += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(dir = %dir.display(), error = %e, "Failed to remove pod log directory");
                    summary.failures += 1;
                }
            }
        }
    }
}

/// Upstream `GCPolicy`.
#[derive(Clone, Debug)]
pub(super) struct Policy {
    pub(super) min_age: Duration,
    pub(super) max_per_pod_container: i32,
    pub(super) max_containers: i32,
}
