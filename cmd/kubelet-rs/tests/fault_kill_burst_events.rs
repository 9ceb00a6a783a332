//! Issue 20 fault case, the events side of `fault_kill_burst.rs`: the
//! kubelet-rs binary registered with the in-process apiserver double, 30
//! pods bound to its node at once, the process SIGKILLed mid-burst and
//! started again with the same flags, root dir, certificates and
//! kubeconfig; once every pod is Running and Ready (and 5 s more for the
//! event queue), the events the two processes posted are compared with what
//! the real containerd held for the pods over the whole test.
//!
//! Events the first process had queued but not posted when it died are
//! lost (upstream loses them too); duplicates are not allowed. Asserted per
//! pod and container:
//! - `Started` (summing `count`) at most the instances that ever started,
//!   and at least those the second process logged as started (it lives, so
//!   its events are not lost);
//! - `Created` at most the instances the runtime ever held (a
//!   `CreateContainer` in flight at the kill completes in containerd without
//!   an event, so never-started instances count here, not for `Started`);
//! - `Pulled`/`Pulling` each at most once per held instance, plus once per
//!   `Failed` event (each image check is followed by a create, or by a
//!   `Failed` event when the create fails, as with `failed to reserve
//!   container name` after the kill), plus one for the check in flight when
//!   the first process died;
//! - `SandboxChanged` at most once per sandbox beyond the pod's first;
//! - no two event objects with the same (involvedObject uid, fieldPath,
//!   reason, message, type) from the same process: its correlator would
//!   have patched the count of the first. Across the restart the correlator
//!   cache is gone (upstream's is in memory too), so a repeat there is a new
//!   object, bounded by the counts above. Which process posted an event is
//!   read from its name (`<object>.<wall-clock nanoseconds, hex>`), against
//!   the moment the first process was reaped and the second spawned.
//!
//! Seen on containerd 1.6, as upstream would: `RunPodSandbox` calls in
//! flight at the kill hold the sandbox name, so the second kubelet's first
//! try for those pods posts `FailedCreatePodSandBox` (`failed to reserve
//! sandbox name`) and a later sync adopts the sandbox; in-flight
//! `CreateContainer` calls likewise give `Failed` (`failed to reserve
//! container name`) and a second `Pulled` before attempt 1 is created.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use apiserver_double::{ApiServer, BOOTSTRAP_TOKEN, Options};
use cri::pb::{ContainerState, PodSandboxState};
use cri::{RemoteRuntime, RuntimeService};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");
const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const IMAGE: &str = "localhost:5000/busybox:1.35";
const PODS: usize = 30;
/// Sandboxes (any state) that exist when the kubelet is killed.
const KILL_AT_SANDBOXES: usize = 10;
const POD_LABEL: &str = "io.kubernetes.pod.name";
const CONTAINER_LABEL: &str = "io.kubernetes.container.name";

/// Wall-clock nanoseconds, as the recorder's event names and the runtime.
fn wall_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// One container instance the runtime held at some point.
struct Instance {
    pod: String,
    container: String,
    attempt: u32,
    started: bool,
}

/// What the runtime held for the node's pods, over the whole test (the
/// union of every poll: garbage collection removes instances later).
#[derive(Default)]
struct Seen {
    /// Sandbox id -> pod name.
    sandboxes: BTreeMap<String, String>,
    containers: BTreeMap<String, Instance>,
}

impl Seen {
    /// Adds what the runtime holds now; returns the node's sandboxes and
    /// ready sandboxes now.
    async fn poll(&mut self, rt: &RemoteRuntime, node: &str) -> (usize, usize) {
        let suffix = format!("-{node}");
        let ours =
            |l: &HashMap<String, String>| l.get(POD_LABEL).is_some_and(|p| p.ends_with(&suffix));
        let sandboxes = rt.list_pod_sandbox(None).await.expect("list sandboxes");
        let mut now = (0, 0);
        for s in sandboxes.iter().filter(|s| ours(&s.labels)) {
            now.0 += 1;
            if s.state == PodSandboxState::SandboxReady as i32 {
                now.1 += 1;
            }
            self.sandboxes
                .insert(s.id.clone(), s.labels[POD_LABEL].clone());
        }
        let containers = rt.list_containers(None).await.expect("list containers");
        for c in containers.iter().filter(|c| ours(&c.labels)) {
            let known = self.containers.get(&c.id).is_some_and(|i| i.started);
            if known {
                continue;
            }
            let started = if c.state == ContainerState::ContainerRunning as i32 {
                true
            } else if c.state == ContainerState::ContainerExited as i32 {
                rt.container_status(&c.id)
                    .await
                    .is_ok_and(|s| s.started_at > 0)
            } else {
                false
            };
            self.containers.insert(
                c.id.clone(),
                Instance {
                    pod: c.labels[POD_LABEL].clone(),
                    container: c.labels.get(CONTAINER_LABEL).cloned().unwrap_or_default(),
                    attempt: c.metadata.as_ref().map_or(0, |m| m.attempt),
                    started,
                },
            );
        }
        now
    }
}

/// A kubelet-rs process, its stderr in a file; killed when dropped.
struct Kubelet {
    child: Child,
}

impl Kubelet {
    fn start(args: &[String], log: &Path) -> Kubelet {
        let err = File::create(log).expect("log file");
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

/// Removes every sandbox of the node's pods and their log directories when
/// dropped, even after a failure (declared before the kubelets, so dropped
/// after them).
struct Cleanup {
    node: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let suffix = format!("-{}", self.node);
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
                for s in cri.list_pod_sandbox(None).await.unwrap_or_default() {
                    if s.labels
                        .get(POD_LABEL)
                        .is_some_and(|p| p.ends_with(&suffix))
                    {
                        let _ = cri.stop_pod_sandbox(&s.id).await;
                        let _ = cri.remove_pod_sandbox(&s.id).await;
                    }
                }
            });
            if let Ok(dirs) = std::fs::read_dir("/var/log/pods") {
                for d in dirs.flatten() {
                    if d.file_name()
                        .to_string_lossy()
                        .contains(&format!("{suffix}_"))
                    {
                        let _ = std::fs::remove_dir_all(d.path());
                    }
                }
            }
        })
        .join();
    }
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]}
    }))
    .expect("pod")
}

fn running_and_ready(p: Option<Value>) -> bool {
    p.is_some_and(|p| {
        p["status"]["phase"] == "Running"
            && p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    })
}

fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One event object of the test's pods.
struct Ev {
    pod: String,
    field_path: String,
    reason: String,
    message: String,
    kind: String,
    count: i64,
    /// 1 or 2: which kubelet process posted it; 0 if the name does not say.
    process: u8,
}

impl Ev {
    fn read(
        e: &Value,
        pods: &BTreeMap<String, String>,
        killed: i128,
        restarted: i128,
    ) -> Option<Ev> {
        let uid = e["involvedObject"]["uid"].as_str()?;
        let pod = pods.get(uid)?.clone();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let at = e["metadata"]["name"]
            .as_str()
            .and_then(|n| n.rsplit_once('.'))
            .and_then(|(_, hex)| i128::from_str_radix(hex, 16).ok());
        let process = match at {
            Some(t) if t < killed => 1,
            Some(t) if t > restarted => 2,
            _ => 0,
        };
        Some(Ev {
            pod,
            field_path: text(&e["involvedObject"]["fieldPath"]),
            reason: text(&e["reason"]),
            message: text(&e["message"]),
            kind: text(&e["type"]),
            count: e["count"].as_i64().unwrap_or(1),
            process,
        })
    }
}

/// What was wrong, one line each, and a per-pod account for the failure
/// message.
fn check(names: &[String], events: &[Ev], seen: &Seen, second_log: &str) -> (Vec<String>, String) {
    let mut bad = vec![];
    let mut account = String::new();
    let started_by_second: Vec<&str> = second_log
        .lines()
        .filter(|l| l.contains("Started container"))
        .collect();
    if started_by_second.is_empty() {
        bad.push("the second kubelet logged no `Started container` line".into());
    }
    let mut groups: BTreeMap<(&str, &str, &str, &str, &str, u8), usize> = BTreeMap::new();
    for e in events.iter().filter(|e| e.process != 0) {
        let key = (
            e.pod.as_str(),
            e.field_path.as_str(),
            e.reason.as_str(),
            e.message.as_str(),
            e.kind.as_str(),
            e.process,
        );
        *groups.entry(key).or_default() += 1;
    }
    for ((pod, fp, reason, message, _, process), n) in groups {
        if n > 1 {
            bad.push(format!(
                "{pod}: {n} objects for {fp:?} {reason} {message:?} from process {process} (its correlator would have counted them in one)"
            ));
        }
    }
    for name in names {
        let evs: Vec<&Ev> = events.iter().filter(|e| e.pod == *name).collect();
        let sum = |reason: &str, fp: Option<&str>| -> i64 {
            evs.iter()
                .filter(|e| e.reason == reason && fp.is_none_or(|f| e.field_path == f))
                .map(|e| e.count)
                .sum()
        };
        let sandboxes = seen.sandboxes.values().filter(|p| *p == name).count();
        let changed = sum("SandboxChanged", None);
        if changed > sandboxes.saturating_sub(1) as i64 {
            bad.push(format!(
                "{name}: {changed} SandboxChanged for {sandboxes} sandboxes ever"
            ));
        }
        account.push_str(&format!("{name}: {sandboxes} sandboxes ever\n"));
        let fp = "spec.containers{c}";
        let instances: Vec<(&String, &Instance)> = seen
            .containers
            .iter()
            .filter(|(_, i)| i.pod == *name && i.container == "c")
            .collect();
        let held = instances.len() as i64;
        let started = instances.iter().filter(|(_, i)| i.started).count() as i64;
        let by_second = instances
            .iter()
            .filter(|(id, _)| started_by_second.iter().any(|l| l.contains(id.as_str())))
            .count() as i64;
        let (ev_started, ev_created) = (sum("Started", Some(fp)), sum("Created", Some(fp)));
        let (pulled, pulling) = (sum("Pulled", Some(fp)), sum("Pulling", Some(fp)));
        let failed = sum("Failed", Some(fp));
        if ev_started > started || ev_started < by_second {
            bad.push(format!(
                "{name}: {ev_started} Started events for {started} started instances ({by_second} started by the second kubelet)"
            ));
        }
        if ev_created > held {
            bad.push(format!(
                "{name}: {ev_created} Created events for {held} instances ever held"
            ));
        }
        for (reason, n) in [("Pulled", pulled), ("Pulling", pulling)] {
            if n > held + failed + 1 {
                bad.push(format!(
                    "{name}: {n} {reason} events for {held} instances and {failed} Failed"
                ));
            }
        }
        for (id, i) in &instances {
            account.push_str(&format!(
                "  instance {} attempt {} started {} (second kubelet: {})\n",
                &id[..12.min(id.len())],
                i.attempt,
                i.started,
                started_by_second.iter().any(|l| l.contains(id.as_str()))
            ));
        }
        for e in &evs {
            account.push_str(&format!(
                "  event p{} {} {:?} {} x{}: {}\n",
                e.process, e.kind, e.field_path, e.reason, e.count, e.message
            ));
        }
    }
    (bad, account)
}

async fn admin_client(api: &ApiServer, dir: &Path) -> kube::Client {
    let path = dir.join("admin.conf");
    api.write_admin_kubeconfig(&path).expect("admin kubeconfig");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_in_a_30_pod_burst_then_restart_posts_no_duplicate_events() {
    // The lock first: a test holding it may have stopped containerd.
    let _lock = tokio::task::spawn_blocking(common::machine_lock)
        .await
        .expect("lock task");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = RemoteRuntime::new(ENDPOINT, None, Duration::from_secs(10)).expect("CRI client");
    rt.version().await.expect(
        "containerd must be running for this test: run deploy/setup-runtime.sh (hack/test.sh does)",
    );
    let api = ApiServer::start(Options::default()).await.expect("double");
    let dir = tempfile::tempdir().expect("tempdir");
    let bootstrap = dir.path().join("bootstrap.conf");
    api.write_token_kubeconfig(&bootstrap, BOOTSTRAP_TOKEN)
        .expect("bootstrap kubeconfig");
    let admin = admin_client(&api, dir.path()).await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let node = format!("evburst-{:x}", std::process::id() ^ nanos);
    let cleanup = Cleanup { node: node.clone() };
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", dir.path().join("kubelet.conf").display()),
        format!("--bootstrap-kubeconfig={}", bootstrap.display()),
        format!("--cert-dir={}", dir.path().join("pki").display()),
        format!("--root-dir={}", dir.path().join("root").display()),
        format!("--container-runtime-endpoint={ENDPOINT}"),
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
    let (log1, log2) = (
        dir.path().join("kubelet-1.log"),
        dir.path().join("kubelet-2.log"),
    );
    let mut kubelet = Kubelet::start(&args, &log1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.get("nodes", "", &node).is_none() {
        assert!(
            Instant::now() < deadline,
            "node did not register:\n{}",
            tail(&log1, 60)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 30 pods bound to the node at once.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let names: Vec<String> = (0..PODS).map(|i| format!("p{i:02}-{node}")).collect();
    let creates = names.iter().map(|name| {
        let pods = pods.clone();
        let p = pod(name, &node);
        async move { pods.create(&PostParams::default(), &p).await }
    });
    let started = Instant::now();
    let mut uids = BTreeMap::new();
    for p in futures::future::join_all(creates).await {
        let p = p.expect("create pod");
        uids.insert(
            p.metadata.uid.unwrap_or_default(),
            p.metadata.name.unwrap_or_default(),
        );
    }
    let mut seen = Seen::default();
    loop {
        let (n, _) = seen.poll(&rt, &node).await;
        if n >= KILL_AT_SANDBOXES {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "only {n} sandboxes after 90 s:\n{}",
            tail(&log1, 60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kubelet.kill9();
    let killed = wall_ns();
    let (n, ready) = seen.poll(&rt, &node).await;
    let events_then = api.list("events").len();
    eprintln!(
        "SIGKILL {:?} into the burst: {n} sandboxes ({ready} ready), {} containers seen, {events_then} events in the API",
        started.elapsed(),
        seen.containers.len()
    );
    let restarted = wall_ns();
    let mut kubelet = Kubelet::start(&args, &log2);
    let restart = Instant::now();
    loop {
        seen.poll(&rt, &node).await;
        let n = names
            .iter()
            .filter(|name| running_and_ready(api.get("pods", "default", name)))
            .count();
        if n == PODS {
            break;
        }
        assert!(
            restart.elapsed() < Duration::from_secs(180),
            "only {n}/{PODS} pods Running and Ready 180 s after the restart:\n{}",
            tail(&log2, 60)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "all {PODS} pods Running and Ready {:?} after the restart",
        restart.elapsed()
    );
    // The event queue drains (and the runtime is watched) for 5 s more,
    // then until the checks hold (the second kubelet's events may lag on a
    // loaded machine), 60 s at most.
    let settle = Instant::now();
    let (events, bad, account) = loop {
        seen.poll(&rt, &node).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        if settle.elapsed() < Duration::from_secs(5) {
            continue;
        }
        let events: Vec<Ev> = api
            .list("events")
            .iter()
            .filter_map(|e| Ev::read(e, &uids, killed, restarted))
            .collect();
        let second_log = std::fs::read_to_string(&log2).unwrap_or_default();
        let (bad, account) = check(&names, &events, &seen, &second_log);
        if bad.is_empty() || settle.elapsed() > Duration::from_secs(60) {
            break (events, bad, account);
        }
    };
    let unknown = events.iter().filter(|e| e.process == 0).count();
    let mut reasons: BTreeMap<(u8, &str), i64> = BTreeMap::new();
    for e in &events {
        *reasons.entry((e.process, &e.reason)).or_default() += e.count;
    }
    eprintln!("events (process, reason) -> count: {reasons:?}");
    let mut warnings: BTreeMap<(u8, &str, &str), i64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind != "Normal") {
        // Up to the first quote: without the pod's names.
        let m = e.message.split('"').next().unwrap_or_default();
        *warnings.entry((e.process, &e.reason, m)).or_default() += e.count;
    }
    for ((process, reason, message), n) in &warnings {
        eprintln!("  process {process}: {n} x {reason}: {message}");
    }
    eprintln!(
        "{} events of the pods ({unknown} not attributable to a process), {} sandboxes and {} containers ever held",
        events.len(),
        seen.sandboxes.len(),
        seen.containers.len()
    );

    // Clean up before asserting: the kubelet finishes the deleted pods.
    for name in &names {
        let _ = pods.delete(name, &Default::default()).await;
    }
    let gone = Instant::now();
    while gone.elapsed() < Duration::from_secs(60)
        && names
            .iter()
            .any(|n| api.get("pods", "default", n).is_some())
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    kubelet.terminate();
    drop(cleanup);
    assert!(
        bad.is_empty() && unknown == 0,
        "duplicate or unexplained events:\n{}\n{unknown} events not attributable\nper pod:\n{account}",
        bad.join("\n")
    );
    eprintln!("test body took {:?}", started.elapsed());
}
