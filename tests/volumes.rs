//! Volumes on real containerd, beyond upstream's conformance specs: emptyDir
//! data across container and kubelet restarts and its removal with the pod,
//! the `kubernetes.io~<plugin>` layout, unsupported volume types, and a
//! subPath mount that cannot be unmounted, which must never cost the host
//! its files.

use std::path::PathBuf;
use std::time::Duration;

use kubelet_rs_integration::*;

fn empty_dir_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo run >> /data/runs; sleep 2; exit 1\"]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n  volumes:\n  - name: data\n    emptyDir: {{}}\n"
    )
}

fn runs(path: &PathBuf) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_dir_survives_container_and_kubelet_restarts_and_goes_with_the_pod()
-> anyhow::Result<()> {
    let mut node = Node::start(|_| {}).await;
    node.write_manifest("ed.yaml", &empty_dir_pod("ed"));
    let t = Duration::from_secs(90);
    node.wait_status("ed", t, "restarted once", |s| {
        container(s, "c").is_some_and(|c| c.restart_count >= 1)
    })
    .await?;
    let uid = node.uid_of("ed").ctx("uid")?;
    let dir = node
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/data");
    let file = dir.join("runs");
    // Upstream's layout and mode.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir)?.permissions());
    assert_eq!(mode & 0o777, 0o777, "emptyDir directories are 0777");
    wait_for(t, "two runs in the emptyDir", || runs(&file) >= 2).await?;

    // A kubelet restart adopts the volume: the data stays, and runs go on adding to it.
    let before = runs(&file);
    node.restart().await;
    wait_for(t, "a run after the kubelet restart", || {
        runs(&file) > before
    })
    .await?;
    assert!(
        runs(&file) > before,
        "the data written before the restart is still there"
    );

    // Removing the pod removes its volume and its directory.
    node.remove_manifest("ed.yaml");
    let pod_dir = node.root_dir().join("pods").join(&uid);
    wait_for(t, "the pod directory removed", || !pod_dir.exists()).await?;
    node.cleanup().await;
    Ok(())
}

/// A pod removed while kubelet-rs was down: the next kubelet-rs finds its
/// volume on disk, and once the sources have reported and the pod's
/// containers are gone, tears it down and removes the pod's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_of_a_pod_removed_while_the_kubelet_was_down_are_cleaned_up() -> anyhow::Result<()>
{
    let mut node = Node::start(|_| {}).await;
    node.write_manifest("orphan.yaml", &empty_dir_pod("orphan"));
    let t = Duration::from_secs(90);
    node.wait_status("orphan", t, "running", |s| is_running(s, "c"))
        .await?;
    let uid = node.uid_of("orphan").ctx("uid")?;
    let pod_dir = node.root_dir().join("pods").join(&uid);
    wait_for(t, "the emptyDir written", || {
        runs(&pod_dir.join("volumes/kubernetes.io~empty-dir/data/runs")) >= 1
    })
    .await?;
    // The manifest goes while the kubelet is down: the next one never sees the pod.
    node.stop().await;
    node.remove_manifest("orphan.yaml");
    node.start_again().await;
    // Once the directory is gone, nothing of the pod may still run.
    let end = tokio::time::Instant::now() + t;
    while pod_dir.exists() {
        anyhow::ensure!(
            tokio::time::Instant::now() < end,
            "the orphan's directory stayed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = node
        .containers()
        .await
        .into_iter()
        .filter(|c| c.state == cri::pb::ContainerState::ContainerRunning as i32)
        .count();
    assert_eq!(
        running, 0,
        "its containers were stopped before its volume went"
    );
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_volume_type_never_starts_the_pod() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: csi\nspec:\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - name: ebs\n      mountPath: /data\n  volumes:\n  - name: ebs\n    csi:\n      driver: ebs.csi.aws.com\n"
    );
    node.write_manifest("csi.yaml", &manifest);
    let s = node
        .wait_status("csi", Duration::from_secs(30), "ContainerCreating", |s| {
            waiting_reason(s, "c").as_deref() == Some("ContainerCreating")
        })
        .await?;
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        node.containers().await.is_empty(),
        "no container was ever created"
    );
    assert!(
        node.sandboxes().await.is_empty(),
        "not even a sandbox: the volumes come first"
    );
    node.cleanup().await;
    Ok(())
}

/// Every regular file under `dir` with its content, by relative path.
fn snapshot(dir: &std::path::Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.insert(p.strip_prefix(dir).unwrap_or(&p).to_path_buf(), bytes);
            }
        }
    }
    out
}

/// Mount points at or under `dir`.
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| std::path::Path::new(m).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// A hostPath subPath whose unmount fails (the test holds a file open
/// through it): once the pod is removed and its containers are gone, every
/// host file is still there, byte for byte; the volume stays and its
/// tear-down is retried, and once the mount can go the pod's directory goes
/// too, still without touching the host's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_subpath_mount_never_costs_the_host_its_files() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    let host = node.root_dir().with_file_name("host-data");
    std::fs::create_dir_all(host.join("sub/deep"))?;
    std::fs::write(host.join("top.txt"), b"outside the subPath")?;
    std::fs::write(host.join("sub/keep.txt"), b"precious\n")?;
    let blob: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(host.join("sub/deep/blob.bin"), &blob)?;
    let before = snapshot(&host);
    assert_eq!(before.len(), 3);
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sp\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n      subPath: sub\n  volumes:\n  - name: data\n    hostPath:\n      path: {}\n      type: Directory\n",
        host.display()
    );
    node.write_manifest("sp.yaml", &manifest);
    let t = Duration::from_secs(90);
    node.wait_status("sp", t, "running", |s| is_running(s, "c"))
        .await?;
    let uid = node.uid_of("sp").ctx("uid")?;
    let pod_dir = node.root_dir().join("pods").join(&uid);
    let target = pod_dir.join("volume-subpaths/data/c/0");
    assert_eq!(
        mounts_under(&pod_dir),
        vec![target.display().to_string()],
        "the subPath is bind-mounted"
    );
    // Held open through the bind mount: its unmount fails with EBUSY.
    let held = std::fs::File::open(target.join("keep.txt"))?;

    node.remove_manifest("sp.yaml");
    let end = tokio::time::Instant::now() + t;
    loop {
        let running = node
            .containers()
            .await
            .into_iter()
            .filter(|c| c.state == cri::pb::ContainerState::ContainerRunning as i32)
            .count();
        if running == 0 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < end,
            "the container still runs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Several tear-down attempts fail meanwhile.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        snapshot(&host),
        before,
        "the host's files are untouched while the subPath stays mounted"
    );
    assert!(
        pod_dir.exists(),
        "the pod directory stays while a mount is under it"
    );
    assert_eq!(mounts_under(&pod_dir), vec![target.display().to_string()]);

    // Released: the next retry unmounts it and the pod's directory goes.
    drop(held);
    wait_for(
        Duration::from_secs(150),
        "the pod directory removed",
        || !pod_dir.exists(),
    )
    .await?;
    assert!(mounts_under(&pod_dir).is_empty());
    assert_eq!(snapshot(&host), before, "the host's files are untouched");
    node.cleanup().await;
    Ok(())
}

async fn wait_for(t: Duration, what: &str, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let end = tokio::time::Instant::now() + t;
    while tokio::time::Instant::now() < end {
        if f() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("timed out waiting for {what}")
}
