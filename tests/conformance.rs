//! Shared machinery for the reproductions of upstream's `[NodeConformance]`
//! e2e specs (`test/e2e/common/{storage,node}`, `test/e2e/auth`), see
//! `docs/conformance-volumes.md`.
//!
//! Upstream's specs run agnhost's `mounttest` and check its output with
//! `e2epodoutput.TestContainerOutput` (the pod reaches `Succeeded`, then each
//! expected substring is in the container's log). Here every spec file runs
//! ONE joined kubelet ([`Suite`]), creates all its pods at once, waits for
//! them together, and reports every failed spec in one assertion.
//! [`MOUNTTEST`] is a busybox shell emulation of `mounttest` that takes the
//! same arguments and prints the same lines (Go's `os.FileMode` strings,
//! `tmpfs` for the tmpfs magic, the other filesystem magics in decimal).

use std::collections::BTreeMap;

use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::{Value, json};

#[path = "conformance_flows.rs"]
mod flows;
#[path = "conformance_pods.rs"]
mod pods;
#[path = "conformance_teardown.rs"]
mod teardown;
pub use flows::*;
pub use pods::*;

use crate::cluster::Joined;

/// How long a pod of a spec may take to start and finish.
pub const POD_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for an API change (configMap, secret, pod metadata) to show in a
/// mounted file. The kubelet propagates changes through its watches (within
/// 2 s); this is a generous bound against hangs, not a timing assertion, but
/// it is well under upstream's 60 s resync, so a kubelet without watches fails.
pub const UPDATE_TIMEOUT: Duration = Duration::from_secs(30);
/// The namespace pods and objects live in.
pub const NS: &str = "default";

/// One joined kubelet running the specs of one upstream file.
pub struct Suite {
    /// The kubelet, the double and an admin client.
    pub j: Joined,
    failures: Mutex<Vec<String>>,
    pods: Mutex<Vec<String>>,
    /// Serializes the room check and the create (one scheduler).
    binding: tokio::sync::Mutex<()>,
}

impl Suite {
    /// Starts a double and a kubelet joined to it.
    pub async fn start() -> Suite {
        Self::start_with(Options::default()).await
    }

    /// [`Suite::start`] with the double's options.
    pub async fn start_with(options: Options) -> Suite {
        Suite {
            j: Joined::start(options).await,
            failures: Mutex::new(Vec::new()),
            pods: Mutex::new(Vec::new()),
            binding: tokio::sync::Mutex::new(()),
        }
    }

    /// The API name of pod `short` (suffixed with the node name).
    pub fn name(&self, short: &str) -> String {
        self.j.pod_name(short)
    }

    /// Records a failed spec.
    pub fn fail(&self, spec: &str, msg: impl std::fmt::Display) {
        self.failures.lock().push(format!("[{spec}] {msg}"));
    }

    /// Creates a configMap in `ns` (the name is used as is).
    pub async fn config_map(
        &self,
        ns: &str,
        name: &str,
        data: &[(&str, &str)],
        binary: &[(&str, &[u8])],
    ) {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            binary_data: (!binary.is_empty()).then(|| {
                binary
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect()
            }),
            ..Default::default()
        };
        Api::<ConfigMap>::namespaced(self.j.admin.clone(), ns)
            .create(&PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("create configMap {ns}/{name}: {e}"));
    }

    /// Replaces a configMap's data (an update, as upstream's specs do).
    pub async fn update_config_map(&self, ns: &str, name: &str, data: &[(&str, &str)]) {
        let api = Api::<ConfigMap>::namespaced(self.j.admin.clone(), ns);
        let mut cm = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get configMap {name}: {e}"));
        cm.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        api.replace(name, &PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("update configMap {name}: {e}"));
    }

    /// Deletes a configMap.
    pub async fn delete_config_map(&self, ns: &str, name: &str) {
        Api::<ConfigMap>::namespaced(self.j.admin.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete configMap {name}: {e}"));
    }

    /// Creates a secret in `ns`.
    pub async fn secret(&self, ns: &str, name: &str, data: &[(&str, &[u8])]) {
        let s = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            data: Some(secret_data(data)),
            ..Default::default()
        };
        Api::<Secret>::namespaced(self.j.admin.clone(), ns)
            .create(&PostParams::default(), &s)
            .await
            .unwrap_or_else(|e| panic!("create secret {ns}/{name}: {e}"));
    }

    /// Replaces a secret's data.
    pub async fn update_secret(&self, ns: &str, name: &str, data: &[(&str, &[u8])]) {
        let api = Api::<Secret>::namespaced(self.j.admin.clone(), ns);
        let mut s = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get secret {name}: {e}"));
        s.data = Some(secret_data(data));
        api.replace(name, &PostParams::default(), &s)
            .await
            .unwrap_or_else(|e| panic!("update secret {name}: {e}"));
    }

    /// Deletes a secret.
    pub async fn delete_secret(&self, ns: &str, name: &str) {
        Api::<Secret>::namespaced(self.j.admin.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete secret {name}: {e}"));
    }

    /// Creates pod `short` bound to the node from `{"metadata": {...}, "spec": {...}}`
    /// (name, namespace and nodeName are filled in). A refusal is a failed spec.
    pub async fn pod(&self, spec_name: &str, short: &str, pod: Value) -> bool {
        let mut pod = pod;
        let name = self.name(short);
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["namespace"] = json!(NS);
        pod["spec"]["nodeName"] = json!(self.j.node.name);
        let p: Pod = match serde_json::from_value(pod) {
            Ok(p) => p,
            Err(e) => panic!("pod {short}: {e}"),
        };
        self.pods.lock().push(name.clone());
        // Check and bind one pod at a time, so two pods never take the same room.
        let bound = {
            let _one = self.binding.lock().await;
            self.wait_for_room(&p).await;
            Api::<Pod>::namespaced(self.j.admin.clone(), NS)
                .create(&PostParams::default(), &p)
                .await
        };
        match bound {
            Ok(_) => true,
            Err(e) => {
                self.fail(spec_name, format!("creating pod {name}: {e}"));
                false
            }
        }
    }

    /// Acts as the scheduler would before binding `p` to the node: waits
    /// (bounded) until its cpu and memory requests fit the node's
    /// allocatable next to the active pods already bound there. The specs
    /// of a file run at once, and a small CI node cannot hold all their
    /// requests together; the kubelet would rightly reject the excess
    /// (`OutOfcpu`), which upstream's scheduler never lets happen.
    async fn wait_for_room(&self, p: &Pod) {
        use kubelet_types::quantity::Quantity;
        let amount = |name: &str, v: &Value| -> i64 {
            let q = v.as_str().and_then(|s| Quantity::parse(s).ok());
            match (name, q) {
                ("cpu", Some(q)) => q.milli_value(),
                (_, Some(q)) => q.value(),
                _ => 0,
            }
        };
        let requests = |pod: &Value, name: &str| -> i64 {
            pod["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| amount(name, &c["resources"]["requests"][name]))
                .sum()
        };
        let Ok(want) = serde_json::to_value(p) else {
            return;
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while tokio::time::Instant::now() < deadline {
            let node = self
                .j
                .api
                .get("nodes", "", &self.j.node.name)
                .unwrap_or(Value::Null);
            let fits = ["cpu", "memory"].iter().all(|r| {
                let asked = requests(&want, r);
                if asked == 0 {
                    return true;
                }
                let used: i64 = self
                    .j
                    .api
                    .list("pods")
                    .iter()
                    .filter(|o| o["spec"]["nodeName"] == self.j.node.name.as_str())
                    .filter(|o| {
                        !matches!(o["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                    })
                    .map(|o| requests(o, r))
                    .sum();
                asked + used <= amount(r, &node["status"]["allocatable"][*r])
            });
            if fits {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Merge-patches pod `short` (labels, annotations).
    pub async fn patch_pod(&self, short: &str, patch: Value) {
        Api::<Pod>::namespaced(self.j.admin.clone(), NS)
            .patch(
                &self.name(short),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .unwrap_or_else(|e| panic!("patch pod {short}: {e}"));
    }

    /// The stored pod.
    pub fn api_pod(&self, short: &str) -> Option<Value> {
        self.j.api_pod(short)
    }

    /// The stored pod's phase.
    pub fn phase(&self, short: &str) -> String {
        self.api_pod(short)
            .and_then(|p| p["status"]["phase"].as_str().map(String::from))
            .unwrap_or_default()
    }

    /// Waits (bounded by `timeout`) until each of `shorts` is in a phase `done` accepts.
    pub async fn wait_all(&self, shorts: &[&str], timeout: Duration, done: fn(&str) -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline && !shorts.iter().all(|s| done(&self.phase(s)))
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The container's log as `kubectl logs` shows it (both streams, CRI
    /// prefixes stripped, partial lines joined), from the kubelet's CRI log
    /// file under `podLogsDir` (the latest instance).
    pub fn log(&self, short: &str, container: &str) -> Option<String> {
        let uid = self.api_pod(short)?["metadata"]["uid"]
            .as_str()?
            .to_string();
        let dir = crate::pod_logs_dir()
            .join(format!("{NS}_{}_{uid}", self.name(short)))
            .join(container);
        let newest = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| {
                let p = e.ok()?.path();
                let n: u64 = p
                    .file_name()?
                    .to_str()?
                    .strip_suffix(".log")?
                    .parse()
                    .ok()?;
                Some((n, p))
            })
            .max_by_key(|(n, _)| *n)?;
        let raw = std::fs::read(newest.1).ok()?;
        Some(parse_cri_log(&raw))
    }

    /// Upstream's `TestContainerOutput`: the pod `Succeeded`, then each want holds for the log.
    pub fn expect_output(&self, spec: &str, short: &str, container: &str, wants: &[Want]) {
        let phase = self.phase(short);
        let log = self.log(short, container).unwrap_or_default();
        if phase != "Succeeded" {
            self.fail(
                spec,
                format!(
                    "pod {short}: phase {phase:?}, not Succeeded; {}; log: {log:?}",
                    self.describe(short)
                ),
            );
            return;
        }
        for w in wants {
            if !w.holds(&log) {
                self.fail(
                    spec,
                    format!(
                        "pod {short} container {container}: expected {} in the log: {log:?}",
                        w.describe()
                    ),
                );
            }
        }
    }

    /// Polls the container's log until `want` holds (upstream's `Eventually(pollLogs)`).
    pub async fn eventually_log(
        &self,
        spec: &str,
        short: &str,
        container: &str,
        want: Want,
        timeout: Duration,
    ) -> bool {
        let start = tokio::time::Instant::now();
        let deadline = start + timeout;
        loop {
            let log = self.log(short, container).unwrap_or_default();
            if want.holds(&log) {
                // Shown with --nocapture: how long the change took to reach the log
                // (the container reads its file every second).
                eprintln!(
                    "[{spec}] {short}/{container}: {} after {:?}",
                    want.describe(),
                    start.elapsed()
                );
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                self.fail(
                    spec,
                    format!(
                        "pod {short} container {container}: {} not in the log within {timeout:?}; phase {:?}; {}; log: {log:?}",
                        want.describe(),
                        self.phase(short),
                        self.describe(short)
                    ),
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until pod `short` is Running (all containers started), or fails the spec.
    pub async fn wait_running(&self, spec: &str, short: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.phase(short) == "Running" {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                self.fail(
                    spec,
                    format!(
                        "pod {short}: not Running within {timeout:?}; {}",
                        self.describe(short)
                    ),
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Events about pod `short`: (type, reason, message).
    pub fn events(&self, short: &str) -> Vec<(String, String, String)> {
        let name = self.name(short);
        self.j
            .api
            .list("events")
            .iter()
            .filter(|e| e["involvedObject"]["name"] == name.as_str())
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                (s("type"), s("reason"), s("message"))
            })
            .collect()
    }

    /// Waits for a `FailedMount` warning naming `volume` and containing
    /// `want`; the pod must be Pending then (check again later with
    /// [`Suite::still_pending`]: upstream's `Consistently(BeInPhase(Pending))`).
    pub async fn expect_failed_mount(&self, spec: &str, short: &str, volume: &str, want: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
        loop {
            let hit = self.events(short).into_iter().any(|(t, r, m)| {
                t == "Warning"
                    && r == "FailedMount"
                    && m.contains(&format!("volume \"{volume}\""))
                    && m.contains(want)
            });
            if hit {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                self.fail(
                    spec,
                    format!(
                        "no FailedMount event for volume {volume:?} containing {want:?}; phase {:?}; {}",
                        self.phase(short),
                        self.describe(short)
                    ),
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // The status patch and the event travel separately: give the status
        // the event's head start before checking it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.creating(short) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.still_pending(spec, short);
    }

    /// Whether the pod's containers are all reported waiting in ContainerCreating.
    fn creating(&self, short: &str) -> bool {
        self.api_pod(short).is_some_and(|p| {
            p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|cs| {
                    !cs.is_empty()
                        && cs
                            .iter()
                            .all(|c| c["state"]["waiting"]["reason"] == "ContainerCreating")
                })
        })
    }

    /// The pod is (still) Pending, its containers waiting in ContainerCreating.
    pub fn still_pending(&self, spec: &str, short: &str) {
        let phase = self.phase(short);
        // Containers of a pod whose volumes are not set up are reported
        // waiting with ContainerCreating (upstream's status generation).
        let creating = self.creating(short);
        if phase != "Pending" || !creating {
            self.fail(
                spec,
                format!(
                    "pod {short}: phase {phase:?}, expected it to stay Pending with its containers ContainerCreating; {}",
                    self.describe(short)
                ),
            );
        }
    }

    /// Phase, container states and events of a pod, for failure messages.
    pub fn describe(&self, short: &str) -> String {
        let p = self.api_pod(short).unwrap_or(Value::Null);
        let states: Vec<String> = ["initContainerStatuses", "containerStatuses"]
            .iter()
            .flat_map(|k| p["status"][*k].as_array().cloned().unwrap_or_default())
            .map(|c| format!("{}={}", c["name"].as_str().unwrap_or("?"), c["state"]))
            .collect();
        format!("containers {states:?}; events {:?}", self.events(short))
    }

    /// The runtime ID of `container` in pod `short`.
    pub fn container_id(&self, short: &str, container: &str) -> Option<String> {
        let p = self.api_pod(short)?;
        p["status"]["containerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == container)?["containerID"]
            .as_str()?
            .strip_prefix("containerd://")
            .map(String::from)
    }

    /// Runs `cmd` in a running container (CRI ExecSync): exit code, stdout, stderr.
    pub async fn exec(
        &self,
        short: &str,
        container: &str,
        cmd: &[&str],
    ) -> anyhow::Result<(i32, String, String)> {
        use cri::RuntimeService;
        let id = self
            .container_id(short, container)
            .ok_or_else(|| anyhow::anyhow!("no container {container} in pod {short}"))?;
        let r = self
            .j
            .node
            .runtime
            .exec_sync(
                &id,
                cmd.iter().map(|s| s.to_string()).collect(),
                Duration::from_secs(20),
            )
            .await?;
        Ok((
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).to_string(),
            String::from_utf8_lossy(&r.stderr).to_string(),
        ))
    }
}

fn secret_data(data: &[(&str, &[u8])]) -> BTreeMap<String, ByteString> {
    data.iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
        .collect()
}
