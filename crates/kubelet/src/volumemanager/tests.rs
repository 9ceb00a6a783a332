//! The volume manager against a fake [`VolumeOps`], on paused time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_test_util::RecordingRecorder;
use kubelet_volume::MountedVolume;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ops::OnDisk;
use super::*;

#[derive(Default)]
struct FakeOps {
    /// Volumes whose set-up fails, with the error.
    failing: Mutex<HashSet<String>>,
    calls: Mutex<Vec<String>>,
    on_disk: Mutex<Vec<OnDisk>>,
    /// How long each set-up and tear-down takes.
    delay: Mutex<Duration>,
    /// Volumes whose subPath mounts cannot be cleaned (held busy).
    busy_subpaths: Mutex<HashSet<String>>,
    /// Pod directories on disk.
    dirs: Mutex<Vec<String>>,
    /// How long the reconstruction takes.
    reconstruct_delay: Mutex<Duration>,
    /// How long listing the pod directories takes.
    list_delay: Mutex<Duration>,
    /// Pod directory removals fail with this.
    refuse_remove: Mutex<Option<String>>,
    /// Volumes served as CSI volumes, by the pod's name: their spec name.
    csi: Mutex<std::collections::HashMap<String, String>>,
    /// Volumes whose set-up fails with a CSI error (its text the whole event).
    failing_csi: Mutex<HashSet<String>>,
    /// Each tear-down's plugin and directory.
    torn: Mutex<Vec<(String, PathBuf)>>,
    /// What a failed set-up may have left, by the pod's volume name.
    set_up_dirs: Mutex<std::collections::HashMap<String, PathBuf>>,
    /// The outer deadline of set-ups, when not the default.
    set_up_timeout: Mutex<Option<Duration>>,
}

impl FakeOps {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }
    fn count(&self, prefix: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }
}

#[async_trait::async_trait]
impl VolumeOps for FakeOps {
    async fn set_up(
        &self,
        pod: &Pod,
        volume: &Volume,
        pods_dir: &Path,
    ) -> Result<MountedVolume, kubelet_volume::Error> {
        self.calls.lock().push(format!("set_up {}", volume.name));
        let delay = *self.delay.lock();
        tokio::time::sleep(delay).await;
        if self.failing.lock().contains(&volume.name) {
            return Err(kubelet_volume::Error::Object(
                kubelet_volume::ObjectError::NotFound {
                    resource: "configmaps",
                    name: "missing".into(),
                },
            ));
        }
        if self.failing_csi.lock().contains(&volume.name) {
            return Err(kubelet_volume::Error::Plugin(
                format!(
                    "MountVolume.SetUp failed for volume {:?} : rpc error: code = Internal desc = boom",
                    volume.name
                )
                .into(),
            ));
        }
        if let Some(spec) = self.csi.lock().get(&volume.name) {
            let csi = kubelet_volume::plugin::names::CSI;
            return Ok(MountedVolume {
                name: volume.name.clone(),
                plugin: csi,
                host_path: kubelet_volume::volume_dir(
                    pods_dir,
                    kubelet_types::pod::uid(pod),
                    csi,
                    spec,
                )
                .join("mount"),
                read_only: false,
                refresh: false,
                block: false,
            });
        }
        let plugin = kubelet_volume::plugin_for(volume)?;
        Ok(MountedVolume {
            name: volume.name.clone(),
            plugin,
            host_path: kubelet_volume::volume_dir(
                pods_dir,
                kubelet_types::pod::uid(pod),
                plugin,
                &volume.name,
            ),
            read_only: false,
            refresh: volume.config_map.is_some(),
            block: false,
        })
    }
    fn set_up_timeout(&self, _volume: &Volume) -> Duration {
        self.set_up_timeout
            .lock()
            .unwrap_or(super::ops::OPERATION_TIMEOUT)
    }
    fn set_up_dir(&self, _uid: &str, name: &str) -> Option<PathBuf> {
        self.set_up_dirs.lock().get(name).cloned()
    }
    async fn tear_down(&self, plugin: &str, dir: &Path) -> Result<(), kubelet_volume::Error> {
        self.torn
            .lock()
            .push((plugin.to_string(), dir.to_path_buf()));
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.calls.lock().push(format!("tear_down {name}"));
        let delay = *self.delay.lock();
        tokio::time::sleep(delay).await;
        Ok(())
    }
    async fn clean_subpaths(
        &self,
        _: &Path,
        uid: &str,
        volume: &str,
    ) -> Result<(), kubelet_volume::Error> {
        self.calls.lock().push(format!("clean_subpaths {uid}"));
        if self.busy_subpaths.lock().contains(volume) {
            return Err(kubelet_volume::Error::Invalid(
                "device or resource busy".into(),
            ));
        }
        Ok(())
    }
    async fn list_pod_dirs(&self, _: &Path) -> Result<Vec<String>, kubelet_volume::Error> {
        let delay = *self.list_delay.lock();
        tokio::time::sleep(delay).await;
        Ok(self.dirs.lock().clone())
    }
    async fn reconstruct(&self, _: &Path) -> Vec<OnDisk> {
        let delay = *self.reconstruct_delay.lock();
        tokio::time::sleep(delay).await;
        self.on_disk.lock().clone()
    }
    async fn remove_pod_dir(&self, dir: &Path) -> Result<(), kubelet_volume::Error> {
        let uid = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.calls.lock().push(format!("remove_dir {uid}"));
        let delay = *self.delay.lock();
        tokio::time::sleep(delay).await;
        if let Some(e) = self.refuse_remove.lock().clone() {
            return Err(kubelet_volume::Error::Invalid(e));
        }
        self.calls.lock().push(format!("removed_dir {uid}"));
        self.dirs.lock().retain(|d| *d != uid);
        Ok(())
    }
}

struct Fixture {
    vm: VolumeManager,
    ops: Arc<FakeOps>,
    events: Arc<RecordingRecorder>,
    orphans_ok: Arc<Mutex<bool>>,
    shutdown: CancellationToken,
}

fn fixture(on_disk: Vec<OnDisk>) -> Fixture {
    fixture_with(on_disk, Duration::ZERO)
}

fn fixture_with(on_disk: Vec<OnDisk>, reconstruct_delay: Duration) -> Fixture {
    let ops = Arc::new(FakeOps::default());
    *ops.on_disk.lock() = on_disk;
    *ops.reconstruct_delay.lock() = reconstruct_delay;
    let events = Arc::new(RecordingRecorder::default());
    let orphans_ok = Arc::new(Mutex::new(false));
    let ok = orphans_ok.clone();
    let shutdown = CancellationToken::new();
    let vm = VolumeManager::new(
        ops.clone(),
        Path::new("/var/lib/kubelet-test"),
        events.clone(),
        TaskTracker::new(),
        shutdown.clone(),
        Box::new(move |_| *ok.lock()),
    );
    tokio::spawn(vm.clone().run());
    Fixture {
        vm,
        ops,
        events,
        orphans_ok,
        shutdown,
    }
}

fn pod(uid: &str, volumes: serde_json::Value) -> Arc<Pod> {
    let mounts: Vec<serde_json::Value> = volumes
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| serde_json::json!({"name": v["name"], "mountPath": format!("/m/{}", v["name"].as_str().unwrap_or(""))}))
        .collect();
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "busybox", "volumeMounts": mounts}],
                     "volumes": volumes}
        }))
        .expect("pod"),
    )
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
}

#[tokio::test(start_paused = true)]
async fn waits_until_every_mounted_volume_is_set_up() {
    let f = fixture(vec![]);
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}]),
    );
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    let mounted = f.vm.get_mounted_volumes_for_pod("u1");
    assert_eq!(mounted.len(), 2);
    assert_eq!(
        mounted["data"].host_path,
        PathBuf::from("/var/lib/kubelet-test/pods/u1/volumes/kubernetes.io~empty-dir/data")
    );
    // A second sync of the pod rewrites only the content volume.
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    settle().await;
    assert_eq!(f.ops.count("set_up data"), 1);
    assert_eq!(f.ops.count("set_up cfg"), 2);
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_volume_no_container_mounts_is_not_set_up() {
    let f = fixture(vec![]);
    let mut p = (*pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]))).clone();
    p.spec.as_mut().expect("spec").containers[0].volume_mounts = None;
    f.vm.wait_for_attach_and_mount(&Arc::new(p))
        .await
        .expect("nothing to wait for");
    settle().await;
    assert!(f.ops.calls().is_empty(), "{:?}", f.ops.calls());
}

#[tokio::test(start_paused = true)]
async fn a_failed_set_up_is_a_failed_mount_event_retried_with_backoff() {
    let f = fixture(vec![]);
    f.ops.failing.lock().insert("cfg".into());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "cfg", "configMap": {"name": "missing"}}]),
    );
    let vm = f.vm.clone();
    let p2 = p.clone();
    let wait = tokio::spawn(async move { vm.wait_for_attach_and_mount(&p2).await });
    tokio::time::sleep(Duration::from_secs(4)).await;
    // 0, 0.5, 1.5, 3.5 s: four attempts, each an event.
    assert_eq!(f.ops.count("set_up cfg"), 4, "{:?}", f.ops.calls());
    let events = f.events.events.lock().clone();
    assert_eq!(events.len(), 4);
    assert_eq!(
        events[0],
        (
            "FailedMount".to_string(),
            "MountVolume.SetUp failed for volume \"cfg\" : configmaps \"missing\" not found"
                .to_string()
        )
    );
    // The object appears: the change notification retries at once.
    f.ops.failing.lock().clear();
    f.vm.objects_changed("ns");
    wait.await
        .expect("join")
        .expect("mounted after the object appeared");
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_wait_gives_up_after_two_minutes_with_upstreams_message() {
    let f = fixture(vec![]);
    f.ops.failing.lock().insert("cfg".into());
    let p = pod(
        "u1",
        serde_json::json!([{"name": "cfg", "configMap": {"name": "missing"}}]),
    );
    let err =
        f.vm.wait_for_attach_and_mount(&p)
            .await
            .expect_err("times out");
    assert!(err.is_timeout());
    assert_eq!(
        err.to_string(),
        "unmounted volumes=[cfg], unattached volumes=[], failed to process volumes=[]: context deadline exceeded"
    );
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_unsupported_volume_fails_the_wait_at_once_naming_its_type() {
    let f = fixture(vec![]);
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "emptyDir": {}}, {"name": "share", "nfs": {"server": "nfs.example.com", "path": "/"}}]),
    );
    let err =
        f.vm.wait_for_attach_and_mount(&p)
            .await
            .expect_err("unsupported");
    assert!(!err.is_timeout());
    let msg = err.to_string();
    assert!(msg.contains("failed to process volumes=[share]"), "{msg}");
    assert!(msg.contains("of type nfs"), "{msg}");
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_terminated_pod_has_its_volumes_torn_down_and_its_directory_removed() {
    let f = fixture(vec![]);
    let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    f.vm.pod_terminated("u1", true);
    assert!(f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await);
    settle().await;
    assert_eq!(
        f.ops.calls(),
        vec![
            "set_up data",
            "clean_subpaths u1",
            "tear_down data",
            "remove_dir u1",
            "removed_dir u1"
        ]
    );
    assert!(f.vm.get_mounted_volumes_for_pod("u1").is_empty());
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn volumes_found_after_a_restart_are_adopted_or_cleaned_once_allowed() {
    let disk = |uid: &str, name: &str| OnDisk {
        uid: uid.into(),
        plugin: kubelet_volume::plugin::names::EMPTY_DIR,
        name: name.into(),
        dir: PathBuf::from(format!(
            "/var/lib/kubelet-test/pods/{uid}/volumes/kubernetes.io~empty-dir/{name}"
        )),
    };
    let f = fixture(vec![disk("back", "data"), disk("gone", "data")]);
    settle().await;
    assert!(
        f.ops.calls().is_empty(),
        "nothing is removed before the sources are ready"
    );
    // The pod that comes back gets its volume set up again (in place), never torn down.
    let p = pod(
        "back",
        serde_json::json!([{"name": "data", "emptyDir": {}}]),
    );
    f.vm.wait_for_attach_and_mount(&p).await.expect("adopted");
    *f.orphans_ok.lock() = true;
    settle().await;
    let calls = f.ops.calls();
    assert_eq!(
        calls,
        vec![
            "set_up data",
            "clean_subpaths gone",
            "tear_down data",
            "remove_dir gone",
            "removed_dir gone"
        ],
        "only the orphan is torn down"
    );
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_directory_found_on_disk_under_another_name_is_kept_while_the_pod_runs() {
    // A local PV's directory is named after the PV, not the pod's volume.
    let f = fixture(vec![OnDisk {
        uid: "u1".into(),
        plugin: kubelet_volume::plugin::names::LOCAL_VOLUME,
        name: "pv-1".into(),
        dir: PathBuf::from("/var/lib/kubelet-test/pods/u1/volumes/kubernetes.io~local-volume/pv-1"),
    }]);
    let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    settle().await;
    assert_eq!(
        f.ops.calls(),
        vec!["set_up data"],
        "nothing torn down under a running pod"
    );
    f.vm.pod_terminated("u1", true);
    assert!(f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await);
    settle().await;
    let calls = f.ops.calls();
    assert!(calls.contains(&"tear_down pv-1".to_string()), "{calls:?}");
    assert!(calls.contains(&"tear_down data".to_string()), "{calls:?}");
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_change_during_a_set_up_is_written_after_it() {
    let f = fixture(vec![]);
    let p = pod(
        "u1",
        serde_json::json!([{"name": "cfg", "configMap": {"name": "c"}}]),
    );
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    *f.ops.delay.lock() = Duration::from_secs(1);
    f.vm.objects_changed("ns");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(f.ops.count("set_up cfg"), 2, "the rewrite runs");
    // A second change while that rewrite may have read the old object.
    f.vm.objects_changed("ns");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        f.ops.count("set_up cfg"),
        3,
        "written again after the running one"
    );
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pod_back_with_the_same_uid_waits_for_the_teardown_and_is_set_up_anew() {
    let f = fixture(vec![]);
    let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    *f.ops.delay.lock() = Duration::from_secs(1);
    f.vm.pod_terminated("u1", true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(f.ops.count("tear_down data"), 1, "the teardown is running");
    // The same UID comes back before it is done: the wait covers the
    // teardown and a fresh set-up (the pod's directory stays, it is wanted).
    f.vm.wait_for_attach_and_mount(&p)
        .await
        .expect("mounted again");
    let calls = f.ops.calls();
    assert_eq!(
        calls,
        vec![
            "set_up data",
            "clean_subpaths u1",
            "tear_down data",
            "set_up data"
        ],
        "set up again only after the old volume is gone"
    );
    assert_eq!(f.vm.get_mounted_volumes_for_pod("u1").len(), 1);
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn nothing_is_set_up_under_a_pod_directory_being_removed() {
    let f = fixture(vec![]);
    let p = pod("u1", serde_json::json!([{"name": "data", "emptyDir": {}}]));
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    f.vm.pod_terminated("u1", true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    *f.ops.delay.lock() = Duration::from_secs(1);
    // Make the removal slow, then bring the UID back while it runs.
    f.vm.pod_terminated("u1", true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = f.ops.calls();
    f.vm.wait_for_attach_and_mount(&p)
        .await
        .expect("mounted again");
    let calls = f.ops.calls();
    let removed = calls.iter().rposition(|c| c.starts_with("removed_dir"));
    let set_up = calls.iter().rposition(|c| c == "set_up data");
    assert!(
        removed < set_up,
        "set up after the removal finished: {calls:?} (before: {before:?})"
    );
    f.shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_volume_whose_subpaths_cannot_be_cleaned_stays_set_up_and_is_retried() {
    let f = fixture(vec![]);
    let p = pod(
        "u1",
        serde_json::json!([{"name": "data", "hostPath": {"path": "/srv/data"}}]),
    );
    f.vm.wait_for_attach_and_mount(&p).await.expect("mounted");
    f.ops.busy_subpaths.lock().insert("data".into());
    f.vm.pod_terminated("u1", true);
    assert!(
        !f.vm.wait_for_unmount("u1", Duration::from_secs(5)).await,
        "still mounted while its subPath mounts are"
    );
    assert!(f.ops.count("clean_subpaths u1") >= 3, "{:?}", f.ops.calls());
    assert_eq!(f.ops.count("remove_dir"), 0, "the pod directory stays");
    assert_eq!(f.vm.get_mounted_volumes_for_pod("u1").len(), 1);
    // Released: the next retry (the backoff is at most 2m2s) tears it
    // down, and the directory goes.
    f.ops.busy_subpaths.lock().clear();
    assert!(f.vm.wait_for_unmount("u1", MAX_BACKOFF).await);
    settle().await;
    assert_eq!(f.ops.count("removed_dir u1"), 1, "{:?}", f.ops.calls());
    f.shutdown.cancel();
}

#[cfg(test)]
mod csi;
mod csi_volumes;
mod quiet;
mod restart;
