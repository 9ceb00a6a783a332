//! Volumes found on disk after a restart, and orphaned pod directories (upstream `reconstruct`, `cleanupOrphanedPodDirs`).

use super::*;

#[tokio::test(start_paused = true)]
async fn a_pod_killed_after_a_restart_has_the_volumes_found_on_disk_torn_down() {
    // The pod (deleted while the kubelet was down) is known, so its
    // directory is no orphan; its kill alone must tear the volume down,
    // with nothing but what is on disk (its Secret may be gone).
    let f = fixture(vec![OnDisk {
        uid: "u1".into(),
        plugin: kubelet_volume::plugin::names::SECRET,
        name: "token".into(),
        dir: PathBuf::from("/var/lib/kubelet-test/pods/u1/volumes/kubernetes.io~secret/token"),
    }]);
    settle().await;
    f.vm.pod_terminated("u1", false);
    assert!(f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await);
    assert_eq!(f.ops.calls(), vec!["clean_subpaths u1", "tear_down token"]);
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn subpath_mounts_found_alone_are_cleaned_before_the_directory_goes() {
    let f = fixture(vec![OnDisk {
        uid: "gone".into(),
        plugin: super::ops::SUBPATHS_ONLY,
        name: "data".into(),
        dir: PathBuf::from("/var/lib/kubelet-test/pods/gone/volume-subpaths/data"),
    }]);
    f.ops.busy_subpaths.lock().insert("data".into());
    *f.orphans_ok.lock() = true;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.ops.count("remove_dir"), 0, "{:?}", f.ops.calls());
    f.ops.busy_subpaths.lock().clear();
    tokio::time::sleep(MAX_BACKOFF).await;
    let calls = f.ops.calls();
    assert!(
        !calls.iter().any(|c| c.starts_with("tear_down")),
        "{calls:?}"
    );
    assert_eq!(
        calls.last().map(String::as_str),
        Some("removed_dir gone"),
        "{calls:?}"
    );
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn directories_of_unknown_pods_are_removed_once_allowed() {
    let f = fixture(vec![]);
    *f.ops.dirs.lock() = vec!["gone".into()];
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(f.ops.calls().is_empty(), "{:?}", f.ops.calls());
    *f.orphans_ok.lock() = true;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.ops.calls(), vec!["remove_dir gone", "removed_dir gone"]);
    f.shutdown.cancel();
}

/// A kill racing a slow reconstruction after a restart: the wait for the
/// unmount does not end before the Secret found on disk is torn down.
#[tokio::test(start_paused = true)]
async fn a_kill_before_reconstruction_waits_for_the_volumes_found_on_disk() {
    let f = fixture_with(
        vec![OnDisk {
            uid: "u1".into(),
            plugin: kubelet_volume::plugin::names::SECRET,
            name: "token".into(),
            dir: PathBuf::from("/var/lib/kubelet-test/pods/u1/volumes/kubernetes.io~secret/token"),
        }],
        Duration::from_secs(10),
    );
    f.vm.pod_terminated("u1", false);
    let vm = f.vm.clone();
    let wait =
        tokio::spawn(async move { vm.wait_for_unmount("u1", Duration::from_secs(120)).await });
    tokio::time::advance(Duration::from_secs(5)).await;
    settle().await;
    assert!(!wait.is_finished(), "decided before reconstruction");
    assert!(f.ops.calls().is_empty());
    assert!(wait.await.expect("joined"), "unmounted in time");
    assert_eq!(f.ops.calls(), vec!["clean_subpaths u1", "tear_down token"]);
    f.shutdown.cancel();
}

/// Counts warn-level events.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<usize>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *e.metadata().level() == tracing::Level::WARN {
            *self.0.lock() += 1;
        }
    }
}

/// A pod directory that cannot be removed is retried every pass but is a
/// warning once per reason, not every 2 s forever.
#[tokio::test(start_paused = true)]
async fn a_directory_that_cannot_be_removed_is_one_warning_per_reason() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _log =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let f = fixture(vec![]);
    *f.ops.refuse_remove.lock() = Some("busy".into());
    f.ops.dirs.lock().push("gone".into());
    *f.orphans_ok.lock() = true;
    for _ in 0..5 {
        tokio::time::advance(HOUSEKEEPING_PERIOD_FOR_TESTS).await;
        settle().await;
    }
    assert!(f.ops.count("remove_dir gone") >= 4, "{:?}", f.ops.calls());
    assert_eq!(*warnings.0.lock(), 1, "one warning");
    *f.ops.refuse_remove.lock() = Some("still busy".into());
    for _ in 0..3 {
        tokio::time::advance(HOUSEKEEPING_PERIOD_FOR_TESTS).await;
        settle().await;
    }
    assert_eq!(*warnings.0.lock(), 2, "a new reason is a new warning");
    *f.ops.refuse_remove.lock() = None;
    tokio::time::advance(HOUSEKEEPING_PERIOD_FOR_TESTS).await;
    settle().await;
    assert!(f.ops.dirs.lock().is_empty(), "removed in the end");
    assert_eq!(*warnings.0.lock(), 2);
    f.shutdown.cancel();
}

/// A slow listing of the pod directories holds up no set-up.
#[tokio::test(start_paused = true)]
async fn a_slow_orphan_check_does_not_stall_the_reconciler() {
    let f = fixture(vec![]);
    *f.ops.list_delay.lock() = Duration::from_secs(25);
    tokio::time::advance(HOUSEKEEPING_PERIOD_FOR_TESTS).await;
    settle().await;
    let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
    f.vm.wait_for_attach_and_mount_within(&p, Duration::from_secs(1))
        .await
        .expect("set up while the listing runs");
    f.shutdown.cancel();
}

const HOUSEKEEPING_PERIOD_FOR_TESTS: Duration = Duration::from_secs(2);
