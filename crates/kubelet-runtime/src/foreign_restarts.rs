//! Containers another kubelet started, restarted because their spec hash
//! differs (issue 21, swapping kubelets in place).
//!
//! Upstream 1.31 changed `HashContainer` (`pkg/kubelet/container/helpers.go`)
//! from the whole container to its name and image, so an upstream kubelet
//! upgraded to 1.31 restarts, once, every container an older one started:
//! "Container X definition changed". kubelet-rs writes the 1.31+ hash and
//! does the same when it takes over from a pre-1.31 kubelet. The event stays
//! upstream's; this module adds an info line with a process-wide count, so an
//! operator swapping kubelets sees why containers restart and how many did.
//!
//! A container counts as started by another kubelet when it carries no
//! kubelet-rs hash version ([`kubelet_types::hash::HASH_VERSION_ANNOTATION`])
//! and was created before this process first decided anything about a pod
//! (every container this process creates comes after that). Each container ID
//! is counted once, however often a sync recomputes its actions before the
//! kill succeeds.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::pod;
use parking_lot::Mutex;
use tracing::info;

use crate::pod_status::ContainerStatus;

/// The log message, for operators and tests to look for.
pub const MESSAGE: &str = "Restarting a container started by another kubelet whose spec hash \
    differs (an upstream kubelet before 1.31 hashes the whole container)";

/// Counts foreign containers restarted for a changed hash, once per ID.
#[derive(Debug)]
pub struct ForeignRestarts {
    /// Containers created before this instant by a kubelet without hash
    /// versions are foreign.
    since: SystemTime,
    count: AtomicU64,
    seen: Mutex<HashSet<String>>,
}

impl ForeignRestarts {
    /// A counter for containers created before `since`.
    pub fn new(since: SystemTime) -> Self {
        Self {
            since,
            count: AtomicU64::new(0),
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `s` was started by another kubelet: no kubelet-rs hash
    /// version, created before this process decided anything.
    pub fn is_foreign(&self, s: &ContainerStatus) -> bool {
        s.hash_version.is_none() && s.created_at < self.since
    }

    /// Records that the foreign container `s` is restarted for its hash;
    /// returns the count so far when this is the first time for its ID,
    /// `None` when it is not foreign or was counted already.
    pub fn record(&self, s: &ContainerStatus) -> Option<u64> {
        if !self.is_foreign(s) || !self.seen.lock().insert(s.id.clone()) {
            return None;
        }
        Some(self.count.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// How many foreign containers were restarted so far.
    pub fn restarted_so_far(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

static PROCESS: LazyLock<ForeignRestarts> =
    LazyLock::new(|| ForeignRestarts::new(SystemTime::now()));

/// Fixes the instant before which containers count as foreign, if not yet
/// fixed (called on every pod decision; the first one wins).
pub(crate) fn start() {
    LazyLock::force(&PROCESS);
}

/// Called when the running container `s` of `p` is restarted because its
/// hash differs: logs [`MESSAGE`] with the running count when another
/// kubelet started it.
pub(crate) fn note_hash_restart(p: &Pod, s: &ContainerStatus) {
    if let Some(n) = PROCESS.record(s) {
        info!(pod = %pod::describe(p), container = %s.name, container.id = %s.id,
            hash = %s.hash, restarted_so_far = n, "{MESSAGE}");
    }
}

/// Whether the container `id` was counted (for tests).
#[cfg(test)]
pub(crate) fn counted(id: &str) -> bool {
    PROCESS.seen.lock().contains(id)
}

/// How many containers started by another kubelet this process restarted
/// because their spec hash differs.
pub fn restarted_so_far() -> u64 {
    PROCESS.restarted_so_far()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status(id: &str, version: Option<&str>, created: SystemTime) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            name: "app".into(),
            hash: "3c42280f".into(),
            hash_version: version.map(Into::into),
            created_at: created,
            ..Default::default()
        }
    }

    #[test]
    fn counts_each_foreign_container_once() {
        let since = SystemTime::now();
        let before = since - Duration::from_secs(60);
        let after = since + Duration::from_secs(1);
        let r = ForeignRestarts::new(since);
        assert_eq!(r.record(&status("a", None, before)), Some(1));
        // A sync that failed to kill recomputes: not counted twice.
        assert_eq!(r.record(&status("a", None, before)), None);
        assert_eq!(r.record(&status("b", None, before)), Some(2));
        // kubelet-rs' own containers (versioned, or created by this process).
        assert_eq!(r.record(&status("c", Some("1"), before)), None);
        assert_eq!(r.record(&status("d", None, after)), None);
        assert_eq!(r.restarted_so_far(), 2);
    }
}
