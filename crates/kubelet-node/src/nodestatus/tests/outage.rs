//! Node status across apiserver outages and a hung runtime (upstream `tryUpdateNodeStatus` against the Node the apiserver holds).

use super::*;

/// What the node lifecycle controller does to a node whose kubelet stopped
/// posting status (`tryUpdateNodeHealth`): each kubelet condition becomes
/// `Unknown` (`NodeStatusUnknown`), its heartbeat kept, its transition now.
/// Returns that transition time.
async fn mark_unknown(c: &Cluster, clock: &TokioClock) -> jiff::Timestamp {
    let now = clock.now();
    let node = c.api.get("nodes", "", "n1").expect("node");
    let conditions: Vec<serde_json::Value> =
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
            .iter()
            .map(|ty| {
                serde_json::json!({"type": ty, "status": "Unknown", "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": heartbeat(&node, ty).0,
                "lastTransitionTime": Time(now)})
            })
            .collect();
    let body = serde_json::json!({"status": {"conditions": conditions}});
    Api::<Node>::all(c.admin().await)
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(body))
        .await
        .expect("node lifecycle controller's patch");
    assert_eq!(ready(c).0, "Unknown");
    now
}

/// The kubelet's conditions on the stored Node are its own again, changed
/// after `marked`, with heartbeats newer than `marked`.
fn assert_reported_after(c: &Cluster, marked: jiff::Timestamp) {
    let node = c.api.get("nodes", "", "n1").expect("node");
    for (ty, want) in [
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
        ("Ready", "True"),
    ] {
        let cond = node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == ty).cloned())
            .unwrap_or_default();
        assert_eq!(cond["status"], want, "{ty}: {cond}");
        assert!(
            cond["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("Kubelet")),
            "{ty}: {cond}"
        );
        let (beat, transition) = heartbeat(&node, ty);
        let beat: jiff::Timestamp = beat.parse().expect("heartbeat");
        let transition: jiff::Timestamp = transition.parse().expect("transition");
        // Times on the wire have second precision.
        let marked = marked
            .checked_sub(jiff::SignedDuration::from_secs(1))
            .expect("t");
        assert!(beat >= marked, "{ty}: fresh heartbeat, got {beat}");
        assert!(
            transition >= marked,
            "{ty}: Unknown -> {want} is a transition"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_marked_unknown_behind_its_back_is_ready_again_within_one_interval() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    let clock = Arc::new(TokioClock::default());
    m.clock = clock.clone();
    let recorder = Arc::new(RecordingRecorder::default());
    m.recorder = recorder.clone();
    let period = m.cfg.node_status_update_frequency;
    let report = m.cfg.node_status_report_frequency;
    assert_eq!(
        (period, report),
        (Duration::from_secs(10), Duration::from_secs(300))
    );
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    // Mid-interval, as the controller does not know the kubelet's phase.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let marked = mark_unknown(&c, &clock).await;
    let before = status_patches(&c);

    tokio::time::sleep(period).await;
    assert_eq!(
        status_patches(&c) - before,
        1,
        "the status differs from the server's: patched at the next interval"
    );
    assert_reported_after(&c, marked);
    let node_ready =
        |r: &RecordingRecorder| r.reasons().iter().filter(|r| *r == "NodeReady").count();
    assert_eq!(
        node_ready(&recorder),
        2,
        "Unknown -> True is a NodeReady event"
    );

    // Nothing changes from now on: heartbeats only every nodeStatusReportFrequency.
    let beat = heartbeat(&c.api.get("nodes", "", "n1").expect("node"), "Ready").0;
    let reported = status_patches(&c);
    tokio::time::sleep(report - period - Duration::from_secs(1)).await;
    assert_eq!(
        status_patches(&c),
        reported,
        "unchanged: no report before 5m"
    );
    assert_eq!(
        heartbeat(&c.api.get("nodes", "", "n1").expect("node"), "Ready").0,
        beat
    );
    tokio::time::sleep(2 * period).await;
    assert_eq!(status_patches(&c), reported + 1, "one heartbeat at 5m");
    assert_ne!(
        heartbeat(&c.api.get("nodes", "", "n1").expect("node"), "Ready").0,
        beat
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn after_failed_intervals_the_next_one_patches_against_what_the_server_holds() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    let (mut m, mut registered, _) = manager(c.node_client("n1").await, &fake, cfg(), vec![]);
    let clock = Arc::new(TokioClock::default());
    m.clock = clock.clone();
    let period = m.cfg.node_status_update_frequency;
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The apiserver is unreachable for a minute: every try of six intervals fails.
    c.api.set_up(false);
    tokio::time::sleep(Duration::from_secs(60)).await;
    // It comes back with the node marked Unknown by the node lifecycle controller.
    c.api.set_up(true);
    let marked = mark_unknown(&c, &clock).await;
    let before = status_patches(&c);

    tokio::time::sleep(period).await;
    assert_eq!(status_patches(&c) - before, 1);
    assert_reported_after(&c, marked);
    stop.cancel();
}

/// A runtime whose `Version` and `ListImages` never answer while `hung` is
/// set, as a wedged containerd; everything else is the fake's.
#[derive(Clone)]
struct Hung {
    fake: FakeRuntime,
    hung: Arc<std::sync::atomic::AtomicBool>,
}

impl Hung {
    async fn wait(&self) {
        if self.hung.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl RuntimeService for Hung {
    async fn version(&self) -> cri::Result<cri::pb::VersionResponse> {
        self.wait().await;
        self.fake.version().await
    }
    async fn status(&self) -> cri::Result<cri::pb::StatusResponse> {
        self.fake.status().await
    }
    async fn run_pod_sandbox(
        &self,
        config: cri::pb::PodSandboxConfig,
        handler: &str,
    ) -> cri::Result<String> {
        self.fake.run_pod_sandbox(config, handler).await
    }
    async fn stop_pod_sandbox(&self, id: &str) -> cri::Result<()> {
        self.fake.stop_pod_sandbox(id).await
    }
    async fn remove_pod_sandbox(&self, id: &str) -> cri::Result<()> {
        self.fake.remove_pod_sandbox(id).await
    }
    async fn pod_sandbox_status(&self, id: &str) -> cri::Result<cri::pb::PodSandboxStatus> {
        self.fake.pod_sandbox_status(id).await
    }
    async fn list_pod_sandbox(
        &self,
        filter: Option<cri::pb::PodSandboxFilter>,
    ) -> cri::Result<Vec<cri::pb::PodSandbox>> {
        self.fake.list_pod_sandbox(filter).await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::pb::ContainerConfig,
        sandbox_config: cri::pb::PodSandboxConfig,
    ) -> cri::Result<String> {
        self.fake
            .create_container(sandbox_id, config, sandbox_config)
            .await
    }
    async fn start_container(&self, id: &str) -> cri::Result<()> {
        self.fake.start_container(id).await
    }
    async fn stop_container(&self, id: &str, timeout: Duration) -> cri::Result<()> {
        self.fake.stop_container(id, timeout).await
    }
    async fn remove_container(&self, id: &str) -> cri::Result<()> {
        self.fake.remove_container(id).await
    }
    async fn list_containers(
        &self,
        filter: Option<cri::pb::ContainerFilter>,
    ) -> cri::Result<Vec<cri::pb::Container>> {
        self.fake.list_containers(filter).await
    }
    async fn container_status(&self, id: &str) -> cri::Result<cri::pb::ContainerStatus> {
        self.fake.container_status(id).await
    }
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> cri::Result<cri::pb::ExecSyncResponse> {
        self.fake.exec_sync(id, cmd, timeout).await
    }
}

#[async_trait::async_trait]
impl ImageService for Hung {
    async fn image_status(&self, image: &str) -> cri::Result<Option<cri::pb::Image>> {
        self.fake.image_status(image).await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::pb::AuthConfig>,
        sandbox_config: Option<cri::pb::PodSandboxConfig>,
    ) -> cri::Result<String> {
        self.fake.pull_image(image, auth, sandbox_config).await
    }
    async fn list_images(&self) -> cri::Result<Vec<cri::pb::Image>> {
        self.wait().await;
        self.fake.list_images().await
    }
    async fn remove_image(&self, image: &str) -> cri::Result<()> {
        self.fake.remove_image(image).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_runtime_does_not_keep_node_status_from_being_posted() {
    let c = Cluster::start(Default::default()).await;
    let stop = CancellationToken::new();
    let fake = FakeRuntime::new();
    fake.add_image("localhost:5000/busybox:1.35");
    let (mut m, mut registered, health) = manager(kubelet_client(&c).await, &fake, cfg(), vec![]);
    let hung = Hung {
        fake: fake.clone(),
        hung: Arc::default(),
    };
    m.runtime = Arc::new(hung.clone());
    m.images = Arc::new(hung.clone());
    let period = m.cfg.node_status_update_frequency;
    tokio::spawn(m.run(stop.clone()));
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    let runtime_version = |c: &Cluster| {
        let n = c.api.get("nodes", "", "n1").expect("node");
        let v = &n["status"]["nodeInfo"]["containerRuntimeVersion"];
        v.as_str().unwrap_or("").to_string()
    };
    let image_names = |c: &Cluster| {
        let n = c.api.get("nodes", "", "n1").expect("node");
        n["status"]["images"].to_string()
    };
    assert_eq!(runtime_version(&c), "fake://1.0.0");

    // containerd wedges: Version and ListImages never answer, and the health
    // check reports the runtime down.
    hung.hung.store(true, std::sync::atomic::Ordering::SeqCst);
    *health.runtime_error.write() = Some("container runtime is down: injected".into());
    let before = status_patches(&c);
    tokio::time::sleep(period + Duration::from_secs(5)).await;
    // One NotReady post in the interval; a post of the previous interval
    // may still be on its way to the apiserver (a real socket, which paused
    // time does not wait for) when `before` is read, and count here too.
    let posted = status_patches(&c) - before;
    assert!(
        (1..=2).contains(&posted),
        "NotReady posted within an interval: {posted} posts"
    );
    let (status, reason, _) = ready(&c);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "KubeletNotReady")
    );
    // The last version and images read are reported, not erased.
    assert_eq!(runtime_version(&c), "fake://1.0.0");
    assert!(image_names(&c).contains("busybox"), "{}", image_names(&c));

    // The health check sees it recover while the reads still hang: Ready
    // again at the next interval.
    *health.runtime_error.write() = None;
    tokio::time::sleep(period).await;
    assert_eq!(status_patches(&c) - before, 2);
    assert_eq!(ready(&c).0, "True");
    assert!(image_names(&c).contains("busybox"), "{}", image_names(&c));
    stop.cancel();
}
