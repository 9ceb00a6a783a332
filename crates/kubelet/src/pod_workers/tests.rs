//! Unit tests of the pod workers on paused time, with a fake syncer.
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Records calls; each sync takes 100ms of (paused) time.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, String)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    fail: Mutex<bool>,
    /// Syncs take this long instead of 100ms.
    slow_sync: Mutex<Option<Duration>>,
    /// Kills take the pod's grace period, as a stop that waits it out.
    kill_waits_grace: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl PodSyncer for Recorder {
    async fn sync_pod(&self, p: &Arc<Pod>) -> SyncOutcome {
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(n, Ordering::SeqCst);
        let took = self.slow_sync.lock().unwrap_or(Duration::from_millis(100));
        tokio::time::sleep(took).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let image = pod::containers(p)[0].image.clone().unwrap_or_default();
        self.calls.lock().push(("sync".into(), image));
        SyncOutcome {
            error: self.fail.lock().then(|| Error::Sync(vec![])),
            requeue_after: None,
        }
    }
    async fn kill_pod(&self, p: &Arc<Pod>, remove: bool) -> Result<(), Error> {
        let took = if self.kill_waits_grace.load(Ordering::SeqCst) {
            pod::grace_period(p)
        } else {
            Duration::from_millis(100)
        };
        tokio::time::sleep(took).await;
        self.calls.lock().push(("kill".into(), remove.to_string()));
        Ok(())
    }
}

fn pod(image: &str) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .expect("pod"),
    )
}

fn sync(image: &str) -> PodWork {
    PodWork {
        kind: WorkKind::Sync,
        pod: pod(image),
    }
}

async fn settle() {
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn completed_work_is_observed_by_operation_type() {
    let rec = Arc::new(Recorder::default());
    let metrics = Arc::new(KubeletMetrics::new());
    let w = AsyncPodWorkers::new(
        rec.clone(),
        Arc::new(WorkQueue::default()),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    )
    .with_metrics(metrics.clone());
    for work in [sync("v0"), sync("v1"), kill(&pod("v1"), None)] {
        w.update_pod(work);
        settle().await;
    }
    let f = kubelet_metrics::parse::parse(&metrics.render()).expect("parses");
    let count = |op: &str| {
        f["kubelet_pod_worker_duration_seconds"]
            .samples
            .iter()
            .find(|s| s.name.ends_with("_count") && s.label("operation_type") == Some(op))
            .map(|s| s.value)
    };
    assert_eq!(count("create"), Some(1.0));
    assert_eq!(count("sync"), Some(1.0));
    assert_eq!(count("kill"), Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn updates_coalesce_latest_wins_one_at_a_time() {
    let rec = Arc::new(Recorder::default());
    let q = Arc::new(WorkQueue::default());
    let w = AsyncPodWorkers::new(
        rec.clone(),
        q.clone(),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    w.update_pod(sync("v0"));
    tokio::time::sleep(Duration::from_millis(10)).await; // v0 is now being synced
    for i in 1..=50 {
        w.update_pod(sync(&format!("v{i}")));
    }
    settle().await;
    let calls = rec.calls.lock().clone();
    assert_eq!(
        calls,
        vec![("sync".into(), "v0".into()), ("sync".into(), "v50".into())]
    );
    assert_eq!(rec.max_in_flight.load(Ordering::SeqCst), 1);
    assert_eq!(q.len(), 1, "requeued for resync");
}

#[tokio::test(start_paused = true)]
async fn a_pending_kill_is_never_overwritten_by_a_sync() {
    let rec = Arc::new(Recorder::default());
    let q = Arc::new(WorkQueue::default());
    let w = AsyncPodWorkers::new(
        rec.clone(),
        q.clone(),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    w.update_pod(sync("v0"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    w.update_pod(PodWork {
        kind: WorkKind::Kill { remove: true },
        pod: pod("v0"),
    });
    w.update_pod(sync("v1"));
    settle().await;
    let calls = rec.calls.lock().clone();
    // Issue 7 fix 4.10: the kill cuts the in-flight sync of v0 short (as
    // upstream cancels the sync context), and the later sync of v1 never
    // replaces the pending kill.
    assert_eq!(calls, vec![("kill".into(), "true".into())]);
    assert!(w.is_removed("u1"));
    assert_eq!(q.len(), 0);
    w.forget("u1");
    assert!(!w.has_worker("u1"));
}

#[tokio::test(start_paused = true)]
async fn failed_syncs_retry_after_backoff_and_resync_has_jitter() {
    let rec = Arc::new(Recorder::default());
    *rec.fail.lock() = true;
    let q = Arc::new(WorkQueue::default());
    let w = AsyncPodWorkers::new(
        rec.clone(),
        q.clone(),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    w.update_pod(sync("v0"));
    settle().await;
    assert!(q.take_due().is_empty());
    tokio::time::advance(ERROR_BACKOFF).await;
    assert_eq!(q.take_due(), vec!["u1".to_string()]);
    *rec.fail.lock() = false;
    w.update_pod(sync("v0"));
    // The sync ends within `settle`'s 2 s, so at most 59 s have passed
    // since: short of the 60 s interval even with no jitter at all.
    settle().await;
    tokio::time::advance(Duration::from_secs(57)).await;
    assert!(q.take_due().is_empty(), "not before the resync interval");
    // Over 90 s after the sync: past 60 s + 50% jitter however it fell.
    tokio::time::advance(Duration::from_secs(33)).await;
    assert_eq!(
        q.take_due(),
        vec!["u1".to_string()],
        "due within interval + 50% jitter"
    );
}

fn kill(p: &Arc<Pod>, grace_seconds: Option<i64>) -> PodWork {
    let mut p = (**p).clone();
    p.metadata.deletion_grace_period_seconds = grace_seconds;
    PodWork {
        kind: WorkKind::Kill { remove: false },
        pod: Arc::new(p),
    }
}

fn kills_done(rec: &Recorder) -> usize {
    rec.calls.lock().iter().filter(|(k, _)| k == "kill").count()
}

#[tokio::test(start_paused = true)]
async fn a_shorter_grace_period_cuts_a_kill_in_progress_short() {
    let rec = Arc::new(Recorder::default());
    rec.kill_waits_grace.store(true, Ordering::SeqCst);
    let w = AsyncPodWorkers::new(
        rec.clone(),
        Arc::new(WorkQueue::default()),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    let p = pod("busybox");
    w.update_pod(kill(&p, Some(30)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A second delete with a longer grace period changes nothing.
    w.update_pod(kill(&p, Some(60)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(kills_done(&rec), 0);
    // A second delete with 5s restarts the kill with 5s.
    w.update_pod(kill(&p, Some(5)));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(kills_done(&rec), 1, "done after 5s, not 30s");
    // A force delete (grace 0) kills at once (the runtime's minimum).
    w.update_pod(kill(&p, Some(30)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.update_pod(kill(&p, Some(0)));
    tokio::time::sleep(kubelet_types::pod::MIN_GRACE_PERIOD + Duration::from_millis(100)).await;
    assert_eq!(kills_done(&rec), 2);
}

#[tokio::test(start_paused = true)]
async fn a_kill_cuts_a_running_sync_short() {
    let rec = Arc::new(Recorder::default());
    *rec.slow_sync.lock() = Some(Duration::from_secs(600));
    let w = AsyncPodWorkers::new(
        rec.clone(),
        Arc::new(WorkQueue::default()),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    let p = pod("busybox");
    w.update_pod(sync("busybox"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.update_pod(kill(&p, None));
    w.update_pod(sync("busybox"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        kills_done(&rec),
        1,
        "the kill did not wait for the 10-minute sync"
    );
    assert!(
        !rec.calls.lock().iter().any(|(k, _)| k == "sync"),
        "the cut sync never completed, and no sync replaced the pending kill"
    );
}

/// Once a pod is terminating its grace period only decreases, and a
/// removal asked for once sticks (upstream `calculateEffectiveGracePeriod`).
#[tokio::test(start_paused = true)]
async fn merged_kills_keep_the_shortest_grace_and_the_removal() {
    let rec = Arc::new(Recorder::default());
    rec.kill_waits_grace.store(true, Ordering::SeqCst);
    let w = AsyncPodWorkers::new(
        rec.clone(),
        Arc::new(WorkQueue::default()),
        Duration::from_secs(60),
        CancellationToken::new(),
        TaskTracker::new(),
    );
    let p = pod("busybox");
    let mut remove = kill(&p, Some(10));
    remove.kind = WorkKind::Kill { remove: true };
    w.update_pod(remove);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A later delete with a longer grace and no removal: neither sticks.
    w.update_pod(kill(&p, Some(300)));
    // The first kill ends at 10s; the merged one takes 10s more, not 300s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        *rec.calls.lock(),
        vec![
            ("kill".to_string(), "true".to_string()),
            ("kill".to_string(), "true".to_string())
        ],
        "the second kill ran with the removal"
    );
    assert!(w.is_removed("u1"));
    let merged = merge_kill(kill(&p, Some(300)), Some(&kill(&p, Some(5))), None);
    assert_eq!(pod::grace_period(&merged.pod), Duration::from_secs(5));
}
