//! Volumes on real containerd, beyond upstream's conformance specs: emptyDir
//! data across container and kubelet restarts and its removal with the pod,
//! the `kubernetes.io~<plugin>` layout, and unsupported volume types.

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
    wait_for(t, "the orphan's directory removed", || !pod_dir.exists()).await?;
    assert!(
        node.containers().await.is_empty(),
        "its containers were stopped and removed first"
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
