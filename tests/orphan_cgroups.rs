//! Orphaned pod cgroups (upstream `Kubelet.cleanupOrphanedPodCgroups`, from
//! `HandlePodCleanups`): a pod cgroup on disk whose pod no source wants and
//! the runtime does not have (left by a kubelet that stopped before its pod
//! was gone) is removed by the next kubelet's housekeeping. (A pod whose
//! volumes are still on disk keeps its cgroup: `app::cm` unit tests.)

use std::path::PathBuf;
use std::time::Duration;

use kubelet_rs_integration::{Node, lane};

/// The pod cgroup in every hierarchy of this host (v1: each controller; v2: one).
fn pod_dirs(uid: &str) -> Vec<PathBuf> {
    let base = std::path::Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").is_file() {
        return vec![lane::pod_memory_cgroup("besteffort", uid)];
    }
    ["cpu", "memory", "pids"]
        .iter()
        .map(|c| {
            lane::kubepods_under(&base.join(c))
                .join("besteffort")
                .join(format!("pod{uid}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_cgroup_nobody_runs_is_removed_by_housekeeping() {
    let node = Node::start(|_| {}).await;
    let orphan = format!("{:08x}-0000-4000-8000-{:012x}", rand::random::<u32>(), 1u64);
    for d in pod_dirs(&orphan) {
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
    // Housekeeping runs every 2 s and looks for orphaned cgroups every 30 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while pod_dirs(&orphan).iter().any(|d| d.exists()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "orphaned pod cgroup still there: {:?}",
            pod_dirs(&orphan)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    node.cleanup().await;
}
