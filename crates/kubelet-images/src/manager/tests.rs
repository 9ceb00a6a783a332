//! The collection policy on paused time, with a fake runtime and recorder.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kubelet_types::events::{EventType, Recorder, node_ref};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::{
    FsStats, ImageGcError, ImageGcManager, ImageGcPolicy, ImageGcRuntime, ImageInfo, reason, run,
};

#[derive(Default)]
struct State {
    images: Vec<ImageInfo>,
    containers: HashSet<String>,
    capacity: u64,
    available: u64,
    removed: Vec<String>,
    fail_remove: HashSet<String>,
    fail_list: bool,
    runtime_sandbox: Option<String>,
}

#[derive(Default)]
struct FakeRuntime(Mutex<State>);

impl FakeRuntime {
    fn with(f: impl FnOnce(&mut State)) -> Arc<Self> {
        let rt = Arc::new(Self::default());
        f(&mut rt.0.lock());
        rt
    }
    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.0.lock());
    }
    fn removed(&self) -> Vec<String> {
        self.0.lock().removed.clone()
    }
    fn present(&self) -> Vec<String> {
        self.0.lock().images.iter().map(|i| i.id.clone()).collect()
    }
}

fn cri_error(op: &'static str) -> ImageGcError {
    ImageGcError::Runtime(cri::CriError::Unavailable {
        op,
        message: "socket gone".into(),
    })
}

#[async_trait::async_trait]
impl ImageGcRuntime for FakeRuntime {
    async fn list_images(&self) -> Result<Vec<ImageInfo>, ImageGcError> {
        let s = self.0.lock();
        if s.fail_list {
            return Err(cri_error("ListImages"));
        }
        Ok(s.images.clone())
    }
    async fn container_images(&self) -> Result<HashSet<String>, ImageGcError> {
        Ok(self.0.lock().containers.clone())
    }
    async fn image_id(&self, reference: &str) -> Result<Option<String>, ImageGcError> {
        let s = self.0.lock();
        Ok(s.images
            .iter()
            .find(|i| i.is_named(reference))
            .map(|i| i.id.clone()))
    }
    async fn runtime_sandbox_image(&self) -> Result<Option<String>, ImageGcError> {
        Ok(self.0.lock().runtime_sandbox.clone())
    }
    async fn remove_image(&self, id: &str) -> Result<(), ImageGcError> {
        let mut s = self.0.lock();
        if s.fail_remove.contains(id) {
            return Err(cri_error("RemoveImage"));
        }
        if let Some(pos) = s.images.iter().position(|i| i.id == id) {
            let img = s.images.remove(pos);
            s.available += img.size;
        }
        s.removed.push(id.to_string());
        Ok(())
    }
    async fn image_fs_stats(&self) -> Result<FsStats, ImageGcError> {
        let s = self.0.lock();
        Ok(FsStats {
            mountpoint: "/var/lib/containerd".into(),
            capacity: s.capacity,
            available: s.available,
            images_used: 0,
        })
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<(EventType, String, String)>>);

impl Recorder for Events {
    fn event(&self, _: &ObjectReference, kind: EventType, reason: &str, message: String) {
        self.0.lock().push((kind, reason.to_string(), message));
    }
}

impl Events {
    fn reasons(&self) -> Vec<String> {
        self.0.lock().iter().map(|e| e.1.clone()).collect()
    }
}

fn image(id: &str, tag: &str, size: u64) -> ImageInfo {
    ImageInfo {
        id: id.into(),
        repo_tags: vec![tag.into()],
        repo_digests: vec![format!("{}@{id}", tag.split(':').next().unwrap_or(tag))],
        size,
        pinned: false,
    }
}

fn policy(high: u8, low: u8, min_age: u64, max_age: u64) -> ImageGcPolicy {
    ImageGcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age: Duration::from_secs(min_age),
        max_age: Duration::from_secs(max_age),
    }
}

fn manager(
    rt: &Arc<FakeRuntime>,
    policy: ImageGcPolicy,
    sandbox: Option<&str>,
) -> (Arc<ImageGcManager>, Arc<Events>) {
    let events = Arc::new(Events::default());
    let m = ImageGcManager::new(
        rt.clone(),
        policy,
        events.clone(),
        node_ref("node-a"),
        sandbox.map(String::from),
    );
    (Arc::new(m), events)
}

const MIN: u64 = 60;

async fn advance(secs: u64) {
    tokio::time::advance(Duration::from_secs(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn below_the_high_threshold_nothing_is_removed() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![image("sha256:a", "r/a:1", 100)];
        (s.capacity, s.available) = (1000, 160); // 84%
    });
    let (m, events) = manager(&rt, policy(85, 80, 0, 0), None);
    advance(10 * MIN).await;
    let out = m.garbage_collect().await.expect("gc");
    assert_eq!(out.usage_percent, 84);
    assert_eq!(out.bytes_to_free, 0);
    assert!(rt.removed().is_empty());
    assert!(events.reasons().is_empty());
}

#[tokio::test(start_paused = true)]
async fn least_recently_used_go_first_and_collection_stops_at_the_low_threshold() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![
            image("sha256:a", "r/a:1", 50),
            image("sha256:b", "r/b:1", 70),
            image("sha256:c", "r/c:1", 60),
        ];
        s.containers = ["sha256:a".to_string()].into();
        (s.capacity, s.available) = (1000, 500);
    });
    let (m, _) = manager(&rt, policy(85, 80, 2 * MIN, 0), None);
    m.garbage_collect().await.expect("a in use");
    advance(10 * MIN).await;
    rt.set(|s| s.containers = ["r/b:1".to_string()].into()); // by tag
    m.garbage_collect().await.expect("b in use");
    advance(10 * MIN).await;
    // No container any more; 90% used: free 1000*20% - 100 = 100 bytes.
    rt.set(|s| {
        s.containers.clear();
        s.available = 100;
    });
    let out = m.garbage_collect().await.expect("gc");
    assert_eq!(out.usage_percent, 90);
    assert_eq!(out.bytes_to_free, 100);
    // c was never used, then a (used before b); 60 + 50 >= 100: b stays.
    assert_eq!(rt.removed(), vec!["sha256:c", "sha256:a"]);
    assert_eq!(out.removed, vec!["sha256:c", "sha256:a"]);
    assert_eq!(out.freed, 110);
    assert_eq!(rt.present(), vec!["sha256:b"]);
}

#[tokio::test(start_paused = true)]
async fn images_younger_than_the_minimum_age_are_kept() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![image("sha256:old", "r/old:1", 10)];
        (s.capacity, s.available) = (1000, 0);
    });
    let (m, events) = manager(&rt, policy(50, 0, 2 * MIN, 0), None);
    m.garbage_collect()
        .await
        .expect_err("nothing old enough yet");
    assert!(rt.removed().is_empty(), "first seen just now");
    advance(2 * MIN).await;
    rt.set(|s| s.images.push(image("sha256:new", "r/new:1", 10)));
    let err = m.garbage_collect().await.expect_err("not enough");
    assert_eq!(rt.removed(), vec!["sha256:old"]);
    assert!(
        matches!(
            err,
            ImageGcError::NotEnoughFreed {
                wanted: 1000,
                freed: 10
            }
        ),
        "{err}"
    );
    assert_eq!(
        events.reasons(),
        vec![
            reason::FREE_DISK_SPACE_FAILED,
            reason::FREE_DISK_SPACE_FAILED
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn in_use_pinned_and_sandbox_images_are_never_removed() {
    let mut pinned = image("sha256:pinned", "r/pinned:1", 10);
    pinned.pinned = true;
    let rt = FakeRuntime::with(|s| {
        s.images = vec![
            image("sha256:used", "r/used:1", 10),
            image("sha256:exited", "r/exited:1", 10),
            pinned,
            image("sha256:pause", "localhost:5000/pause:3.9", 10),
            image("sha256:free", "r/free:1", 10),
        ];
        // A running container by ID, an exited one by digest.
        s.containers = [
            "sha256:used".to_string(),
            "r/exited@sha256:exited".to_string(),
        ]
        .into();
        (s.capacity, s.available) = (100, 0);
    });
    let (m, events) = manager(&rt, policy(1, 0, 0, 0), Some("localhost:5000/pause:3.9"));
    let err = m
        .garbage_collect()
        .await
        .expect_err("cannot free 100 bytes");
    assert_eq!(rt.removed(), vec!["sha256:free"]);
    assert_eq!(
        err.to_string(),
        "Failed to garbage collect required amount of images. Attempted to free 100 bytes, \
         but only found 10 bytes eligible to free."
    );
    let ev = events.0.lock().clone();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].0, EventType::Warning);
    assert_eq!(ev[0].1, "FreeDiskSpaceFailed");
    assert_eq!(ev[0].2, err.to_string());
    // Eviction's reclaim keeps them too.
    assert_eq!(m.delete_unused_images().await.expect("reclaim"), 0);
    assert_eq!(rt.present().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn the_sandbox_image_is_kept_when_named_differently_from_its_tag() {
    // `pause:3.9` resolves (ImageStatus) to the ID of docker.io/library/pause:3.9.
    let rt = FakeRuntime::with(|s| {
        s.images = vec![image("sha256:pause", "docker.io/library/pause:3.9", 10)];
        (s.capacity, s.available) = (100, 0);
    });
    rt.set(|s| s.images[0].repo_tags.push("pause:3.9".into()));
    let (m, _) = manager(&rt, policy(1, 0, 0, 0), Some("pause:3.9"));
    m.garbage_collect().await.expect_err("nothing to free");
    assert!(rt.removed().is_empty());
    // The runtime's own sandbox image, with no flag.
    let rt = FakeRuntime::with(|s| {
        s.images = vec![image("sha256:pause", "localhost:5000/pause:3.9", 10)];
        s.runtime_sandbox = Some("localhost:5000/pause:3.9".into());
        (s.capacity, s.available) = (100, 0);
    });
    let (m, _) = manager(&rt, policy(1, 0, 0, 0), None);
    m.garbage_collect().await.expect_err("nothing to free");
    assert!(rt.removed().is_empty());
    // And by ID alone.
    let rt = FakeRuntime::with(|s| {
        s.images = vec![image("sha256:pause", "docker.io/library/pause:3.9", 10)];
        (s.capacity, s.available) = (100, 0);
    });
    let (m, _) = manager(&rt, policy(1, 0, 0, 0), Some("sha256:pause"));
    m.garbage_collect().await.expect_err("nothing to free");
    assert!(rt.removed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn maximum_age_removes_images_unused_that_long_whatever_the_usage() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![
            image("sha256:stale", "r/stale:1", 10),
            image("sha256:recent", "r/recent:1", 10),
        ];
        s.containers = ["sha256:recent".to_string()].into();
        (s.capacity, s.available) = (1000, 900); // 10%: below any threshold
    });
    let (m, _) = manager(&rt, policy(85, 80, 2 * MIN, 60 * MIN), None);
    m.garbage_collect().await.expect("gc");
    advance(50 * MIN).await;
    m.garbage_collect().await.expect("gc"); // recent last used at 50 min
    rt.set(|s| s.containers.clear());
    advance(5 * MIN).await;
    let out = m.garbage_collect().await.expect("gc");
    assert!(out.removed.is_empty(), "the kubelet has not run 1h yet");
    advance(10 * MIN).await; // 65 min: stale unused 65 min, recent 15 min
    let out = m.garbage_collect().await.expect("gc");
    assert_eq!(out.removed, vec!["sha256:stale"]);
    assert_eq!(out.usage_percent, 9);
    assert_eq!(rt.present(), vec!["sha256:recent"]);
    advance(50 * MIN).await; // recent unused 65 min
    let out = m.garbage_collect().await.expect("gc");
    assert_eq!(out.removed, vec!["sha256:recent"]);
}

#[tokio::test(start_paused = true)]
async fn delete_unused_images_ignores_the_thresholds_but_not_the_minimum_age() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![
            image("sha256:a", "r/a:1", 30),
            image("sha256:b", "r/b:1", 40),
            image("sha256:c", "r/c:1", 50),
        ];
        s.containers = ["sha256:c".to_string()].into();
        (s.capacity, s.available) = (1000, 990);
    });
    let (m, _) = manager(&rt, policy(85, 80, 2 * MIN, 0), None);
    assert_eq!(
        m.delete_unused_images().await.expect("reclaim"),
        0,
        "too young"
    );
    advance(3 * MIN).await;
    assert_eq!(m.delete_unused_images().await.expect("reclaim"), 70);
    assert_eq!(rt.present(), vec!["sha256:c"]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_removal_does_not_stop_the_others() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![
            image("sha256:a", "r/a:1", 30),
            image("sha256:b", "r/b:1", 40),
        ];
        s.fail_remove = ["sha256:a".to_string()].into();
        (s.capacity, s.available) = (100, 0);
    });
    let (m, _) = manager(&rt, policy(50, 0, 0, 0), None);
    let err = m.garbage_collect().await.expect_err("a failed");
    assert_eq!(rt.removed(), vec!["sha256:b"]);
    let text = err.to_string();
    assert!(
        text.starts_with("wanted to free 100 bytes, but freed 40 bytes space with errors in image deletion: RemoveImage"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn zero_capacity_is_an_invalid_disk_capacity_event() {
    let rt = FakeRuntime::with(|s| s.images = vec![image("sha256:a", "r/a:1", 30)]);
    let (m, events) = manager(&rt, policy(50, 0, 0, 0), None);
    let err = m.garbage_collect().await.expect_err("capacity 0");
    assert_eq!(err.to_string(), "invalid capacity 0 on image filesystem");
    assert_eq!(events.reasons(), vec![reason::INVALID_DISK_CAPACITY]);
    assert!(rt.removed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_loop_collects_at_start_and_every_period_and_reports_repeated_failures() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![image("sha256:a", "r/a:1", 30)];
        s.fail_list = true;
        (s.capacity, s.available) = (100, 0);
    });
    let (m, events) = manager(&rt, policy(50, 0, 0, 0), None);
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(
        m,
        crate::GC_PERIOD,
        events.clone(),
        node_ref("node-a"),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        events.reasons().is_empty(),
        "a first failure is only logged"
    );
    tokio::time::sleep(Duration::from_secs(5 * MIN)).await;
    assert_eq!(events.reasons(), vec![reason::IMAGE_GC_FAILED]);
    let message = events.0.lock()[0].2.clone();
    assert!(message.contains("ListImages"), "{message}");
    rt.set(|s| s.fail_list = false);
    tokio::time::sleep(Duration::from_secs(5 * MIN)).await;
    assert_eq!(
        rt.removed(),
        vec!["sha256:a"],
        "collected on the next period"
    );
    stop.cancel();
    task.await.expect("loop ends on stop");
}

/// Each removed image is reported with its reason, for upstream's
/// `kubelet_image_garbage_collected_total{reason}`.
#[tokio::test(start_paused = true)]
async fn removals_are_reported_with_their_reason() {
    let rt = FakeRuntime::with(|s| {
        s.images = vec![
            image("sha256:old", "r/old:1", 10),
            image("sha256:big", "r/big:1", 300),
        ];
        (s.capacity, s.available) = (1000, 900);
    });
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let hook: crate::RemovedHook = {
        let seen = seen.clone();
        Arc::new(move |reason| seen.lock().push(reason))
    };
    let m = ImageGcManager::new(
        rt.clone(),
        policy(85, 80, 0, 60 * MIN),
        Arc::new(Events::default()),
        node_ref("node-a"),
        None,
    )
    .with_removed_hook(hook);
    rt.set(|s| s.containers = ["sha256:big".to_string()].into());
    m.garbage_collect().await.expect("gc");
    advance(55 * MIN).await;
    m.garbage_collect().await.expect("gc"); // big last used at 55 min
    assert!(seen.lock().is_empty());
    // At 61 min: old unused since the start goes by age; big, unused for 6
    // min, goes for space (90% used).
    rt.set(|s| {
        s.containers.clear();
        s.available = 100;
    });
    advance(6 * MIN).await;
    m.garbage_collect().await.expect("gc");
    let got = seen.lock().clone();
    assert!(got.contains(&"age"), "{got:?}");
    assert!(got.contains(&"space"), "{got:?}");
}
