//! Gives the heap that departed pods freed back to the OS. glibc's malloc
//! keeps freed memory in its arenas, so after pods come and go the
//! kubelet's RSS stays near the busiest moment's (a churn of 50-pod
//! waves: 73 MiB resident with 15 MiB of it in use, until `malloc_trim`).
//! Upstream's Go runtime returns idle heap with its background scavenger;
//! here `malloc_trim(0)` runs on the blocking pool once pods have left and
//! the node has been quiet for a check interval (at the latest after
//! [`MAX_PENDING`] of steady churn). A tick where no pod left does nothing.
//! Imports no other `app` module.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::pod_manager::PodManager;

/// How often the count of removed pods is read.
pub(super) const CHECK: Duration = Duration::from_secs(30);
/// The longest a trim waits for the removals to stop.
pub(super) const MAX_PENDING: Duration = Duration::from_secs(300);

/// Trims once removals have settled; `trim` is [`malloc_trim`] outside tests.
pub(super) async fn trim_after_pods_leave(
    pods: PodManager,
    trim: impl Fn() + Clone + Send + 'static,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seen = pods.removed_total();
    let mut pending_since: Option<Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let removed = pods.removed_total();
        let settled = removed == seen;
        if !settled {
            seen = removed;
            pending_since.get_or_insert_with(Instant::now);
        }
        let Some(since) = pending_since else { continue };
        if settled || since.elapsed() >= MAX_PENDING {
            pending_since = None;
            let trim = trim.clone();
            let _ = tokio::task::spawn_blocking(trim).await;
            debug!(removed, "Returned freed heap to the OS");
        }
    }
}

/// glibc's `malloc_trim(0)`: releases free memory at the top of every
/// arena and unused pages inside them. Other C libraries: nothing to do.
#[allow(unsafe_code)] // the workspace's one exception (root Cargo.toml)
pub(super) fn malloc_trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own allocator state, under
    // its arena locks; it takes no pointer from us.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(uid: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        Arc::new(p)
    }

    #[tokio::test(start_paused = true)]
    async fn trims_once_after_pods_leave_and_never_on_quiet_ticks() {
        let pods = PodManager::default();
        for i in 0..3 {
            pods.add_pod(pod(&format!("u{i}")));
        }
        let trims = Arc::new(AtomicUsize::new(0));
        let count = trims.clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(trim_after_pods_leave(
            pods.clone(),
            move || {
                count.fetch_add(1, Ordering::SeqCst);
            },
            stop.clone(),
        ));
        // Quiet: no trim however long (then 10 s off the check ticks).
        tokio::time::sleep(CHECK * 10 + Duration::from_secs(10)).await;
        assert_eq!(trims.load(Ordering::SeqCst), 0);
        // Pods leave: one trim, a check interval after the removals stop.
        pods.remove_pod("u0");
        pods.remove_pod("u1");
        tokio::time::sleep(CHECK + CHECK / 2).await;
        assert_eq!(trims.load(Ordering::SeqCst), 0, "not while pods leave");
        tokio::time::sleep(CHECK).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1);
        tokio::time::sleep(CHECK * 10).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1, "nothing left since");
        // Removing an unknown pod is no removal.
        pods.remove_pod("gone");
        tokio::time::sleep(CHECK * 3).await;
        assert_eq!(trims.load(Ordering::SeqCst), 1);
        stop.cancel();
        task.await.expect("task");
    }

    #[tokio::test(start_paused = true)]
    async fn steady_churn_still_trims_every_max_pending() {
        let pods = PodManager::default();
        let trims = Arc::new(AtomicUsize::new(0));
        let count = trims.clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(trim_after_pods_leave(
            pods.clone(),
            move || {
                count.fetch_add(1, Ordering::SeqCst);
            },
            stop.clone(),
        ));
        // A pod comes and goes every 10 s for 13 minutes.
        for i in 0..78 {
            let uid = format!("c{i}");
            pods.add_pod(pod(&uid));
            tokio::time::sleep(Duration::from_secs(5)).await;
            pods.remove_pod(&uid);
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let n = trims.load(Ordering::SeqCst);
        assert!((2..=3).contains(&n), "{n} trims in 13 minutes of churn");
        stop.cancel();
        task.await.expect("task");
    }

    #[test]
    fn malloc_trim_runs() {
        malloc_trim();
    }
}
