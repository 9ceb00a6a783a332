//! The kubelet-rs binary as an operator (and kubeadm) runs it.

use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use cri::{RemoteRuntime, RuntimeService};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");

#[test]
fn version_is_what_kubeadm_parses() {
    let out = Command::new(BIN).arg("--version").output().expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // kubeadm: ^\s*Kubernetes v(\d+\.\d+\.\d+)([-0-9a-zA-Z_\.+]*)?\s*$ on the whole output.
    let rest = text.strip_prefix("Kubernetes v").expect("prefix");
    assert!(!text.contains('\n'), "one line: {text:?}");
    let (semver, suffix) = rest.split_at(
        rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len()),
    );
    assert_eq!(semver.split('.').count(), 3, "{text}");
    assert!(
        suffix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c)),
        "{text}"
    );
    assert!(suffix.starts_with("+kubelet-rs."), "{text}");
}

#[test]
fn unknown_flags_and_invalid_values_fail_with_a_clear_message() {
    let out = Command::new(BIN)
        .arg("--no-such-flag")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));

    let out = Command::new(BIN)
        .args(["--cgroup-driver", "cgroupv3"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cgroupDriver") && err.contains("cgroupv3") && err.contains("systemd"),
        "{err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: soon\n").expect("write");
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("syncFrequency"));
}

/// SIGTERM stops the kubelet cleanly; its containers keep running (as upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_kubelet_but_not_its_containers() {
    let rt = RemoteRuntime::new(
        "unix:///run/containerd/containerd.sock",
        None,
        Duration::from_secs(10),
    )
    .expect("client");
    rt.version().await.expect(
        "containerd must be running for this test: run deploy/setup-runtime.sh (hack/test.sh does)",
    );
    let lock = std::fs::File::create("/tmp/kubelet-rs-integration.lock").expect("lock file");
    lock.lock().expect("lock");
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("m");
    std::fs::create_dir_all(&manifests).expect("dir");
    let node = format!("cli-{}", std::process::id());
    std::fs::write(
        manifests.join("p.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers: [{name: c, image: 'localhost:5000/busybox:1.35', command: [sleep, '3600']}]\n",
    )
    .expect("manifest");
    let mut child = Command::new(BIN)
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .args(["--hostname-override", &node, "--healthz-port", "0"])
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start kubelet-rs");
    let pod_name = format!("p-{node}");
    let running = |cs: &[cri::pb::Container]| -> Vec<String> {
        cs.iter()
            .filter(|c| c.labels.get("io.kubernetes.pod.name") == Some(&pod_name))
            .filter(|c| c.state == cri::pb::ContainerState::ContainerRunning as i32)
            .map(|c| c.id.clone())
            .collect()
    };
    let start = Instant::now();
    let ids = loop {
        let ids = running(&rt.list_containers(None).await.expect("list"));
        if !ids.is_empty() {
            break ids;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "pod never ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let status = child.wait().expect("wait");
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    assert_eq!(
        running(&rt.list_containers(None).await.expect("list")),
        ids,
        "containers survive"
    );
    for s in rt.list_pod_sandbox(None).await.expect("list") {
        if s.labels.get("io.kubernetes.pod.name") == Some(&pod_name) {
            let _ = rt.stop_pod_sandbox(&s.id).await;
            let _ = rt.remove_pod_sandbox(&s.id).await;
        }
    }
}
