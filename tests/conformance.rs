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
use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::BUSYBOX;
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

/// agnhost `mounttest` (test/images/agnhost/mounttest) as a busybox script:
/// run as `sh -c MOUNTTEST mounttest --flag=... ...` (upstream's args, with
/// `mounttest` as `$0`). Same flags, same order of actions, same output lines.
/// It avoids `$(...)` and `$$` (the kubelet expands `$(VAR)` in commands).
pub const MOUNTTEST: &str = r#"fs_type= file_mode= file_perm= file_owner= n644= n666= n660= n777= content= loop= retry=180 brk=true
for a in "$@"; do
  v=${a#*=}
  case "$a" in
    --fs_type=*) fs_type=$v ;;
    --file_mode=*) file_mode=$v ;;
    --file_perm=*) file_perm=$v ;;
    --file_owner=*) file_owner=$v ;;
    --new_file_0644=*) n644=$v ;;
    --new_file_0666=*) n666=$v ;;
    --new_file_0660=*) n660=$v ;;
    --new_file_0777=*) n777=$v ;;
    --file_content=*) content=$v ;;
    --file_content_in_loop=*) loop=$v ;;
    --retry_time=*) retry=$v ;;
    --break_on_expected_content=*) brk=$v ;;
  esac
done
umask 0
rc=0
initial='mount-tester new file
'
gomode() {
  m=$1 s=
  if [ "$2" = full ]; then
    t=$((m & 61440))
    [ $t -eq 16384 ] && s=${s}d
    [ $t -eq 40960 ] && s=${s}L
    [ $t -eq 24576 ] || [ $t -eq 8192 ] && s=${s}D
    [ $t -eq 4096 ] && s=${s}p
    [ $t -eq 49152 ] && s=${s}S
    [ $((m & 2048)) -ne 0 ] && s=${s}u
    [ $((m & 1024)) -ne 0 ] && s=${s}g
    [ $t -eq 8192 ] && s=${s}c
    [ $((m & 512)) -ne 0 ] && s=${s}t
  fi
  [ -n "$s" ] || s=-
  for b in 256:r 128:w 64:x 32:r 16:w 8:x 4:r 2:w 1:x; do
    if [ $((m & ${b%:*})) -ne 0 ]; then s=$s${b#*:}; else s=$s-; fi
  done
  printf '%s' "$s"
}
rawmode() { m=`stat -L -c %f "$1" 2>/dev/null` && echo $((0x$m)); }
content_of() {
  if c=`cat "$1" 2>/dev/null && echo x`; then
    printf 'content of file "%s": %s\n' "$1" "${c%x}"
  else
    printf 'error reading file content for "%s": open %s: no such file or directory\n' "$1" "$1"
    rc=1
  fi
}
if [ -n "$fs_type" ]; then
  if t=`stat -f -c %t "$fs_type" 2>/dev/null`; then
    t=$((0x$t))
    [ $t -eq 16914836 ] && t=tmpfs
    printf 'mount type of "%s": %s\n' "$fs_type" "$t"
  else
    printf 'error from statfs("%s"): no such file or directory\n' "$fs_type"; rc=1
  fi
fi
for nf in 644:$n644 666:$n666 660:$n660 777:$n777; do
  p=${nf#*:}
  [ -n "$p" ] || continue
  if printf '%s' "$initial" > "$p" && chmod "${nf%%:*}" "$p"; then
    content_of "$p"
  else
    printf 'error writing new file "%s": open %s: permission denied\n' "$p" "$p"; rc=1
  fi
done
if [ -n "$file_mode" ]; then
  if m=`rawmode "$file_mode"`; then
    printf 'mode of file "%s": %s\n' "$file_mode" "`gomode $m full`"
  else
    printf 'error from Stat("%s"): stat %s: no such file or directory\n' "$file_mode" "$file_mode"; rc=1
  fi
fi
if [ -n "$file_perm" ]; then
  if m=`rawmode "$file_perm"`; then
    printf 'perms of file "%s": %s\n' "$file_perm" "`gomode $m perm`"
  else
    printf 'error from Stat("%s"): stat %s: no such file or directory\n' "$file_perm" "$file_perm"; rc=1
  fi
fi
if [ -n "$file_owner" ]; then
  if u=`stat -L -c %u "$file_owner" 2>/dev/null`; then
    printf 'owner UID of "%s": %s\n' "$file_owner" "$u"
    printf 'owner GID of "%s": %s\n' "$file_owner" "`stat -L -c %g "$file_owner"`"
  else
    printf 'error from stat("%s"): no such file or directory\n' "$file_owner"; rc=1
  fi
fi
[ -z "$content" ] || content_of "$content"
if [ -n "$loop" ]; then
  start=`date +%s` lrc=0
  while [ $((`date +%s` - start)) -lt "$retry" ]; do
    if c=`cat "$loop" 2>/dev/null && echo x`; then
      lrc=0
      printf 'content of file "%s": %s\n' "$loop" "${c%x}"
      if [ "$brk" = true ]; then
        [ "${c%x}" = "$initial" ] && break
        printf 'Unexpected content. Expected: %s. Retrying\n' "$initial"
      fi
    else
      lrc=1
      printf 'Error reading file %s: open %s: no such file or directory, retrying\n' "$loop" "$loop"
    fi
    sleep 1
  done
  [ $lrc -eq 0 ] || rc=1
fi
exit $rc
"#;

/// A container running [`MOUNTTEST`] with upstream's `args` (without the
/// leading `mounttest`) and `volumeMounts`.
pub fn mounttest(name: &str, args: &[&str], mounts: Value) -> Value {
    let mut a = vec!["mounttest".to_string()];
    a.extend(args.iter().map(|s| s.to_string()));
    json!({
        "name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", MOUNTTEST], "args": a, "volumeMounts": mounts,
    })
}

/// A busybox container running `command`.
pub fn busybox(name: &str, command: &[&str]) -> Value {
    json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": command})
}

/// One `volumeMounts` entry.
pub fn mount(volume: &str, path: &str, read_only: bool) -> Value {
    json!({"name": volume, "mountPath": path, "readOnly": read_only})
}

/// What a container's log must show.
pub enum Want {
    /// A substring (upstream's `ContainSubstring`).
    Has(String),
    /// Some line satisfies a predicate (upstream's regular expressions).
    Line(String, fn(&str) -> bool),
}

impl Want {
    /// A substring.
    pub fn has(s: impl Into<String>) -> Want {
        Want::Has(s.into())
    }

    fn holds(&self, log: &str) -> bool {
        match self {
            Want::Has(s) => log.contains(s.as_str()),
            Want::Line(_, p) => log.lines().any(p),
        }
    }

    fn describe(&self) -> String {
        match self {
            Want::Has(s) => format!("{s:?}"),
            Want::Line(d, _) => format!("a line matching {d}"),
        }
    }
}

/// Upstream's `getFileModeRegex` on Linux: `mode of file "<path>": <mode>`.
pub fn file_mode(path: &str, mode: &str) -> Want {
    Want::has(format!("mode of file \"{path}\": {mode}"))
}

/// One joined kubelet running the specs of one upstream file.
pub struct Suite {
    /// The kubelet, the double and an admin client.
    pub j: Joined,
    failures: Mutex<Vec<String>>,
    pods: Mutex<Vec<String>>,
}

impl Suite {
    /// Starts a double and a kubelet joined to it.
    pub async fn start() -> Suite {
        Suite {
            j: Joined::start(Options::default()).await,
            failures: Mutex::new(Vec::new()),
            pods: Mutex::new(Vec::new()),
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
        match Api::<Pod>::namespaced(self.j.admin.clone(), NS)
            .create(&PostParams::default(), &p)
            .await
        {
            Ok(_) => true,
            Err(e) => {
                self.fail(spec_name, format!("creating pod {name}: {e}"));
                false
            }
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
    /// file under `/var/log/pods` (the latest instance).
    pub fn log(&self, short: &str, container: &str) -> Option<String> {
        let uid = self.api_pod(short)?["metadata"]["uid"]
            .as_str()?
            .to_string();
        let dir = Path::new("/var/log/pods")
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
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let log = self.log(short, container).unwrap_or_default();
            if want.holds(&log) {
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
        self.still_pending(spec, short);
    }

    /// The pod is (still) Pending.
    pub fn still_pending(&self, spec: &str, short: &str) {
        let phase = self.phase(short);
        if phase != "Pending" {
            self.fail(
                spec,
                format!(
                    "pod {short}: phase {phase:?}, expected it to stay Pending; {}",
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

    /// Deletes every pod the suite created, waits (bounded) for the kubelet to
    /// confirm, checks no volume of this kubelet stays mounted, stops the
    /// kubelet and fails with every failed spec.
    pub async fn finish(self, file: &str) {
        let pods = self.pods.lock().clone();
        let api = Api::<Pod>::namespaced(self.j.admin.clone(), NS);
        for p in &pods {
            let _ = api
                .delete(p, &DeleteParams::default().grace_period(0))
                .await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let left = loop {
            let left: Vec<&String> = pods
                .iter()
                .filter(|p| self.j.api.get("pods", NS, p).is_some())
                .collect();
            if left.is_empty() || tokio::time::Instant::now() >= deadline {
                break left.into_iter().cloned().collect::<Vec<_>>();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        if !left.is_empty() {
            self.fail(
                "teardown",
                format!("pods not deleted by the kubelet within 60s: {left:?}"),
            );
        }
        // Upstream's status manager deletes the object only once the pod's
        // volumes are torn down: nothing of the kubelet's may stay mounted.
        let root = self.j.node.root_dir();
        let mounted = mounts_under(&root);
        if left.is_empty() && !mounted.is_empty() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            while tokio::time::Instant::now() < deadline && !mounts_under(&root).is_empty() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let still = mounts_under(&root);
            let when = if still.is_empty() {
                "unmounted only after the kubelet confirmed the pods' deletion".to_string()
            } else {
                format!("{} still mounted 15s later", still.len())
            };
            self.fail(
                "teardown",
                format!("volumes mounted when the pods were deleted ({when}): {mounted:?}"),
            );
        }
        let failures = self.failures.lock().clone();
        self.j.cleanup().await;
        for m in mounts_under(&root).iter().rev() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(m)
                .status();
        }
        for p in &pods {
            remove_pod_logs(p);
        }
        assert!(
            failures.is_empty(),
            "{file}: {} failure(s):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

fn secret_data(data: &[(&str, &[u8])]) -> BTreeMap<String, ByteString> {
    data.iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
        .collect()
}

/// Mount points at or under `root` (from /proc/self/mountinfo).
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(root))
        .collect()
}

fn remove_pod_logs(pod: &str) {
    let prefix = format!("{NS}_{pod}_");
    if let Ok(rd) = std::fs::read_dir("/var/log/pods") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A CRI log file (`<time> <stream> <P|F> <text>` lines) as the log text.
pub fn parse_cri_log(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    for line in text.split('\n').filter(|l| !l.is_empty()) {
        let mut it = line.splitn(4, ' ');
        let (_ts, _stream, tag) = (it.next(), it.next(), it.next());
        out.push_str(it.next().unwrap_or(""));
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}

/// Phase predicates for [`Suite::wait_all`].
pub fn terminal(phase: &str) -> bool {
    matches!(phase, "Succeeded" | "Failed")
}

/// Running or finished.
pub fn started(phase: &str) -> bool {
    matches!(phase, "Running" | "Succeeded" | "Failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_lines_are_joined() {
        let raw = b"2024-01-01T00:00:00Z stdout P abc\n2024-01-01T00:00:00Z stdout F def\n2024-01-01T00:00:00Z stderr F \n";
        assert_eq!(parse_cri_log(raw), "abcdef\n\n");
    }
}
