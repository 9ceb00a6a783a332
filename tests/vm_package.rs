//! The Debian package under real systemd (issue 29), in the VM lane only
//! (`hack/vm/run.sh <suite> package`; the host has no systemd). The package
//! is the one `hack/build-deb.sh --out target/debian` made from this
//! workspace's binary; the control plane is the apiserver double, in this
//! test's process.
//!
//! As kubeadm leaves a node: the package's `kubelet.service` with kubeadm's
//! drop-in, `/etc/kubernetes/bootstrap-kubelet.conf`, kubeadm's
//! `/var/lib/kubelet/config.yaml` (systemd cgroup driver) and
//! `KUBELET_EXTRA_ARGS` in `/etc/default/kubelet`. Then: `systemctl start`
//! returns once the kubelet said READY (`Type=notify`) and the Node is
//! registered; a static pod runs; `journalctl -u kubelet` has the kubelet's
//! lines; `systemctl restart` and a SIGKILL (`Restart=always`) keep the
//! container, the same one, never restarted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use apiserver_double::{ApiServer, BOOTSTRAP_TOKEN, Options};
use kubelet_rs_integration::BUSYBOX;
use serde_json::Value;

const T: Duration = Duration::from_secs(300);

fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn unit(property: &str) -> String {
    sh(
        "systemctl",
        &["show", "-p", property, "--value", "kubelet.service"],
    )
}

/// The newest package `hack/build-deb.sh --out target/debian` made.
fn package() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debian");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (hack/vm/run.sh builds the package first)",
                dir.display()
            )
        })
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("kubelet-rs_"))
                && p.extension().is_some_and(|e| e == "deb")
        })
        .collect();
    debs.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    debs.pop()
        .unwrap_or_else(|| panic!("no kubelet-rs_*.deb in {}", dir.display()))
}

fn write(path: &str, text: &str) {
    let p = Path::new(path);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(p, text).unwrap_or_else(|e| panic!("{path}: {e}"));
}

/// The static pod's mirror pod's container, once it runs: (id, restarts).
fn mirror_container(api: &ApiServer, name: &str) -> Option<(String, i64)> {
    let p = api.get("pods", "default", name)?;
    let c: &Value = &p["status"]["containerStatuses"][0];
    c["state"]["running"].as_object()?;
    Some((
        c["containerID"].as_str()?.to_string(),
        c["restartCount"].as_i64()?,
    ))
}

async fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {T:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The PID of the container's task in containerd, if it runs: the same PID
/// after a kubelet restart is the same process, never restarted.
fn task_pid(container_id: &str) -> Option<String> {
    let id = container_id.rsplit("://").next()?;
    sh("ctr", &["-n", "k8s.io", "tasks", "ls"])
        .lines()
        .find(|l| l.starts_with(id) && l.contains("RUNNING"))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(String::from)
}

async fn wait_active(not_pid: &str) -> String {
    wait("kubelet.service active again", || {
        let pid = unit("MainPID");
        (unit("ActiveState") == "active" && pid != "0" && pid != not_pid).then_some(pid)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn vm_package_runs_under_systemd_and_keeps_containers() {
    let pid1 = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(
        pid1.trim(),
        "systemd",
        "this test needs systemd as PID 1: run it with hack/vm/run.sh <trixie|sid> package"
    );
    let deb = package();
    sh("dpkg", &["-i", &deb.to_string_lossy()]);
    assert_eq!(unit("Type"), "notify");
    assert_eq!(unit("Restart"), "always");

    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start(Options::default()).await.expect("double");
    let node = format!("vm-pkg-{:08x}", rand::random::<u32>());
    api.write_token_kubeconfig(
        Path::new("/etc/kubernetes/bootstrap-kubelet.conf"),
        BOOTSTRAP_TOKEN,
    )
    .expect("bootstrap kubeconfig");
    write("/etc/kubernetes/pki/ca.crt", api.ca_pem());
    // kubeadm's config (KubeletConfiguration as `kubeadm join` writes it),
    // with housekeeping thresholds a small VM disk does not cross.
    write(
        "/var/lib/kubelet/config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\n  x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\n\
         authorization:\n  mode: Webhook\n\
         cgroupDriver: systemd\nclusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\n\
         healthzBindAddress: 127.0.0.1\nhealthzPort: 10248\nrotateCertificates: true\n\
         staticPodPath: /etc/kubernetes/manifests\n\
         evictionHard:\n  memory.available: 1Mi\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n",
    );
    write(
        "/etc/default/kubelet",
        &format!("KUBELET_EXTRA_ARGS=--hostname-override={node}\n"),
    );
    write(
        "/etc/kubernetes/manifests/web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"sleep 86400\"]\n"
        ),
    );
    sh("systemctl", &["daemon-reload"]);
    // Type=notify: start returns when the kubelet sent READY=1, which it
    // does once the Node is registered.
    sh("timeout", &["300", "systemctl", "start", "kubelet.service"]);
    assert_eq!(unit("ActiveState"), "active");
    assert!(
        api.get("nodes", "", &node).is_some(),
        "READY before the Node was registered"
    );
    let mirror = format!("web-{node}");
    let (id, restarts) = wait("the static pod running", || mirror_container(&api, &mirror)).await;
    assert_eq!(restarts, 0);
    let task = task_pid(&id).expect("the container's task runs");
    let journal = sh(
        "journalctl",
        &["-u", "kubelet.service", "--no-pager", "-o", "cat"],
    );
    assert!(
        journal.contains(&node),
        "journalctl -u kubelet has no line naming the node: {journal}"
    );

    // systemctl restart: the same container keeps running.
    let pid = unit("MainPID");
    sh(
        "timeout",
        &["300", "systemctl", "restart", "kubelet.service"],
    );
    let pid = wait_active(&pid).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        mirror_container(&api, &mirror),
        Some((id.clone(), 0)),
        "after systemctl restart"
    );
    assert_eq!(task_pid(&id), Some(task.clone()), "after systemctl restart");

    // SIGKILL: Restart=always brings it back (RestartSec=10), containers untouched.
    sh("kill", &["-9", &pid]);
    wait_active(&pid).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        mirror_container(&api, &mirror),
        Some((id.clone(), 0)),
        "after SIGKILL and Restart=always"
    );
    assert_eq!(
        task_pid(&id),
        Some(task),
        "after SIGKILL and Restart=always"
    );

    sh("systemctl", &["stop", "kubelet.service"]);
    let _ = std::fs::remove_file("/etc/kubernetes/manifests/web.yaml");
}
