//! Issue 20 fault case: the kubelet-rs process killed with SIGKILL in the
//! middle of a 30-pod burst, then started again with the same root dir, on
//! the real containerd.
//!
//! What upstream guarantees after such a crash (`kuberuntime_manager.go`
//! `computePodActions`, `kuberuntime_gc.go`): the new kubelet adopts what
//! the runtime holds: a pod whose newest sandbox is ready keeps it and
//! gets its missing containers started in it; a pod with none ready gets a
//! new sandbox (attempt + 1); more than one ready sandbox is replaced by one.
//! Container garbage collection (every minute) removes a live pod's
//! not-ready sandboxes that hold no containers, except its newest one, and
//! dead containers beyond `--maximum-dead-containers-per-container` (1 by
//! default, for `kubectl logs --previous`). Asserted here: every pod Running
//! with exactly one ready sandbox, its container running in it; within a
//! minute no sandbox of these pods but the ready one, and no container of
//! them but the running ones, except the dead instance upstream's GC keeps
//! for `--previous` (at most one per pod, never in a second sandbox).
//! Seen on containerd 1.6: the calls in flight when the kubelet dies
//! complete in containerd afterwards (sandboxes come up ready and are
//! adopted; a `CreateContainer` holds the container's name, so the new
//! kubelet's first create fails with `failed to reserve container name`,
//! and its next sync starts attempt 1 beside the never-started attempt 0,
//! which is that kept dead instance: upstream does the same).
//! Events are not checked here: in standalone mode (static pods) there is
//! no apiserver to see them. `fault_kill_burst_events.rs` runs the same
//! burst and kill with the node registered to the apiserver double and
//! checks the events against what the runtime held.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cri::pb::{ContainerState, PodSandboxState};
use cri::{RemoteRuntime, RuntimeService};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");
const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const PODS: usize = 30;
/// Sandboxes (any state) that exist when the kubelet is killed.
const KILL_AT_SANDBOXES: usize = 10;

/// What the test's pods hold in the runtime, any state.
struct Held {
    sandboxes: Vec<cri::pb::PodSandbox>,
    containers: Vec<cri::pb::Container>,
}

impl Held {
    async fn read(rt: &RemoteRuntime, node: &str) -> Held {
        let ours = |labels: &std::collections::HashMap<String, String>| {
            labels
                .get("io.kubernetes.pod.name")
                .is_some_and(|n| n.ends_with(&format!("-{node}")))
        };
        let sandboxes = rt.list_pod_sandbox(None).await.expect("list sandboxes");
        let containers = rt.list_containers(None).await.expect("list containers");
        Held {
            sandboxes: sandboxes.into_iter().filter(|s| ours(&s.labels)).collect(),
            containers: containers.into_iter().filter(|c| ours(&c.labels)).collect(),
        }
    }

    fn ready(s: &cri::pb::PodSandbox) -> bool {
        s.state == PodSandboxState::SandboxReady as i32
    }

    fn running(c: &cri::pb::Container) -> bool {
        c.state == ContainerState::ContainerRunning as i32
    }

    /// Pods (by name) with exactly one ready sandbox and a running
    /// container in it.
    fn running_pods(&self) -> usize {
        let mut by_pod: BTreeMap<&str, Vec<&cri::pb::PodSandbox>> = BTreeMap::new();
        for s in self.sandboxes.iter().filter(|s| Self::ready(s)) {
            by_pod
                .entry(&s.labels["io.kubernetes.pod.name"])
                .or_default()
                .push(s);
        }
        by_pod
            .values()
            .filter(|ready| {
                ready.len() == 1
                    && self
                        .containers
                        .iter()
                        .any(|c| c.pod_sandbox_id == ready[0].id && Self::running(c))
            })
            .count()
    }

    /// What is left beyond one ready sandbox and one running container per
    /// pod, that upstream's GC does not keep: not-ready sandboxes, more than
    /// one ready sandbox, dead containers in a sandbox that is not the
    /// pod's ready one, and more than one dead container per pod.
    fn leftovers(&self) -> Vec<String> {
        let mut out = vec![];
        let mut ready: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for s in &self.sandboxes {
            let pod = s.labels["io.kubernetes.pod.name"].as_str();
            if Self::ready(s) {
                ready.entry(pod).or_default().push(&s.id);
            } else {
                out.push(format!("not-ready sandbox {} of {pod}", s.id));
            }
        }
        for (pod, ids) in &ready {
            if ids.len() > 1 {
                out.push(format!("{pod}: {} ready sandboxes", ids.len()));
            }
        }
        let mut dead: BTreeMap<&str, usize> = BTreeMap::new();
        for c in self.containers.iter().filter(|c| !Self::running(c)) {
            let pod = c.labels["io.kubernetes.pod.name"].as_str();
            let in_ready = ready
                .get(pod)
                .is_some_and(|ids| ids.contains(&c.pod_sandbox_id.as_str()));
            if !in_ready {
                out.push(format!(
                    "dead container {} of {pod} outside its ready sandbox",
                    c.id
                ));
            }
            *dead.entry(pod).or_default() += 1;
        }
        for (pod, n) in dead {
            if n > 1 {
                out.push(format!("{pod}: {n} dead containers"));
            }
        }
        out
    }
}

/// A kubelet-rs process, its stderr in a file.
struct Kubelet {
    child: Child,
}

impl Kubelet {
    fn start(args: &[String], log: &Path) -> Kubelet {
        let err = File::options()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = Command::new(BIN)
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start kubelet-rs");
        Kubelet { child }
    }

    fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait");
    }

    fn terminate(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes every sandbox of the test's pods when dropped, even after a
/// failure (the kubelet is dropped, so killed, first).
struct Cleanup {
    node: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let node = self.node.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(cri) = RemoteRuntime::new(ENDPOINT, None, Duration::from_secs(10)) else {
                    return;
                };
                for s in Held::read(&cri, &node).await.sandboxes {
                    let _ = cri.stop_pod_sandbox(&s.id).await;
                    let _ = cri.remove_pod_sandbox(&s.id).await;
                }
            });
            if let Ok(dirs) = std::fs::read_dir("/var/log/pods") {
                for d in dirs.flatten() {
                    if d.file_name()
                        .to_string_lossy()
                        .contains(&format!("-{node}_"))
                    {
                        let _ = std::fs::remove_dir_all(d.path());
                    }
                }
            }
        })
        .join();
    }
}

/// Wall-clock nanoseconds, as the runtime's `created_at`.
fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: 'localhost:5000/busybox:1.35', imagePullPolicy: IfNotPresent, command: [sleep, '3600']}}]\n"
    )
}

async fn wait_until(
    rt: &RemoteRuntime,
    node: &str,
    timeout: Duration,
    what: &str,
    log: &Path,
    done: impl Fn(&Held) -> bool,
) -> Held {
    let deadline = Instant::now() + timeout;
    loop {
        let held = Held::read(rt, node).await;
        if done(&held) {
            return held;
        }
        if Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            panic!(
                "not {what} within {timeout:?}: {} sandboxes, {} containers, {} pods running, leftovers {:?}\nkubelet log (last lines, newest first):\n{}",
                held.sandboxes.len(),
                held.containers.len(),
                held.running_pods(),
                held.leftovers(),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_in_a_30_pod_burst_then_restart_runs_every_pod_once() {
    // The lock first: a test holding it may have stopped containerd.
    let _lock = tokio::task::spawn_blocking(common::machine_lock)
        .await
        .expect("lock task");
    let rt = RemoteRuntime::new(ENDPOINT, None, Duration::from_secs(10)).expect("CRI client");
    rt.version().await.expect(
        "containerd must be running for this test: run deploy/setup-runtime.sh (hack/test.sh does)",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    std::fs::create_dir_all(&staging).expect("staging dir");
    let log = dir.path().join("kubelet.log");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let node = format!("burst-{:x}", std::process::id() ^ nanos);
    let cleanup = Cleanup { node: node.clone() };
    let args: Vec<String> = vec![
        format!("--container-runtime-endpoint={ENDPOINT}"),
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--root-dir={}", dir.path().join("root").display()),
        format!("--hostname-override={node}"),
        "--healthz-port=0".into(),
        "--address=127.0.0.1".into(),
        format!("--port={}", common::free_port()),
        "--read-only-port=0".into(),
        // Busy CI disks: no eviction, no image GC (as tests/harness.rs).
        "--eviction-hard=".into(),
        "--image-gc-high-threshold=100".into(),
        "--image-gc-low-threshold=99".into(),
    ];
    let mut kubelet = Kubelet::start(&args, &log);

    // 30 manifests at once: written aside, then renamed in.
    for i in 0..PODS {
        std::fs::write(
            staging.join(format!("p{i:02}.yaml")),
            manifest(&format!("p{i:02}")),
        )
        .expect("manifest");
    }
    for i in 0..PODS {
        let f = format!("p{i:02}.yaml");
        std::fs::rename(staging.join(&f), manifests.join(&f)).expect("rename manifest");
    }
    let started = Instant::now();
    let at_kill = wait_until(
        &rt,
        &node,
        Duration::from_secs(90),
        "sandboxes being created",
        &log,
        |h| h.sandboxes.len() >= KILL_AT_SANDBOXES,
    )
    .await;
    kubelet.kill9();
    let killed_at = wall_ns();
    let at_kill_after = Held::read(&rt, &node).await;
    eprintln!(
        "SIGKILL {:?} into the burst: {} sandboxes ({} ready), {} containers ({} running); just after: {} sandboxes, {} containers",
        started.elapsed(),
        at_kill.sandboxes.len(),
        at_kill.sandboxes.iter().filter(|s| Held::ready(s)).count(),
        at_kill.containers.len(),
        at_kill
            .containers
            .iter()
            .filter(|c| Held::running(c))
            .count(),
        at_kill_after.sandboxes.len(),
        at_kill_after.containers.len(),
    );
    assert!(
        at_kill_after.running_pods() < PODS,
        "killed in the middle of the burst, not after it"
    );

    eprintln!(
        "restarting {:.2}s after the kill",
        (wall_ns() - killed_at) as f64 / 1e9
    );
    let mut kubelet = Kubelet::start(&args, &log);
    let restarted = Instant::now();
    let held = wait_until(
        &rt,
        &node,
        Duration::from_secs(120),
        "every pod running",
        &log,
        |h| h.running_pods() == PODS,
    )
    .await;
    eprintln!(
        "all {PODS} pods running {:?} after the restart; leftovers then: {:?}",
        restarted.elapsed(),
        held.leftovers()
    );
    // Within a minute (container GC runs every minute), nothing left but
    // what upstream keeps; every pod still runs once.
    let clean = wait_until(
        &rt,
        &node,
        Duration::from_secs(75),
        "free of leftovers",
        &log,
        |h| h.running_pods() == PODS && h.leftovers().is_empty(),
    )
    .await;
    eprintln!(
        "no leftovers {:?} after the restart ({} sandboxes, {} containers)",
        restarted.elapsed(),
        clean.sandboxes.len(),
        clean.containers.len()
    );
    assert_eq!(clean.sandboxes.len(), PODS, "one sandbox per pod");
    let dead: Vec<String> = clean
        .containers
        .iter()
        .filter(|c| !Held::running(c))
        .map(|c| {
            let attempt = c.metadata.as_ref().map_or(0, |m| m.attempt);
            let after_kill = (c.created_at - killed_at) as f64 / 1e9;
            format!(
                "{} attempt {attempt} state {} created {after_kill:.2}s after the kill",
                c.labels["io.kubernetes.pod.name"], c.state
            )
        })
        .collect();
    eprintln!("dead containers kept (upstream keeps one per container for --previous): {dead:?}");

    // Clean up: the kubelet stops the pods whose manifests go, then exits.
    for i in 0..PODS {
        let _ = std::fs::remove_file(manifests.join(format!("p{i:02}.yaml")));
    }
    wait_until(&rt, &node, Duration::from_secs(60), "stopped", &log, |h| {
        h.containers.iter().all(|c| !Held::running(c))
    })
    .await;
    kubelet.terminate();
    drop(cleanup);
    eprintln!("test body took {:?}", started.elapsed());
}
