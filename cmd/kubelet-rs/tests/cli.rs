//! The kubelet-rs binary as an operator (and kubeadm) runs it.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use cri::{RemoteRuntime, RuntimeService};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-rs");

/// The node API on a loopback port of its own and no read-only port, so
/// that test kubelets never collide on 10250/10255.
fn loopback_api() -> Vec<String> {
    let port = common::free_port();
    vec![
        "--address=127.0.0.1".into(),
        format!("--port={port}"),
        "--read-only-port=0".into(),
    ]
}

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
    let _lock = tokio::task::spawn_blocking(common::machine_lock)
        .await
        .expect("lock task");
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
        .args(loopback_api())
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

/// With no pod source at all (a bare node waiting to be configured), the
/// kubelet keeps running, as upstream does, and SIGTERM stops it cleanly.
#[test]
fn no_pod_source_keeps_the_kubelet_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .arg("--container-runtime-endpoint")
        .arg(format!("unix://{}", dir.path().join("none.sock").display()))
        .args(["--hostname-override", "no-sources", "--healthz-port", "0"])
        .args(loopback_api())
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubelet-rs");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the kubelet exited with no pod source"
    );
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "clean exit on SIGTERM: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `Key=Value` lines of a systemd unit file, in order.
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('[') && !l.is_empty())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn systemd_unit_and_kubeadm_drop_in_are_what_operators_expect() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd");
    let unit = unit_entries(&std::fs::read_to_string(root.join("kubelet.service")).expect("unit"));
    let get = |k: &str| {
        unit.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("Type"), Some("notify"));
    assert_eq!(get("Restart"), Some("always"));
    assert_eq!(
        get("KillMode"),
        Some("process"),
        "containers survive a kubelet restart"
    );
    assert_eq!(get("ExecStart"), Some("/usr/bin/kubelet"));

    let drop_in = unit_entries(
        &std::fs::read_to_string(root.join("kubelet.service.d/10-kubeadm.conf")).expect("drop-in"),
    );
    let env_files: Vec<&str> = drop_in
        .iter()
        .filter(|(k, _)| k == "EnvironmentFile")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        env_files,
        [
            "-/var/lib/kubelet/kubeadm-flags.env",
            "-/etc/default/kubelet"
        ]
    );
    let exec = drop_in
        .iter()
        .filter(|(k, _)| k == "ExecStart")
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>();
    assert_eq!(
        exec,
        [
            "",
            "/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS"
        ]
    );
    // Expand the command line as systemd would, with what kubeadm writes, and parse it.
    let mut env: std::collections::HashMap<String, String> = drop_in
        .iter()
        .filter(|(k, _)| k == "Environment")
        .filter_map(|(_, v)| v.trim_matches('"').split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert(
        "KUBELET_KUBEADM_ARGS".into(),
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10 --node-ip=192.0.2.10".into(),
    );
    env.insert(
        "KUBELET_EXTRA_ARGS".into(),
        "--node-labels=tier=edge".into(),
    );
    let mut argv = vec!["kubelet".to_string()];
    for word in exec[1].split_whitespace().skip(1) {
        let var = word.trim_start_matches('$');
        argv.extend(
            env.get(var)
                .map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
    }
    let flags = <kubelet_config::Flags as clap::Parser>::try_parse_from(&argv)
        .expect("kubeadm's command line parses");
    assert_eq!(
        flags.kubeconfig.as_deref(),
        Some(std::path::Path::new("/etc/kubernetes/kubelet.conf"))
    );
    assert_eq!(
        flags.bootstrap_kubeconfig.as_deref(),
        Some(std::path::Path::new(
            "/etc/kubernetes/bootstrap-kubelet.conf"
        ))
    );
    assert_eq!(
        flags.config.as_deref(),
        Some(std::path::Path::new("/var/lib/kubelet/config.yaml"))
    );
    assert_eq!(flags.node_labels.as_deref(), Some("tier=edge"));
}
