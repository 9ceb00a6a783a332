//! Stats when the runtime fails: one sandbox or container, a batch call, a
//! hung item, an older runtime (per-item fallback, backoffs, budgets).

use cri::CriError;
use cri::fake::FakeRuntime;
use kubelet_metrics::parse::parse;
use kubelet_server::stats::resource;

use super::batch_backoff::{BATCH_BACKOFF, FALLBACK_BUDGET, ITEM_BACKOFF, ITEM_TIMEOUT};
use super::*;

#[async_trait::async_trait]
impl StatsRuntime for FakeRuntime {
    async fn list_pod_sandbox(&self) -> Result<Vec<pb::PodSandbox>, CriError> {
        cri::RuntimeService::list_pod_sandbox(self, None).await
    }
    async fn list_containers(&self) -> Result<Vec<pb::Container>, CriError> {
        cri::RuntimeService::list_containers(self, None).await
    }
    async fn list_container_stats(&self) -> Result<Vec<pb::ContainerStats>, CriError> {
        FakeRuntime::list_container_stats(self, None).await
    }
    async fn container_stats(&self, id: &str) -> Result<Option<pb::ContainerStats>, CriError> {
        FakeRuntime::container_stats(self, id).await
    }
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<pb::PodSandboxStats>, CriError> {
        FakeRuntime::list_pod_sandbox_stats(self, None).await
    }
    async fn pod_sandbox_stats(&self, id: &str) -> Result<Option<pb::PodSandboxStats>, CriError> {
        FakeRuntime::pod_sandbox_stats(self, id).await
    }
    async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse, CriError> {
        FakeRuntime::image_fs_info(self).await
    }
}

/// The fake runtime, whose `ContainerStats` and `PodSandboxStats` of the
/// IDs in `hang` never answer (a runtime stuck on one item).
struct Hanging<'a> {
    fake: &'a FakeRuntime,
    hang: &'a parking_lot::Mutex<std::collections::HashSet<String>>,
}

impl Hanging<'_> {
    async fn maybe_hang(&self, id: &str) {
        if self.hang.lock().contains(id) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl StatsRuntime for Hanging<'_> {
    async fn list_pod_sandbox(&self) -> Result<Vec<pb::PodSandbox>, CriError> {
        StatsRuntime::list_pod_sandbox(self.fake).await
    }
    async fn list_containers(&self) -> Result<Vec<pb::Container>, CriError> {
        StatsRuntime::list_containers(self.fake).await
    }
    async fn list_container_stats(&self) -> Result<Vec<pb::ContainerStats>, CriError> {
        StatsRuntime::list_container_stats(self.fake).await
    }
    async fn container_stats(&self, id: &str) -> Result<Option<pb::ContainerStats>, CriError> {
        self.maybe_hang(id).await;
        StatsRuntime::container_stats(self.fake, id).await
    }
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<pb::PodSandboxStats>, CriError> {
        StatsRuntime::list_pod_sandbox_stats(self.fake).await
    }
    async fn pod_sandbox_stats(&self, id: &str) -> Result<Option<pb::PodSandboxStats>, CriError> {
        self.maybe_hang(id).await;
        StatsRuntime::pod_sandbox_stats(self.fake, id).await
    }
    async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse, CriError> {
        StatsRuntime::image_fs_info(self.fake).await
    }
}

/// A node with three running pods `u0`..`u2`, one container each, whose
/// container in pod `u<i>` used `i+1` core-seconds and `i+1` MiB.
struct Node {
    fake: FakeRuntime,
    metrics: KubeletMetrics,
    pod_cache: PodCache,
    cpu_usage: CpuUsageCache,
    fallback: StatsFallback,
    hang: parking_lot::Mutex<std::collections::HashSet<String>>,
    dir: tempfile::TempDir,
    sandboxes: Vec<String>,
    containers: Vec<String>,
}

const MIB: u64 = 1 << 20;

/// Pod cgroups (v2) as directories `<dir>/<uid>`.
struct PodCgroupsIn(PathBuf);

impl PodCgroupDirs for PodCgroupsIn {
    fn pod_cgroup_dirs(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, PathBuf>> {
        let Ok(entries) = std::fs::read_dir(&self.0) else {
            return Default::default();
        };
        entries
            .flatten()
            .map(|e| {
                let dir = e.path();
                let uid = e.file_name().to_string_lossy().into_owned();
                let by_controller = ["cpu", "memory"]
                    .map(|c| (c.to_string(), dir.clone()))
                    .into();
                (uid, by_controller)
            })
            .collect()
    }
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("test dir");
    }
    std::fs::write(path, text).expect("test file");
}

impl Node {
    fn new() -> Self {
        let fake = FakeRuntime::new();
        let (mut sandboxes, mut containers) = (Vec::new(), Vec::new());
        for i in 0..3u64 {
            let (sb, ids) = fake.add_running_pod(&format!("u{i}"), &format!("p{i}"), 1);
            fake.set_container_usage(&ids[0], (i + 1) * 1_000_000_000, (i + 1) * MIB);
            sandboxes.push(sb);
            containers.extend(ids);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let cg = dir.path().join("cgroup");
        write(&cg.join("cgroup.controllers"), "cpu memory pids\n");
        write(&cg.join("cpu.stat"), "usage_usec 9000000\n");
        write(&cg.join("memory.stat"), "anon 4096\ninactive_file 1024\n");
        write(&cg.join("memory.current"), "1048576\n");
        let proc = dir.path().join("proc");
        write(
            &proc.join("meminfo"),
            "MemTotal: 4096 kB\nMemFree: 1024 kB\n",
        );
        write(&proc.join("stat"), "btime 1700000000\n");
        Self {
            fake,
            metrics: KubeletMetrics::new(),
            pod_cache: PodCache::default(),
            cpu_usage: CpuUsageCache::default(),
            fallback: StatsFallback::default(),
            hang: Default::default(),
            dir,
            sandboxes,
            containers,
        }
    }

    async fn collect(&self, full: bool) -> Result<Summary, StatsError> {
        let logs = self.dir.path().join("logs");
        let cgroup = self.dir.path().join("cgroup");
        let proc = self.dir.path().join("proc");
        let rt = Hanging {
            fake: &self.fake,
            hang: &self.hang,
        };
        Collector {
            rt: &rt,
            metrics: &self.metrics,
            pod_cache: &self.pod_cache,
            cpu_usage: &self.cpu_usage,
            fallback: &self.fallback,
            node_name: "n1",
            root_dir: self.dir.path(),
            pod_logs_dir: &logs,
            cgroup_root: &cgroup,
            proc_root: &proc,
            pod_cgroups: Some(Arc::new(PodCgroupsIn(self.dir.path().join("pods")))),
        }
        .collect(full)
        .await
    }

    /// `kubelet_runtime_operations{,_errors}_total` of `op`.
    fn counted(&self, op: &str) -> (f64, f64) {
        let text = self.metrics.render();
        let f = parse(&text).expect("metrics parse");
        let value = |family: &str| {
            f.get(family)
                .and_then(|f| {
                    f.samples
                        .iter()
                        .find(|s| s.label("operation_type") == Some(op))
                })
                .map_or(0.0, |s| s.value)
        };
        (
            value("kubelet_runtime_operations_total"),
            value("kubelet_runtime_operations_errors_total"),
        )
    }
}

fn pod<'a>(s: &'a Summary, uid: &str) -> &'a PodStats {
    s.pods
        .iter()
        .find(|p| p.pod_ref.uid == uid)
        .unwrap_or_else(|| panic!("pod {uid} in the summary: {s:?}"))
}

fn pod_cpu_ns(p: &PodStats) -> Option<u64> {
    p.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds)
}

fn pod_ws(p: &PodStats) -> Option<u64> {
    p.memory.as_ref().and_then(|m| m.working_set_bytes)
}

fn container_ws(p: &PodStats) -> Option<u64> {
    p.containers[0]
        .memory
        .as_ref()
        .and_then(|m| m.working_set_bytes)
}

#[tokio::test(start_paused = true)]
async fn one_sandbox_failing_its_stats_leaves_the_others_whole() {
    let node = Node::new();
    node.fake.fail_stats(&node.sandboxes[1]);

    let s = node
        .collect(true)
        .await
        .expect("a summary despite one bad sandbox");

    assert_eq!(s.pods.len(), 3, "{s:?}");
    for (i, uid) in ["u0", "u1", "u2"].iter().enumerate() {
        let p = pod(&s, uid);
        let n = i as u64 + 1;
        // u1 lost its sandbox stats alone: it reports its container's.
        assert_eq!(pod_cpu_ns(p), Some(n * 1_000_000_000), "{uid}");
        assert_eq!(pod_ws(p), Some(n * MIB), "{uid}");
        assert_eq!(container_ws(p), Some(n * MIB), "{uid}");
    }
    assert!(s.node.cpu.is_some() && s.node.memory.is_some());
    assert_eq!(node.counted("list_podsandbox_stats"), (1.0, 1.0));
    assert_eq!(
        node.counted("podsandbox_stats"),
        (3.0, 1.0),
        "each ready sandbox asked once, the bad one counted"
    );
    assert_eq!(node.counted("list_container_stats"), (1.0, 0.0));
}

#[tokio::test(start_paused = true)]
async fn one_container_failing_its_stats_is_left_out_alone() {
    let node = Node::new();
    node.fake.fail_stats(&node.containers[2]);

    let s = node
        .collect(true)
        .await
        .expect("a summary despite one bad container");

    assert_eq!(s.pods.len(), 3, "{s:?}");
    for (i, uid) in ["u0", "u1"].iter().enumerate() {
        let p = pod(&s, uid);
        let n = i as u64 + 1;
        assert_eq!(pod_ws(p), Some(n * MIB), "{uid}");
        assert_eq!(container_ws(p), Some(n * MIB), "{uid}");
    }
    let bad = pod(&s, "u2");
    assert_eq!(bad.containers.len(), 1, "the container is listed");
    assert_eq!(
        bad.containers[0].memory, None,
        "without the stats that failed"
    );
    assert_eq!(bad.containers[0].cpu, None);
    assert_eq!(node.counted("list_container_stats"), (1.0, 1.0));
    assert_eq!(node.counted("container_stats"), (3.0, 1.0));
}

#[tokio::test(start_paused = true)]
async fn a_runtime_without_sandbox_stats_reports_pods_from_their_containers() {
    let node = Node::new();
    node.fake.set_unimplemented("ListPodSandboxStats");
    node.fake.set_unimplemented("PodSandboxStats");

    let s = node
        .collect(true)
        .await
        .expect("a summary from container stats");

    for (i, uid) in ["u0", "u1", "u2"].iter().enumerate() {
        let p = pod(&s, uid);
        let n = i as u64 + 1;
        assert_eq!(pod_cpu_ns(p), Some(n * 1_000_000_000), "{uid}");
        assert_eq!(pod_ws(p), Some(n * MIB), "{uid}");
    }
    assert_eq!(
        node.fake.call_count("PodSandboxStats"),
        0,
        "no per-sandbox calls to a runtime without them"
    );
}

#[tokio::test(start_paused = true)]
async fn a_runtime_gone_during_stats_is_not_asked_per_sandbox() {
    let node = Node::new();
    node.fake.fail_next(
        "ListPodSandboxStats",
        CriError::Timeout {
            op: "ListPodSandboxStats",
            timeout: std::time::Duration::from_secs(2),
        },
    );

    let s = node.collect(false).await.expect("a summary");

    assert_eq!(s.pods.len(), 3);
    assert_eq!(pod_ws(pod(&s, "u1")), Some(2 * MIB), "from the containers");
    assert_eq!(node.fake.call_count("PodSandboxStats"), 0);
    assert_eq!(node.counted("list_podsandbox_stats"), (1.0, 1.0));
}

#[tokio::test(start_paused = true)]
async fn resource_metrics_keep_the_other_pods_when_one_sandbox_fails() {
    let node = Node::new();
    node.fake.fail_stats(&node.sandboxes[0]);
    node.fake.fail_stats(&node.containers[0]);

    let s = node.collect(false).await.expect("a summary");
    let text = resource::render(Some(&s.cpu_and_memory_only()));

    let pod_ws_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pod_memory_working_set_bytes{"))
        .collect();
    assert_eq!(pod_ws_lines.len(), 2, "{text}");
    assert!(
        pod_ws_lines.iter().all(|l| !l.contains("pod=\"p0\"")),
        "{text}"
    );
    assert!(text.contains("node_memory_working_set_bytes "), "{text}");
    assert!(text.contains("resource_scrape_error 0"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_pod_without_any_runtime_stats_reports_its_pod_cgroup() {
    let node = Node::new();
    node.fake.fail_stats(&node.sandboxes[2]);
    node.fake.fail_stats(&node.containers[2]);
    let cg = node.dir.path().join("pods/u2");
    write(&cg.join("cgroup.controllers"), "cpu memory\n");
    write(&cg.join("cpu.stat"), "usage_usec 7000000\n");
    write(&cg.join("memory.current"), "5242880\n");
    write(
        &cg.join("memory.stat"),
        "anon 4194304\ninactive_file 1048576\n",
    );

    let s = node.collect(false).await.expect("a summary");

    let p = pod(&s, "u2");
    assert_eq!(pod_cpu_ns(p), Some(7_000_000_000), "{p:?}");
    assert_eq!(pod_ws(p), Some(4 * MIB), "{p:?}");
    assert_eq!(p.containers[0].memory, None, "the container's stats failed");
    assert_eq!(
        pod_ws(pod(&s, "u1")),
        Some(2 * MIB),
        "others from the runtime"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_list_is_skipped_for_the_backoff_then_tried_again() {
    let node = Node::new();
    node.fake.fail_stats(&node.sandboxes[1]);
    node.collect(false).await.expect("a summary");
    assert_eq!(node.fake.call_count("ListPodSandboxStats"), 1);

    tokio::time::advance(BATCH_BACKOFF / 2).await;
    let s = node.collect(false).await.expect("a summary");
    assert_eq!(
        node.fake.call_count("ListPodSandboxStats"),
        1,
        "no list call within the backoff"
    );
    assert_eq!(node.fake.call_count("PodSandboxStats"), 6);
    assert_eq!(pod_ws(pod(&s, "u2")), Some(3 * MIB));
    assert_eq!(
        node.fake.call_count("ListContainerStats"),
        2,
        "the working list call is made each time"
    );

    tokio::time::advance(BATCH_BACKOFF / 2).await;
    node.collect(false).await.expect("a summary");
    assert_eq!(
        node.fake.call_count("ListPodSandboxStats"),
        2,
        "tried again after the backoff"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_item_costs_its_short_deadline_alone() {
    let node = Node::new();
    node.fake.fail_stats(&node.sandboxes[1]);
    node.hang.lock().insert(node.sandboxes[0].clone());

    let start = tokio::time::Instant::now();
    let s = node.collect(false).await.expect("a summary");

    assert_eq!(start.elapsed(), ITEM_TIMEOUT, "one short deadline");
    assert_eq!(s.pods.len(), 3);
    for (i, uid) in ["u0", "u1", "u2"].iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(pod_ws(pod(&s, uid)), Some(n * MIB), "{uid}");
    }
    assert_eq!(
        node.counted("podsandbox_stats"),
        (3.0, 2.0),
        "the hanging and the bad sandbox counted, the third read"
    );
}

#[tokio::test(start_paused = true)]
async fn per_item_calls_end_with_the_collection_budget() {
    let node = Node::new();
    let mut hanging = Vec::new();
    for i in 3..10 {
        let (_, ids) = node
            .fake
            .add_running_pod(&format!("u{i}"), &format!("p{i}"), 1);
        hanging.extend(ids);
    }
    node.fake.fail_stats(&node.containers[0]);
    node.hang.lock().extend(hanging);

    let start = tokio::time::Instant::now();
    let s = node.collect(false).await.expect("a summary");

    assert_eq!(start.elapsed(), FALLBACK_BUDGET);
    assert_eq!(s.pods.len(), 10);
    assert_eq!(container_ws(pod(&s, "u1")), Some(2 * MIB));
    assert_eq!(container_ws(pod(&s, "u2")), Some(3 * MIB));
    assert_eq!(
        node.counted("container_stats"),
        (10.0, 8.0),
        "the bad one, five timed out, two not asked in time"
    );
}

#[tokio::test(start_paused = true)]
async fn the_budget_does_not_leave_out_the_same_items_every_time() {
    let node = Node::new();
    let mut hanging = Vec::new();
    for i in 3..10 {
        let (_, ids) = node
            .fake
            .add_running_pod(&format!("u{i}"), &format!("p{i}"), 1);
        hanging.extend(ids);
    }
    let (_, late) = node.fake.add_running_pod("u10", "p10", 1);
    node.fake
        .set_container_usage(&late[0], 1_000_000_000, 11 * MIB);
    node.fake.fail_stats(&node.containers[0]);
    node.hang.lock().extend(hanging);

    let s = node.collect(false).await.expect("a summary");
    assert_eq!(container_ws(pod(&s, "u10")), None, "not asked in time");

    let start = tokio::time::Instant::now();
    let s = node.collect(false).await.expect("a summary");
    assert_eq!(
        container_ws(pod(&s, "u10")),
        Some(11 * MIB),
        "left out last time: asked first"
    );
    assert_eq!(container_ws(pod(&s, "u2")), Some(3 * MIB));
    assert_eq!(
        start.elapsed(),
        2 * ITEM_TIMEOUT,
        "the five that timed out are not asked again, the two left out time out"
    );

    let start = tokio::time::Instant::now();
    let s = node.collect(false).await.expect("a summary");
    assert_eq!(
        start.elapsed(),
        std::time::Duration::ZERO,
        "all hanging ones back off"
    );
    assert_eq!(container_ws(pod(&s, "u10")), Some(11 * MIB));
    assert_eq!(
        node.counted("container_stats"),
        (33.0, 25.0),
        "each collection counts all eleven; 9, 8 and 8 left out"
    );

    tokio::time::advance(ITEM_BACKOFF).await;
    let start = tokio::time::Instant::now();
    let s = node.collect(false).await.expect("a summary");
    assert_eq!(
        start.elapsed(),
        FALLBACK_BUDGET,
        "asked again after the backoff"
    );
    for (uid, mib) in [("u1", 2), ("u2", 3), ("u10", 11)] {
        assert_eq!(container_ws(pod(&s, uid)), Some(mib * MIB), "{uid}");
    }
}

/// Counts warn-level events.
#[derive(Clone, Default)]
struct Warnings(Arc<parking_lot::Mutex<usize>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *e.metadata().level() == tracing::Level::WARN {
            *self.0.lock() += 1;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_runtime_without_item_stats_is_a_warning_once_while_backing_off() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _log =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let node = Node::new();
    node.fake.fail_stats(&node.containers[0]);
    node.fake.set_unimplemented("ContainerStats");

    node.collect(false).await.expect("a summary");
    let first = *warnings.0.lock();
    assert!(first >= 2, "the list and the item call: {first}");
    for _ in 0..3 {
        tokio::time::advance(std::time::Duration::from_secs(10)).await;
        node.collect(false).await.expect("a summary");
    }
    assert_eq!(node.fake.call_count("ContainerStats"), 4, "asked each time");
    assert_eq!(*warnings.0.lock(), first, "no more warnings");
}

#[tokio::test(start_paused = true)]
async fn listing_sandboxes_still_has_to_work() {
    let node = Node::new();
    node.fake.set_down(true);
    assert!(matches!(
        node.collect(true).await,
        Err(StatsError::Runtime(CriError::Unavailable { .. }))
    ));
}
