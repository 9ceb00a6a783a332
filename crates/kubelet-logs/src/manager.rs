//! Upstream `containerLogManager`: `Start` (the monitoring loop and its
//! workers), `rotateLogs` (queue the running containers), `processContainer`
//! (stat the log, rotate when it is too big) and `rotateLatestLog` (reopen,
//! or rename back).
//!
//! Each pass lists the running containers and starts a rotation check for
//! each one not already being checked; at most `max_workers` checks run at
//! once (upstream's work queue with `maxWorkers` goroutines, which never
//! hands one key to two workers).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cri::CriError;
use jiff::Timestamp;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::files::{self, TIMESTAMP_FORMAT};
use crate::{LogRotatePolicy, LogRuntime, LogsError};

/// Counts of what the manager did, for metrics.
#[derive(Debug, Default)]
pub struct RotationStats {
    rotations: AtomicU64,
    failures: AtomicU64,
    removed: AtomicU64,
}

impl RotationStats {
    /// Logs rotated (renamed and reopened).
    pub fn rotations(&self) -> u64 {
        self.rotations.load(Ordering::Relaxed)
    }

    /// Rotations that failed (the file work or the reopen), not counting
    /// containers that went away meanwhile.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Rotated files removed (beyond the limit, or leftovers).
    pub fn removed_files(&self) -> u64 {
        self.removed.load(Ordering::Relaxed)
    }
}

type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Rotates the logs of running containers.
pub struct ContainerLogManager {
    runtime: Arc<dyn LogRuntime>,
    policy: LogRotatePolicy,
    call_timeout: Duration,
    clock: Clock,
    stats: Arc<RotationStats>,
}

/// The container stopped or was removed: not worth more than a debug log.
fn gone(e: &CriError) -> bool {
    e.is_not_found() || e.message().contains("not running")
}

impl ContainerLogManager {
    /// A manager over `runtime`; each runtime call is cut after
    /// `call_timeout`.
    pub fn new(
        runtime: Arc<dyn LogRuntime>,
        policy: LogRotatePolicy,
        call_timeout: Duration,
    ) -> Self {
        Self {
            runtime,
            policy,
            call_timeout,
            clock: Arc::new(Timestamp::now),
            stats: Arc::default(),
        }
    }

    /// Names rotated files from `clock` instead of the wall clock.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// What it did so far.
    pub fn stats(&self) -> Arc<RotationStats> {
        self.stats.clone()
    }

    async fn deadline<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, CriError>>,
    ) -> Result<T, CriError> {
        tokio::time::timeout(self.call_timeout, fut)
            .await
            .unwrap_or(Err(CriError::Timeout {
                op,
                timeout: self.call_timeout,
            }))
    }

    /// Upstream `Start`: a pass every `monitor_interval` (the first at
    /// once) until `stop`; checks still running then are cut.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        info!(
            workers = self.policy.max_workers,
            monitor_period = ?self.policy.monitor_interval,
            max_size = self.policy.max_size,
            max_files = self.policy.max_files,
            "Initializing container log rotate workers"
        );
        let workers = Arc::new(Semaphore::new(self.policy.max_workers.max(1)));
        let mut checks: JoinSet<()> = JoinSet::new();
        let mut in_flight: HashMap<tokio::task::Id, String> = HashMap::new();
        let mut tick = tokio::time::interval(self.policy.monitor_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                Some(done) = checks.join_next_with_id() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => {
                            warn!(error = %e, "Container log rotation check ended abnormally");
                            e.id()
                        }
                    };
                    in_flight.remove(&id);
                }
                _ = tick.tick() => {
                    let busy: HashSet<String> = in_flight.values().cloned().collect();
                    for id in self.containers_to_check(&busy).await {
                        let me = self.clone();
                        let workers = workers.clone();
                        let cid = id.clone();
                        let task = checks.spawn(async move {
                            // Closed never: the semaphore lives as long as the loop.
                            let Ok(_permit) = workers.acquire_owned().await else { return };
                            me.process_container(&cid).await;
                        });
                        in_flight.insert(task.id(), id);
                    }
                }
            }
        }
        checks.shutdown().await;
        debug!("Container log rotation stopped");
    }

    /// Upstream `rotateLogs`: the running containers not being checked now.
    async fn containers_to_check(&self, busy: &HashSet<String>) -> Vec<String> {
        trace!("Starting container log rotation sequence");
        match self
            .deadline("ListContainers", self.runtime.running_containers())
            .await
        {
            Ok(ids) => ids.into_iter().filter(|id| !busy.contains(id)).collect(),
            Err(e) => {
                warn!(error = %e, "Failed to rotate container logs: failed to list containers");
                Vec::new()
            }
        }
    }

    /// One pass over the running containers, each checked before it
    /// returns, at most `max_workers` at once (what `run` does every
    /// interval).
    pub async fn rotate_logs(self: &Arc<Self>) {
        let workers = Arc::new(Semaphore::new(self.policy.max_workers.max(1)));
        let mut checks = JoinSet::new();
        for id in self.containers_to_check(&HashSet::new()).await {
            let me = self.clone();
            let workers = workers.clone();
            checks.spawn(async move {
                let Ok(_permit) = workers.acquire_owned().await else {
                    return;
                };
                me.process_container(&id).await;
            });
        }
        while checks.join_next().await.is_some() {}
    }

    /// Upstream `processContainer`: the log's size, and a rotation when it
    /// reached the limit.
    pub async fn process_container(&self, id: &str) {
        let path = match self
            .deadline("ContainerStatus", self.runtime.log_path(id))
            .await
        {
            Ok(p) if !p.is_empty() => PathBuf::from(p),
            Ok(_) => {
                debug!(container = id, "Container has no log path");
                return;
            }
            Err(e) if gone(&e) => {
                debug!(container = id, error = %e, "Container gone before its log rotation");
                return;
            }
            Err(e) => {
                warn!(container = id, error = %e, "Failed to get container status");
                return;
            }
        };
        let size = match tokio::fs::metadata(&path).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A rotation cut between rename and reopen (a kubelet
                // restart): have the runtime create the file again.
                if let Err(e) = self
                    .deadline("ReopenContainerLog", self.runtime.reopen_container_log(id))
                    .await
                {
                    if gone(&e) {
                        debug!(container = id, error = %e, "Container gone before its log rotation");
                    } else {
                        warn!(container = id, path = %path.display(), error = %e,
                            "Container log doesn't exist, reopen container log failed");
                    }
                    return;
                }
                match tokio::fs::metadata(&path).await {
                    Ok(m) => m.len(),
                    Err(e) => {
                        warn!(container = id, path = %path.display(), error = %e,
                            "Failed to stat container log after reopen");
                        return;
                    }
                }
            }
            Err(e) => {
                warn!(container = id, path = %path.display(), error = %e, "Failed to stat container log");
                return;
            }
        };
        if size < self.policy.max_size {
            trace!(container = id, path = %path.display(), size, max_size = self.policy.max_size,
                "Log file doesn't need to be rotated");
            return;
        }
        if let Err(e) = self.rotate_log(id, &path, size).await {
            match &e {
                LogsError::Runtime(c) if gone(c) => {
                    debug!(container = id, error = %e, "Container gone during its log rotation");
                }
                _ => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    warn!(container = id, path = %path.display(), size,
                        max_size = self.policy.max_size, error = %e,
                        "Failed to rotate log for container");
                }
            }
        }
    }

    /// Upstream `rotateLog` and `rotateLatestLog`.
    async fn rotate_log(&self, id: &str, log: &Path, size: u64) -> Result<(), LogsError> {
        let stamp = (self.clock)().strftime(TIMESTAMP_FORMAT).to_string();
        let keep = self.policy.max_rotated_kept();
        let at = log.to_path_buf();
        let r = tokio::task::spawn_blocking(move || files::rotate(&at, keep, &stamp)).await??;
        let removed = u64::try_from(r.removed_excess + r.removed_unused).unwrap_or(u64::MAX);
        self.stats.removed.fetch_add(removed, Ordering::Relaxed);
        if let Err(e) = self
            .deadline("ReopenContainerLog", self.runtime.reopen_container_log(id))
            .await
        {
            // Put it back so the next pass tries again; lost only if the
            // kubelet stops right here.
            let (at, rotated) = (log.to_path_buf(), r.rotated.clone());
            match tokio::task::spawn_blocking(move || files::undo(&at, &rotated)).await {
                Ok(Ok(())) => {}
                Ok(Err(undo)) if gone(&e) => {
                    debug!(container = id, error = %undo, "Cannot rename a gone container's log back");
                }
                Ok(Err(undo)) => {
                    warn!(container = id, rotated = %r.rotated.display(), log = %log.display(),
                        error = %undo, "Failed to rename rotated log");
                }
                Err(join) => warn!(container = id, error = %join, "Failed to rename rotated log"),
            }
            return Err(e.into());
        }
        self.stats.rotations.fetch_add(1, Ordering::Relaxed);
        info!(
            container = id,
            log = %log.display(),
            size,
            max_size = self.policy.max_size,
            rotated = %r.rotated.display(),
            compressed = r.compressed,
            removed_old = r.removed_excess,
            removed_unused = r.removed_unused,
            files_kept = r.rotated_files + 1,
            max_files = self.policy.max_files,
            "Rotated container log"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests;
