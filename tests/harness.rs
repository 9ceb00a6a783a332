//! Test harness: runs a kubelet-rs App in-process against the real containerd
//! set up by `deploy/setup-runtime.sh`, with a fresh manifest directory and a
//! unique node name per test, so pod names and UIDs never collide with earlier
//! runs. Pod status is read from the agent itself.
//!
//! Tests hold a machine-wide lock while they run: a kubelet owns the runtime
//! and removes pods it does not know, so two at once would fight.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use cri::{RemoteRuntime, RuntimeService};
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use kubelet::{App, AppHandle, KubeletConfig, Running};
use kubelet_config::Flags;

#[path = "api_compat.rs"]
pub mod api_compat;
#[path = "cluster_harness.rs"]
pub mod cluster;
#[path = "conformance.rs"]
pub mod conformance;
#[path = "lane.rs"]
pub mod lane;
#[path = "node_api_client.rs"]
pub mod node_api;
#[path = "prom_text.rs"]
pub mod prom_text;

pub use lane::{endpoint, pod_logs_dir};
/// Image built by the setup script.
pub const BUSYBOX: &str = "localhost:5000/busybox:1.35";

/// Fails loudly when containerd is not there: these tests never skip.
pub async fn require_runtime() -> RemoteRuntime {
    let endpoint = endpoint();
    let rt = RemoteRuntime::new(endpoint, None, Duration::from_secs(10)).expect("CRI client");
    match rt.version().await {
        Ok(_) => rt,
        Err(e) => panic!(
            "containerd is not reachable on {endpoint} ({e}). The integration tests need the real runtime: \
             run `sudo deploy/setup-runtime.sh` (hack/test.sh does it for you; lane 2 is \
             `setup-runtime.sh --lane2`)."
        ),
    }
}

/// A kubelet under test.
pub struct Node {
    /// Node name (unique per test).
    pub name: String,
    /// Scratch directory (root dir, manifests).
    pub dir: tempfile::TempDir,
    /// Static pod directory.
    pub manifests: PathBuf,
    /// Direct CRI access for assertions.
    pub runtime: RemoteRuntime,
    cfg: KubeletConfig,
    running: Option<Running>,
    _lock: File,
}

/// A loopback port nothing listens on right now, for a server the test
/// starts later: taken from this lane's own range ([`lane::free_port`]), so
/// neither the other lane nor any port-0 bind takes it in between.
pub fn free_port() -> i32 {
    i32::from(lane::free_port())
}

/// Test kubelets run without eviction thresholds and with image garbage
/// collection off, unless the test sets them (flag or `--config` file):
/// these machines' disks are often nearly full (one was seen with 5.5% of
/// its blocks available), so upstream's defaults (`nodefs.available<10%`,
/// `imageGCHighThresholdPercent: 85`) would put every test node under
/// DiskPressure, refusing and evicting the pods the test is about, and
/// collect the images the next test needs.
fn quiet_housekeeping(flags: &mut Flags, file: Option<&kubelet_config::KubeletConfiguration>) {
    let in_file = |field: &str| file.is_some_and(|f| f.other.contains_key(field));
    if flags.eviction_hard.is_none() && file.is_none_or(|f| f.eviction_hard.is_none()) {
        flags.eviction_hard = Some(String::new());
    }
    if flags.extra.get("image-gc-high-threshold").is_none()
        && !in_file("imageGCHighThresholdPercent")
    {
        flags
            .extra
            .push("image-gc-high-threshold", "100")
            .expect("--image-gc-high-threshold");
        flags
            .extra
            .push("image-gc-low-threshold", "99")
            .expect("--image-gc-low-threshold");
    }
}

impl Node {
    /// Starts a kubelet with `tweak` applied to its flags.
    pub async fn start(tweak: impl FnOnce(&mut Flags)) -> Node {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(kubelet_config::logs::filter_for(2))
            .with_test_writer()
            .try_init();
        // The lock first: a test holding it may have stopped containerd
        // on purpose (tests/fault_containerd_restart.rs).
        let lock = tokio::task::spawn_blocking(lane::lock)
            .await
            .expect("lock task");
        let runtime = require_runtime().await;
        lane::ensure_cgroup_root();
        let dir = tempfile::tempdir().expect("tempdir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        let name = format!("it-{:08x}", rand::random::<u32>());
        let mut flags = Flags {
            pod_manifest_path: Some(manifests.clone()),
            hostname_override: Some(name.clone()),
            root_dir: Some(dir.path().join("root")),
            healthz_port: Some(0),
            port: Some(free_port()),
            read_only_port: Some(0),
            file_check_frequency: Some("2s".into()),
            container_runtime_endpoint: Some(endpoint().into()),
            ..Flags::default()
        };
        flags.extra.push("address", "127.0.0.1").expect("--address");
        tweak(&mut flags);
        let file = flags.config.as_ref().map(|p| {
            kubelet_config::KubeletConfiguration::load(p)
                .expect("--config file")
                .0
        });
        quiet_housekeeping(&mut flags, file.as_ref());
        // This host runs cgroup v1, which a config file refuses by default
        // since 1.35 (failCgroupV1): tests that bring their own file run here.
        if flags.extra.get("fail-cgroupv1").is_none()
            && file
                .as_ref()
                .is_none_or(|f| !f.other.contains_key("failCgroupV1"))
        {
            flags
                .extra
                .push("fail-cgroupv1", "false")
                .expect("--fail-cgroupv1");
        }
        // The VM lane's containerd runs runc with the systemd driver (as
        // kubeadm's nodes do): its job says so for the tests' kubelets.
        if flags.cgroup_driver.is_none() && file.as_ref().is_none_or(|f| f.cgroup_driver.is_none())
        {
            flags.cgroup_driver = std::env::var("KUBELET_RS_TEST_CGROUP_DRIVER").ok();
        }
        if flags.cgroup_root.is_none() && file.as_ref().is_none_or(|f| f.cgroup_root.is_none()) {
            flags.cgroup_root = lane::lane().cgroup_root.map(String::from);
        }
        let mut cfg = KubeletConfig::resolve(&flags, file.as_ref(), "unused").expect("config");
        if file.as_ref().is_none_or(|f| f.pod_logs_dir.is_none()) {
            cfg.pod_logs_dir = pod_logs_dir();
        }
        let mut node = Node {
            name,
            dir,
            manifests,
            runtime,
            cfg,
            running: None,
            _lock: lock,
        };
        node.boot().await;
        node
    }

    async fn boot(&mut self) {
        let app = App::build(self.cfg.clone()).await.expect("app builds");
        self.running = Some(app.spawn());
    }

    /// Stops the kubelet; containers keep running.
    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(10)).await;
        }
    }

    /// Starts a kubelet again after [`Node::stop`], with the same configuration.
    pub async fn start_again(&mut self) {
        self.boot().await;
    }

    /// Stops the kubelet (containers keep running) and starts a new one with the same configuration.
    pub async fn restart(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(10)).await;
        }
        self.boot().await;
    }

    /// The kubelet's self-signed serving bundle (`<cert-dir>/kubelet.crt`),
    /// whose CA a client trusts.
    pub fn serving_ca(&self) -> PathBuf {
        self.cfg.cert_dir.join("kubelet.crt")
    }

    /// Read access to the running kubelet.
    pub fn handle(&self) -> &AppHandle {
        &self.running.as_ref().expect("running").handle
    }

    /// Writes `manifests/<file>`.
    pub fn write_manifest(&self, file: &str, text: &str) {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(file)).expect("rename manifest");
    }

    /// Deletes `manifests/<file>`.
    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).expect("remove manifest");
    }

    /// The static pod's full name on this node.
    pub fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.name)
    }

    /// The UID of the desired pod named `name` (manifest name), if any.
    pub fn uid_of(&self, name: &str) -> Option<String> {
        let full = self.pod_name(name);
        self.handle()
            .desired
            .get_pods()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(full.as_str()))
            .and_then(|p| p.metadata.uid.clone())
    }

    /// Current status of the pod named `name`.
    pub fn status(&self, name: &str) -> Option<PodStatus> {
        let uid = self.uid_of(name)?;
        self.handle().status.get_pod_status(&uid)
    }

    /// Waits until `pred` holds for the pod's status, polling every 200ms.
    pub async fn wait_status(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&PodStatus) -> bool,
    ) -> anyhow::Result<PodStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.status(name)
                && pred(&s)
            {
                return Ok(s);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "pod {name}: not {what} within {timeout:?}; last status: {:#?}",
                    self.status(name)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sandboxes in the runtime that belong to this node's pods (any state).
    pub async fn sandboxes(&self) -> Vec<cri::pb::PodSandbox> {
        let all = self
            .runtime
            .list_pod_sandbox(None)
            .await
            .expect("list sandboxes");
        all.into_iter()
            .filter(|s| {
                s.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&format!("-{}", self.name)))
            })
            .collect()
    }

    /// Containers in the runtime that belong to this node's pods (any state).
    pub async fn containers(&self) -> Vec<cri::pb::Container> {
        let all = self
            .runtime
            .list_containers(None)
            .await
            .expect("list containers");
        all.into_iter()
            .filter(|c| {
                c.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&format!("-{}", self.name)))
            })
            .collect()
    }

    /// Stops the kubelet and removes every sandbox of this node's pods.
    pub async fn cleanup(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(10)).await;
        }
        for s in self.sandboxes().await {
            let _ = self.runtime.stop_pod_sandbox(&s.id).await;
            let _ = self.runtime.remove_pod_sandbox(&s.id).await;
        }
        let _ = std::fs::remove_dir_all(pod_logs_dir().join(format!("default_x_{}", self.name)));
        unmount_under(self.dir.path());
    }

    /// How many of the running kubelet's tracked tasks are alive.
    pub fn tracked_tasks(&self) -> usize {
        self.running.as_ref().map_or(0, |r| r.tracked_tasks())
    }

    /// The kubelet's `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.cfg.root_dir.clone()
    }
}

/// Lazily unmounts everything mounted under `dir` (tmpfs volumes, subPath
/// and local-PV bind mounts a test left), deepest first, so the temporary
/// directory can be removed.
pub fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(p)
            .status();
    }
}

/// The status of container `name` in a pod status (app containers).
pub fn container<'a>(s: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

/// The status of init container `name`.
pub fn init_container<'a>(s: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    s.init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

/// True when container `name` is running.
pub fn is_running(s: &PodStatus, name: &str) -> bool {
    container(s, name).is_some_and(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
}

/// The waiting reason of container `name`, if waiting.
pub fn waiting_reason(s: &PodStatus, name: &str) -> Option<String> {
    container(s, name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

/// A one-container pod manifest.
pub fn pod_yaml(name: &str, restart_policy: &str, image: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart_policy}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: {image}\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

/// Reads the pod's current container ID of `name`.
pub fn container_id(s: &PodStatus, name: &str) -> Option<String> {
    container(s, name)?.container_id.clone()
}

/// Convenience for tests that need an error context.
pub trait Ctx<T> {
    /// Adds context.
    fn ctx(self, what: &str) -> anyhow::Result<T>;
}

impl<T> Ctx<T> for Option<T> {
    fn ctx(self, what: &str) -> anyhow::Result<T> {
        self.context(what.to_string())
    }
}
