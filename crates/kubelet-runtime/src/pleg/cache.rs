//! The pod status cache the PLEG fills (upstream
//! `pkg/kubelet/container/cache.go`): the latest inspected [`PodStatus`] of
//! each pod with the relist time it reflects, and a global timestamp that
//! says every status is at least that fresh. Pod workers wait on
//! [`PodCache::get_newer_than`] instead of inspecting the pod again.
//!
//! kubelet-rs inspects pods in the background, not inside the relist as
//! upstream does, so a pod whose inspection is still running (or must run
//! again) is *pending*: the global timestamp does not vouch for it until its
//! inspection lands.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Error;
use crate::pod_status::PodStatus;

/// What an inspection left for one pod.
#[derive(Clone, Debug)]
struct Entry {
    result: Result<Arc<PodStatus>, Arc<Error>>,
    /// The relist time the status reflects.
    modified: Instant,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, Entry>,
    /// Pods whose newest changes are not inspected yet.
    pending: HashSet<String>,
    /// Every status not pending is at least this fresh.
    timestamp: Option<Instant>,
}

/// Latest inspected runtime status per pod UID (upstream `kubecontainer.Cache`).
pub struct PodCache {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Default for PodCache {
    fn default() -> Self {
        Self {
            state: Mutex::new(State::default()),
            changed: watch::Sender::new(0),
        }
    }
}

/// A pod the runtime has nothing of: its UID and no sandboxes or containers
/// (upstream `makeDefaultData`).
fn empty(uid: &str) -> Arc<PodStatus> {
    Arc::new(PodStatus {
        uid: uid.to_string(),
        ..Default::default()
    })
}

impl PodCache {
    /// The cached status of a pod, however old.
    pub fn get(&self, uid: &str) -> Option<Arc<PodStatus>> {
        self.state
            .lock()
            .pods
            .get(uid)
            .and_then(|e| e.result.as_ref().ok().cloned())
    }

    /// The global timestamp: every pod not pending is at least this fresh.
    pub fn timestamp(&self) -> Option<Instant> {
        self.state.lock().timestamp
    }

    /// The pod's status once the cache holds one newer than `min_time`
    /// (upstream `GetNewerThan`): a status inspected at a relist after
    /// `min_time`, or, when the global timestamp has passed `min_time` and the
    /// pod is not pending, whatever the cache holds (an empty status for a pod
    /// the runtime does not have). Waits for relists until then.
    ///
    /// # Errors
    /// The error of the pod's last inspection, when it failed.
    pub async fn get_newer_than(
        &self,
        uid: &str,
        min_time: Instant,
    ) -> Result<Arc<PodStatus>, Arc<Error>> {
        let mut changed = self.changed.subscribe();
        loop {
            if let Some(r) = self.get_if_newer_than(uid, min_time) {
                return r;
            }
            // The sender lives as long as the cache, which `self` borrows.
            if changed.changed().await.is_err() {
                return Ok(empty(uid));
            }
        }
    }

    fn get_if_newer_than(
        &self,
        uid: &str,
        min_time: Instant,
    ) -> Option<Result<Arc<PodStatus>, Arc<Error>>> {
        let st = self.state.lock();
        let entry = st.pods.get(uid);
        if entry.is_some_and(|e| e.modified > min_time) {
            return entry.map(|e| e.result.clone());
        }
        let global_newer = st.timestamp.is_some_and(|t| t > min_time);
        if !global_newer || st.pending.contains(uid) {
            return None;
        }
        Some(entry.map_or_else(|| Ok(empty(uid)), |e| e.result.clone()))
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The pod's status as inspected for the relist at `modified`; an older
    /// inspection finishing late never replaces a newer one.
    pub(crate) fn set(&self, uid: &str, result: Result<PodStatus, Error>, modified: Instant) {
        {
            let mut st = self.state.lock();
            if st.pods.get(uid).is_some_and(|e| e.modified > modified) {
                return;
            }
            let result = result.map(Arc::new).map_err(Arc::new);
            st.pods.insert(uid.to_string(), Entry { result, modified });
        }
        self.bump();
    }

    /// The pod changed at a relist and waits for its inspection.
    pub(crate) fn mark_pending(&self, uid: &str) {
        self.state.lock().pending.insert(uid.to_string());
    }

    /// The pod's inspection landed and no newer change waits.
    pub(crate) fn clear_pending(&self, uid: &str) {
        let removed = self.state.lock().pending.remove(uid);
        if removed {
            self.bump();
        }
    }

    /// The pod is gone from the runtime.
    pub(crate) fn remove(&self, uid: &str) {
        {
            let mut st = self.state.lock();
            st.pods.remove(uid);
            st.pending.remove(uid);
        }
        self.bump();
    }

    /// A relist at `t` finished: every pod not pending is at least this fresh
    /// (upstream `UpdateTime`).
    pub(crate) fn update_time(&self, t: Instant) {
        {
            let mut st = self.state.lock();
            if st.timestamp.is_none_or(|old| old < t) {
                st.timestamp = Some(t);
            }
        }
        self.bump();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status(uid: &str, ip: &str) -> PodStatus {
        PodStatus {
            uid: uid.into(),
            ips: vec![ip.into()],
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_a_status_newer_than_asked() {
        let cache = Arc::new(PodCache::default());
        let t0 = Instant::now();
        cache.set("u", Ok(status("u", "a")), t0);
        cache.update_time(t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        let asked = Instant::now();
        let waiter = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get_newer_than("u", asked).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing newer than asked yet");
        // A relist after `asked` sees the pod changed and inspects it.
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        cache.mark_pending("u");
        cache.update_time(t1);
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "pending: the global time does not vouch for it"
        );
        cache.set("u", Ok(status("u", "b")), t1);
        cache.clear_pending("u");
        let got = waiter.await.expect("task").expect("status");
        assert_eq!(got.ips, vec!["b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_global_timestamp_releases_unchanged_and_unknown_pods() {
        let cache = Arc::new(PodCache::default());
        let t0 = Instant::now();
        cache.set("u", Ok(status("u", "a")), t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        let asked = Instant::now();
        let unchanged = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get_newer_than("u", asked).await }
        });
        let unknown = tokio::spawn({
            let cache = cache.clone();
            async move { cache.get_newer_than("gone", asked).await }
        });
        tokio::task::yield_now().await;
        assert!(!unchanged.is_finished() && !unknown.is_finished());
        // A relist after `asked` found no change to either pod.
        tokio::time::advance(Duration::from_secs(1)).await;
        cache.update_time(Instant::now());
        let got = unchanged.await.expect("task").expect("status");
        assert_eq!(got.ips, vec!["a"], "the cached status is still current");
        let got = unknown.await.expect("task").expect("status");
        assert_eq!((got.uid.as_str(), got.containers.len()), ("gone", 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_older_inspection_never_replaces_a_newer_one_and_errors_are_returned() {
        let cache = PodCache::default();
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        cache.set("u", Ok(status("u", "new")), t1);
        cache.set("u", Ok(status("u", "old")), t0);
        assert_eq!(
            cache.get("u").map(|s| s.ips.clone()),
            Some(vec!["new".into()])
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let t2 = Instant::now();
        cache.set("u", Err(Error::NoSandbox), t2);
        let r = cache.get_newer_than("u", t1).await;
        assert!(
            matches!(r.as_ref().map_err(|e| e.as_ref()), Err(Error::NoSandbox)),
            "{r:?}"
        );
    }
}
