//! Issue 20 fault case "disk full": the kubelet's `--root-dir` on a small
//! tmpfs that a test fills up. A ConfigMap update that cannot be written is a
//! `FailedMount` event and leaves the mounted files as they were (upstream's
//! atomic writer: the new payload goes into a fresh timestamped directory and
//! the `..data` link only flips once it is whole); a pod created meanwhile
//! waits with the same event; the running pod keeps running. Once space
//! returns, the update lands and the waiting pod starts, with no restart.
//! Then the pod log directory (`podLogsDir`, its own small tmpfs) fills up:
//! a new container still starts, and its lines reach its log file once
//! space returns.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use apiserver_double::Options;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kubelet_rs_integration::cluster::{Joined, phase};
use kubelet_rs_integration::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(ok.success(), "mount a tmpfs on {}", dir.path().display());
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        unmount_under(self.dir.path());
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system holding `path` until a write fails with ENOSPC.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0x5a_u8; 64 * 1024];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
}

fn uid(p: &Option<Value>) -> String {
    p.as_ref()
        .and_then(|p| p["metadata"]["uid"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn pod_spec(cm: &str) -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"],
            "volumeMounts": [{"name": "c", "mountPath": "/etc/c"}]}],
        "volumes": [{"name": "c", "configMap": {"name": cm}}]
    })
}

/// The timestamped payload directories of an atomic-writer volume.
fn payload_dirs(vol: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(vol)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("..") && n != "..data")
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn no_space_event(j: &Joined, pod: &str) -> Option<String> {
    j.pod_events(pod)
        .into_iter()
        .find(|(t, r, m)| {
            t == "Warning"
                && r == "FailedMount"
                && m.starts_with("MountVolume.SetUp failed for volume \"c\" : ")
                && m.contains("no space left on device")
        })
        .map(|(_, _, m)| m)
}

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_root_dir_fails_volume_writes_with_an_event_keeps_old_data_and_recovers() {
    let t0 = tokio::time::Instant::now();
    let disk = SmallDisk::mount("16m");
    let logs = SmallDisk::mount("4m");
    let root: PathBuf = disk.path().join("root");
    let config = disk.path().join("kubelet-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\n",
            logs.path().display()
        ),
    )
    .expect("config file");
    let j = Joined::start_with(Options::default(), |f, _| {
        f.root_dir = Some(root.clone());
        f.config = Some(config.clone());
    })
    .await;
    let cm_name = format!("df-{}", j.node.name);
    let cms: Api<ConfigMap> = Api::namespaced(j.admin.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": cm_name, "namespace": "default"},
        "data": {"key": "one"}
    }))
    .expect("configMap");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create configMap");

    j.create_pod("full", pod_spec(&cm_name)).await;
    let p = j
        .wait_api("full", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let vol = root
        .join("pods")
        .join(uid(&p))
        .join("volumes/kubernetes.io~configmap/c");
    let file = vol.join("key");
    assert_eq!(std::fs::read_to_string(&file).expect("cm file"), "one");
    let before = payload_dirs(&vol);
    assert_eq!(before.len(), 1, "one payload directory: {before:?}");

    eprintln!("{:?} running", t0.elapsed());
    // Fill the disk, then change the ConfigMap and create a second pod.
    let filler = disk.path().join("filler");
    let f = filler.clone();
    tokio::task::spawn_blocking(move || fill(&f))
        .await
        .expect("fill task");
    cms.patch(
        &cm_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"key": "two", "other": "x".repeat(64 * 1024)}})),
    )
    .await
    .expect("patch configMap");
    j.create_pod("late", pod_spec(&cm_name)).await;

    let msg = wait_for("FailedMount (no space) for the running pod", T, || {
        no_space_event(&j, "full")
    })
    .await;
    eprintln!("{:?} running pod: {msg}", t0.elapsed());
    let msg = wait_for("FailedMount (no space) for the new pod", T, || {
        no_space_event(&j, "late")
    })
    .await;
    eprintln!("{:?} new pod: {msg}", t0.elapsed());
    // Nothing half-written: the old payload is whole and the only one.
    assert_eq!(std::fs::read_to_string(&file).expect("cm file"), "one");
    assert!(!vol.join("other").exists(), "no file of the new payload");
    // A retry may hold its directory for a moment before removing it.
    wait_for(
        "no partial payload left behind",
        Duration::from_secs(10),
        || (payload_dirs(&vol) == before).then_some(()),
    )
    .await;
    let p = j.api_pod("full");
    assert_eq!(phase(p.as_ref()), Some("Running"));
    let late = j.api_pod("late");
    assert_eq!(
        phase(late.as_ref()),
        Some("Pending"),
        "waits for its volume"
    );
    assert_eq!(
        j.node_condition("Ready").map(|c| c.0).as_deref(),
        Some("True"),
        "the node stays Ready"
    );

    // Space returns: the update lands and the waiting pod starts.
    std::fs::remove_file(&filler).expect("remove filler");
    wait_for("the update after space returned", T, || {
        (std::fs::read_to_string(&file).ok().as_deref() == Some("two")).then_some(())
    })
    .await;
    eprintln!("{:?} update written", t0.elapsed());
    // The link flips before the old directory goes.
    wait_for("the old payload removed", Duration::from_secs(10), || {
        (payload_dirs(&vol).len() == 1).then_some(())
    })
    .await;
    j.wait_api("late", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    eprintln!("{:?} new pod running", t0.elapsed());
    let p = j.api_pod("full");
    assert_eq!(
        p.as_ref()
            .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64()),
        Some(0),
        "the running pod never restarted"
    );

    // The log directory fills up: containerd creates a new container's log
    // file (an empty file takes no blocks) and the container starts; its
    // lines are lost while the disk is full, and logged again once space
    // returns. The running pods are not disturbed.
    let log_filler = logs.path().join("filler");
    let f = log_filler.clone();
    tokio::task::spawn_blocking(move || fill(&f))
        .await
        .expect("fill task");
    j.create_pod(
        "chatty",
        json!({
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "while true; do echo tick; sleep 0.2; done"]}]
        }),
    )
    .await;
    let p = j
        .wait_api("chatty", T, "Running", |p| phase(p) == Some("Running"))
        .await;
    let log = logs
        .path()
        .join(format!("default_{}_{}", j.pod_name("chatty"), uid(&p)))
        .join("main/0.log");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let while_full = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "{:?} log dir full: {} bytes logged",
        t0.elapsed(),
        while_full
    );
    assert_eq!(phase(j.api_pod("full").as_ref()), Some("Running"));
    std::fs::remove_file(&log_filler).expect("remove log filler");
    wait_for("log lines once the log dir had space", T, || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|s| s.contains(" stdout F tick"))
            .map(|_| ())
    })
    .await;
    eprintln!("{:?} logging again", t0.elapsed());

    let _ = cms.delete(&cm_name, &DeleteParams::default()).await;
    j.cleanup().await;
    drop(logs);
    drop(disk);
}
