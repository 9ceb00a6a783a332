//! The manager on fakes and paused time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kubelet_types::events::{EventType, Recorder};
use parking_lot::Mutex;

use crate::api::{NodeCondition, ThresholdConfig, parse_thresholds};
use crate::stats::{ContainerStats, FsSignal, FsUsage, MemorySignal, NodeStats, PodStats, Summary};
use crate::{
    ActivePods, Config, ContainerGc, Deps, EvictionError, ImageGc, Manager, NoMetrics, PodEvictor,
    ReclaimError, SummaryProvider,
};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

#[derive(Default)]
struct Fakes {
    summary: Mutex<Summary>,
    pods: Mutex<Vec<Arc<Pod>>>,
    evicted: Mutex<Vec<(String, crate::Eviction)>>,
    events: Mutex<Vec<(String, String, String)>>,
    gc_calls: Mutex<Vec<&'static str>>,
    /// Bytes image GC frees on nodefs.
    image_gc_frees: Mutex<u64>,
}

struct F(Arc<Fakes>);

#[async_trait::async_trait]
impl SummaryProvider for F {
    async fn summary(&self) -> Result<Summary, EvictionError> {
        Ok(self.0.summary.lock().clone())
    }
}

#[async_trait::async_trait]
impl ActivePods for F {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        let evicted: Vec<String> = self.0.evicted.lock().iter().map(|e| e.0.clone()).collect();
        self.0
            .pods
            .lock()
            .iter()
            .filter(|p| !evicted.iter().any(|u| u == kubelet_types::pod::uid(p)))
            .cloned()
            .collect()
    }
    async fn cleaned_up(&self, _: &Pod) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl PodEvictor for F {
    async fn evict(&self, p: &Arc<Pod>, e: crate::Eviction) -> Result<(), EvictionError> {
        self.0
            .evicted
            .lock()
            .push((kubelet_types::pod::uid(p).to_string(), e));
        Ok(())
    }
}

impl Recorder for F {
    fn event(&self, o: &ObjectReference, _: EventType, reason: &str, message: String) {
        self.0.events.lock().push((
            o.name.clone().unwrap_or_default(),
            reason.to_string(),
            message,
        ));
    }
}

#[async_trait::async_trait]
impl ImageGc for F {
    async fn delete_unused_images(&self) -> Result<u64, ReclaimError> {
        self.0.gc_calls.lock().push("images");
        let freed = *self.0.image_gc_frees.lock();
        if let Some(fs) = self.0.summary.lock().node.nodefs.as_mut() {
            fs.available_bytes = fs.available_bytes.map(|a| a + freed);
        }
        Ok(freed)
    }
}

#[async_trait::async_trait]
impl ContainerGc for F {
    async fn delete_all_unused_containers(&self) -> Result<(), ReclaimError> {
        self.0.gc_calls.lock().push("containers");
        Ok(())
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

struct Setup {
    hard: BTreeMap<String, String>,
    soft: BTreeMap<String, String>,
    grace: BTreeMap<String, Duration>,
    min_reclaim: BTreeMap<String, String>,
    max_pod_grace: i64,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            hard: map(&[("memory.available", "1Gi"), ("nodefs.available", "10%")]),
            soft: BTreeMap::new(),
            grace: BTreeMap::new(),
            min_reclaim: BTreeMap::new(),
            max_pod_grace: 0,
        }
    }
}

fn manager(s: Setup) -> (Arc<Manager>, Arc<Fakes>) {
    let fakes = Arc::new(Fakes::default());
    let thresholds = parse_thresholds(&ThresholdConfig {
        hard: &s.hard,
        soft: &s.soft,
        soft_grace_period: &s.grace,
        minimum_reclaim: &s.min_reclaim,
        enforce_allocatable_pods: false,
    })
    .expect("thresholds");
    let f = || Arc::new(F(fakes.clone()));
    let m = Manager::new(
        Config {
            thresholds,
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period_seconds: s.max_pod_grace,
            monitoring_interval: Duration::from_secs(10),
            local_storage_capacity_isolation: true,
            node_name: "node-1".into(),
        },
        Deps {
            summary: f(),
            pods: f(),
            evictor: f(),
            images: Some(f()),
            containers: Some(f()),
            recorder: f(),
            metrics: Arc::new(NoMetrics),
        },
        crate::Pressure::channel().0,
    );
    set_node(&fakes, 8 * GI, 100 * GI);
    (Arc::new(m), fakes)
}

/// Memory available and nodefs available (of 200Gi).
fn set_node(f: &Fakes, mem_available: u64, nodefs_available: u64) {
    let mut s = f.summary.lock();
    s.node = NodeStats {
        memory: Some(MemorySignal {
            available_bytes: mem_available,
            working_set_bytes: 16 * GI - mem_available,
            time: Some(std::time::SystemTime::now()),
        }),
        nodefs: Some(FsSignal {
            available_bytes: Some(nodefs_available),
            capacity_bytes: Some(200 * GI),
            inodes_free: Some(1_000_000),
            inodes: Some(2_000_000),
            time: Some(std::time::SystemTime::now()),
        }),
        ..Default::default()
    };
}

fn pod(name: &str, priority: i32, memory_request: Option<&str>) -> Arc<Pod> {
    let resources = memory_request.map_or(
        serde_json::json!({}),
        |r| serde_json::json!({"requests": {"memory": r}, "limits": {"memory": r}}),
    );
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"priority": priority, "terminationGracePeriodSeconds": 60,
                "containers": [{"name": "c", "resources": resources}]}
        }))
        .expect("pod"),
    )
}

fn add_pod(f: &Fakes, p: Arc<Pod>, memory: u64) {
    let uid = kubelet_types::pod::uid(&p).to_string();
    f.pods.lock().push(p);
    f.summary.lock().pods.push(PodStats {
        uid,
        memory_working_set: Some(memory),
        containers: vec![ContainerStats {
            name: "c".into(),
            memory_working_set: Some(memory),
            ..Default::default()
        }],
        ..Default::default()
    });
}

fn evicted(f: &Fakes) -> Vec<String> {
    f.evicted.lock().iter().map(|e| e.0.clone()).collect()
}

#[tokio::test(start_paused = true)]
async fn hard_memory_threshold_evicts_the_pod_over_its_requests() {
    let (m, f) = manager(Setup::default());
    add_pod(&f, pod("guaranteed", 0, Some("2Gi")), GI);
    add_pod(&f, pod("hog", 0, None), 3 * GI);
    add_pod(&f, pod("small", 0, None), 10 * MI);
    assert!(
        m.synchronize().await.is_none(),
        "8Gi available: nothing to do"
    );
    assert!(m.pressure().conditions().is_empty());

    set_node(&f, 512 * MI, 100 * GI);
    let got = m.synchronize().await.expect("a pod evicted");
    assert_eq!(kubelet_types::pod::uid(&got), "hog");
    assert_eq!(evicted(&f), vec!["hog"], "one pod per pass");
    let e = &f.evicted.lock()[0].1;
    assert_eq!(
        e.message,
        "The node was low on resource: memory. Threshold quantity: 1Gi, available: 512Mi. \
         Container c was using 3Gi, request is 0, has larger consumption of memory. "
    );
    assert_eq!(e.grace_period_seconds, 1, "hard: immediate");
    assert!(e.disruption_target);
    assert_eq!(e.annotations["offending_containers"], "c");
    assert_eq!(
        m.pressure().conditions(),
        vec![NodeCondition::MemoryPressure]
    );
    let events = f.events.lock().clone();
    assert!(events.contains(&(
        "node-1".into(),
        "EvictionThresholdMet".into(),
        "Attempting to reclaim memory".into()
    )));
    assert!(events.iter().any(|(n, r, _)| n == "hog" && r == "Evicted"));
}

#[tokio::test(start_paused = true)]
async fn ranking_exceeds_requests_then_priority_then_usage() {
    let (m, f) = manager(Setup::default());
    // Within requests, low priority: after every pod over its requests.
    add_pod(&f, pod("within", -10, Some("2Gi")), GI);
    add_pod(&f, pod("high-big", 100, None), 4 * GI);
    add_pod(&f, pod("low-small", 0, None), 100 * MI);
    add_pod(&f, pod("low-big", 0, None), 2 * GI);
    let mut order = Vec::new();
    for _ in 0..4 {
        // Each pass needs stats read after the last one's.
        tokio::time::advance(Duration::from_millis(1)).await;
        std::thread::sleep(Duration::from_millis(1));
        set_node(&f, 512 * MI, 100 * GI);
        let p = m.synchronize().await.expect("evicted");
        order.push(kubelet_types::pod::uid(&p).to_string());
    }
    assert_eq!(order, vec!["low-big", "low-small", "high-big", "within"]);
}

#[tokio::test(start_paused = true)]
async fn soft_threshold_waits_for_its_grace_period() {
    let (m, f) = manager(Setup {
        hard: BTreeMap::new(),
        soft: map(&[("memory.available", "2Gi")]),
        grace: [("memory.available".to_string(), Duration::from_secs(30))].into(),
        max_pod_grace: 20,
        ..Default::default()
    });
    add_pod(&f, pod("hog", 0, None), 3 * GI);
    set_node(&f, GI, 100 * GI);
    assert!(m.synchronize().await.is_none(), "grace period not over");
    assert_eq!(
        m.pressure().conditions(),
        vec![NodeCondition::MemoryPressure],
        "the condition does not wait for the grace period"
    );
    tokio::time::advance(Duration::from_secs(29)).await;
    set_node(&f, GI, 100 * GI);
    assert!(m.synchronize().await.is_none());
    tokio::time::advance(Duration::from_secs(1)).await;
    set_node(&f, GI, 100 * GI);
    assert!(m.synchronize().await.is_some());
    assert_eq!(
        f.evicted.lock()[0].1.grace_period_seconds,
        20,
        "soft: min(pod's 60, evictionMaxPodGracePeriod 20)"
    );
}

#[tokio::test(start_paused = true)]
async fn soft_eviction_with_max_pod_grace_unset_uses_the_pods_own() {
    // evictionMaxPodGracePeriod 0 (the default) means "not set": the pod
    // keeps its terminationGracePeriodSeconds (60), not 0.
    let (m, f) = manager(Setup {
        hard: BTreeMap::new(),
        soft: map(&[("memory.available", "2Gi")]),
        grace: [("memory.available".to_string(), Duration::from_secs(10))].into(),
        max_pod_grace: 0,
        ..Default::default()
    });
    add_pod(&f, pod("hog", 0, None), 3 * GI);
    set_node(&f, GI, 100 * GI);
    assert!(m.synchronize().await.is_none(), "grace period not over");
    tokio::time::advance(Duration::from_secs(10)).await;
    set_node(&f, GI, 100 * GI);
    assert!(m.synchronize().await.is_some());
    assert_eq!(f.evicted.lock()[0].1.grace_period_seconds, 60);
}

#[test]
fn soft_grace_is_at_least_one_second() {
    let zero: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "z", "uid": "z"},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": []}
    }))
    .expect("pod");
    assert_eq!(crate::manager::soft_grace(&zero, 0), 1);
    assert_eq!(crate::manager::soft_grace(&zero, 30), 1);
    assert_eq!(crate::manager::soft_grace(&pod("p", 0, None), -5), 60);
    assert_eq!(crate::manager::soft_grace(&pod("p", 0, None), 90), 60);
}

#[tokio::test(start_paused = true)]
async fn soft_threshold_that_clears_restarts_its_grace_period() {
    let (m, f) = manager(Setup {
        hard: BTreeMap::new(),
        soft: map(&[("memory.available", "2Gi")]),
        grace: [("memory.available".to_string(), Duration::from_secs(30))].into(),
        ..Default::default()
    });
    add_pod(&f, pod("hog", 0, None), 3 * GI);
    set_node(&f, GI, 100 * GI);
    assert!(m.synchronize().await.is_none());
    tokio::time::advance(Duration::from_secs(20)).await;
    set_node(&f, 4 * GI, 100 * GI);
    assert!(m.synchronize().await.is_none());
    tokio::time::advance(Duration::from_secs(20)).await;
    set_node(&f, GI, 100 * GI);
    assert!(
        m.synchronize().await.is_none(),
        "met again: a new grace period"
    );
    assert!(evicted(&f).is_empty());
}

#[tokio::test(start_paused = true)]
async fn pressure_stays_for_the_transition_period() {
    let (m, f) = manager(Setup::default());
    set_node(&f, 512 * MI, 100 * GI);
    m.synchronize().await;
    assert_eq!(
        m.pressure().conditions(),
        vec![NodeCondition::MemoryPressure]
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    set_node(&f, 8 * GI, 100 * GI);
    m.synchronize().await;
    assert_eq!(
        m.pressure().conditions(),
        vec![NodeCondition::MemoryPressure],
        "resolved, but within evictionPressureTransitionPeriod"
    );
    tokio::time::advance(Duration::from_secs(289)).await;
    set_node(&f, 8 * GI, 100 * GI);
    m.synchronize().await;
    assert!(m.pressure().has(NodeCondition::MemoryPressure));
    tokio::time::advance(Duration::from_secs(1)).await;
    set_node(&f, 8 * GI, 100 * GI);
    m.synchronize().await;
    assert!(
        m.pressure().conditions().is_empty(),
        "5m after the last observation"
    );
}

#[tokio::test(start_paused = true)]
async fn minimum_reclaim_keeps_evicting_until_reclaimed() {
    let (m, f) = manager(Setup {
        min_reclaim: map(&[("memory.available", "500Mi")]),
        ..Default::default()
    });
    add_pod(&f, pod("a", 0, None), 2 * GI);
    add_pod(&f, pod("b", 0, None), GI);
    set_node(&f, 512 * MI, 100 * GI);
    assert!(m.synchronize().await.is_some());
    std::thread::sleep(Duration::from_millis(1));
    // Above 1Gi, but not 1Gi + 500Mi: still met.
    set_node(&f, 1300 * MI, 100 * GI);
    assert!(
        m.synchronize().await.is_some(),
        "minimum reclaim not reached"
    );
    assert_eq!(evicted(&f), vec!["a", "b"]);
    set_node(&f, 1600 * MI, 100 * GI);
    assert!(m.synchronize().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_through_gc_before_evicting() {
    let (m, f) = manager(Setup::default());
    add_pod(&f, pod("a", 0, None), MI);
    *f.image_gc_frees.lock() = 20 * GI;
    set_node(&f, 8 * GI, 10 * GI);
    assert!(m.synchronize().await.is_none(), "image GC freed enough");
    assert_eq!(*f.gc_calls.lock(), vec!["containers", "images"]);
    assert!(evicted(&f).is_empty());
    assert_eq!(m.pressure().conditions(), vec![NodeCondition::DiskPressure]);

    *f.image_gc_frees.lock() = 0;
    std::thread::sleep(Duration::from_millis(1));
    set_node(&f, 8 * GI, 10 * GI);
    assert!(m.synchronize().await.is_some(), "GC was not enough: evict");
}

#[tokio::test(start_paused = true)]
async fn critical_pods_are_never_evicted() {
    let (m, f) = manager(Setup::default());
    add_pod(&f, pod("critical", 2_000_000_000, None), 4 * GI);
    set_node(&f, 512 * MI, 100 * GI);
    assert!(m.synchronize().await.is_none());
    assert!(evicted(&f).is_empty());
}

#[tokio::test(start_paused = true)]
async fn empty_dir_over_its_size_limit_is_evicted() {
    let (m, f) = manager(Setup::default());
    let p: Arc<Pod> = Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "writer", "namespace": "ns", "uid": "writer"},
            "spec": {"containers": [{"name": "c"}],
                "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Mi"}}]}
        }))
        .expect("pod"),
    );
    f.pods.lock().push(p);
    f.summary.lock().pods.push(PodStats {
        uid: "writer".into(),
        volumes: vec![(
            "cache".into(),
            FsUsage {
                used_bytes: Some(20 * MI),
                inodes_used: Some(1),
            },
        )],
        ..Default::default()
    });
    assert!(m.synchronize().await.is_some());
    let e = &f.evicted.lock()[0].1;
    assert_eq!(
        e.message,
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". "
    );
    assert!(!e.disruption_target);
}

#[tokio::test(start_paused = true)]
async fn stale_stats_evict_no_second_pod() {
    let (m, f) = manager(Setup::default());
    add_pod(&f, pod("a", 0, None), 2 * GI);
    add_pod(&f, pod("b", 0, None), GI);
    set_node(&f, 512 * MI, 100 * GI);
    assert!(m.synchronize().await.is_some());
    assert!(
        m.synchronize().await.is_none(),
        "the node's stats were not read again since the eviction"
    );
    assert_eq!(evicted(&f), vec!["a"]);
}

#[tokio::test(start_paused = true)]
async fn run_evicts_one_pod_then_waits_the_interval() {
    let (m, f) = manager(Setup::default());
    add_pod(&f, pod("a", 0, None), 2 * GI);
    add_pod(&f, pod("b", 0, None), GI);
    set_node(&f, 512 * MI, 100 * GI);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(m.clone().run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(evicted(&f), vec!["a"], "one pod, then the clean-up wait");
    // Memory recovers after the first eviction: the second pod stays.
    set_node(&f, 8 * GI, 100 * GI);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(evicted(&f), vec!["a"]);
    // Pressure again: woken at once by a notifier, not after 10 s.
    std::thread::sleep(Duration::from_millis(1));
    set_node(&f, 512 * MI, 100 * GI);
    m.waker().notify_one();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(evicted(&f), vec!["a", "b"]);
    stop.cancel();
    task.await.expect("run ends");
}
