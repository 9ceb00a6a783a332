//! Container GC on the fake CRI runtime (upstream `kuberuntime_gc_test.go`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cri::fake::FakeRuntime;
use cri::{RuntimeService, pb};
use kubelet_types::labels;

use super::collector::Policy;
use crate::{KubeRuntimeManager, RuntimeConfig};

const HOUR: Duration = Duration::from_secs(3600);

struct Env {
    fake: FakeRuntime,
    m: KubeRuntimeManager,
    dir: tempfile::TempDir,
}

fn env() -> Env {
    env_keeping(1)
}

fn env_keeping(max_dead_per_container: usize) -> Env {
    let fake = FakeRuntime::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = RuntimeConfig {
        pod_logs_dir: dir.path().to_path_buf(),
        root_dir: dir.path().join("root"),
        resolv_conf: String::new(),
        max_dead_per_container,
        ..Default::default()
    };
    let m = KubeRuntimeManager::new(Arc::new(fake.clone()), Arc::new(fake.clone()), cfg);
    Env { fake, m, dir }
}

fn policy(min_age: Duration, per_container: i32, total: i32) -> Policy {
    Policy {
        min_age,
        max_per_pod_container: per_container,
        max_containers: total,
    }
}

impl Env {
    async fn sandbox(&self, uid: &str, attempt: u32) -> String {
        let cfg = pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: format!("pod-{uid}"),
                uid: uid.into(),
                namespace: "default".into(),
                attempt,
            }),
            labels: HashMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
            ..Default::default()
        };
        self.fake.run_pod_sandbox(cfg, "").await.expect("sandbox")
    }

    /// A container instance; exited unless `running`. Its log file is
    /// written, with a rotated sibling.
    async fn container(
        &self,
        sb: &str,
        uid: &str,
        name: &str,
        attempt: u32,
        running: bool,
    ) -> String {
        let log_dir = self
            .dir
            .path()
            .join(format!("default_pod-{uid}_{uid}"))
            .join(name);
        std::fs::create_dir_all(&log_dir).expect("log dir");
        let log = log_dir.join(format!("{attempt}.log"));
        std::fs::write(&log, "out\n").expect("log");
        std::fs::write(
            log_dir.join(format!("{attempt}.log.20240101-000000.gz")),
            "old",
        )
        .expect("log");
        let cfg = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            labels: HashMap::from([
                (labels::POD_UID.to_string(), uid.to_string()),
                (labels::CONTAINER_NAME.to_string(), name.to_string()),
            ]),
            log_path: log.to_string_lossy().into_owned(),
            ..Default::default()
        };
        let id = self
            .fake
            .create_container(sb, cfg, pb::PodSandboxConfig::default())
            .await
            .expect("create");
        self.fake.start_container(&id).await.expect("start");
        if !running {
            self.fake.exit_container(&id, 1);
        }
        id
    }

    fn ids(&self) -> Vec<String> {
        let mut ids: Vec<_> = self.fake.containers().into_iter().map(|c| c.id).collect();
        ids.sort();
        ids
    }

    fn sandbox_ids(&self) -> Vec<String> {
        let mut ids: Vec<_> = self.fake.sandboxes().into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    }
}

fn live(_: &str) -> Option<bool> {
    Some(false)
}

fn later(d: Duration) -> SystemTime {
    SystemTime::now() + d
}

#[tokio::test]
async fn containers_younger_than_min_age_stay() {
    let e = env();
    let sb = e.sandbox("u1", 0).await;
    for a in 0..3 {
        e.container(&sb, "u1", "c", a, false).await;
    }
    let p = policy(HOUR, 1, -1);
    let s =
        e.m.garbage_collect_at(&p, true, false, &live, SystemTime::now())
            .await
            .expect("gc");
    assert_eq!(s.containers_removed, 0);
    assert_eq!(e.ids().len(), 3);
    // An hour later they are old enough: the newest dead one stays.
    let s =
        e.m.garbage_collect_at(&p, true, false, &live, later(2 * HOUR))
            .await
            .expect("gc");
    assert_eq!(s.containers_removed, 2);
    assert_eq!(s.containers_kept, 1);
    let left = e.fake.containers();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].metadata.as_ref().map(|m| m.attempt), Some(2));
}

#[tokio::test]
async fn per_container_limit_keeps_the_newest_and_the_running_one() {
    let e = env();
    let sb = e.sandbox("u1", 0).await;
    let mut dead = Vec::new();
    for a in 0..4 {
        dead.push(e.container(&sb, "u1", "c", a, false).await);
    }
    let running = e.container(&sb, "u1", "c", 4, true).await;
    let other = e.container(&sb, "u1", "d", 0, false).await;
    let s =
        e.m.garbage_collect_at(
            &policy(Duration::ZERO, 2, -1),
            true,
            false,
            &live,
            later(HOUR),
        )
        .await
        .expect("gc");
    assert_eq!(s.containers_removed, 2);
    let mut want = vec![dead[2].clone(), dead[3].clone(), running, other];
    want.sort();
    assert_eq!(e.ids(), want);
    // The removed instances' logs and rotations went with them; the kept ones' stayed.
    let logs = e.dir.path().join("default_pod-u1_u1/c");
    assert!(!logs.join("0.log").exists());
    assert!(!logs.join("1.log.20240101-000000.gz").exists());
    assert!(logs.join("2.log").exists());
    assert!(logs.join("3.log.20240101-000000.gz").exists());
}

#[tokio::test]
async fn the_last_dead_instance_of_a_live_pod_survives_a_zero_limit() {
    let e = env();
    let sb = e.sandbox("u1", 0).await;
    e.container(&sb, "u1", "c", 0, false).await;
    let newest = e.container(&sb, "u1", "c", 1, false).await;
    // Upstream would remove both with --maximum-dead-containers-per-container=0
    // and --maximum-dead-containers=0; `kubectl logs --previous` needs the newest.
    let s =
        e.m.garbage_collect_at(
            &policy(Duration::ZERO, 0, 0),
            true,
            false,
            &live,
            later(HOUR),
        )
        .await
        .expect("gc");
    assert_eq!(s.containers_removed, 1);
    assert_eq!(s.kept_over_limit, 1);
    assert_eq!(e.ids(), vec![newest]);
}

#[tokio::test]
async fn global_limit_balances_then_removes_the_oldest() {
    let e = env();
    let sb1 = e.sandbox("u1", 0).await;
    let sb2 = e.sandbox("u2", 0).await;
    let mut a = Vec::new();
    let mut b = Vec::new();
    for i in 0..3 {
        a.push(e.container(&sb1, "u1", "c", i, false).await);
        b.push(e.container(&sb2, "u2", "c", i, false).await);
    }
    // No per-container limit; 6 dead > 4: an even share of 2 each.
    let s =
        e.m.garbage_collect_at(
            &policy(Duration::ZERO, -1, 4),
            true,
            false,
            &live,
            later(HOUR),
        )
        .await
        .expect("gc");
    assert_eq!(s.containers_removed, 2);
    let mut want = vec![a[1].clone(), a[2].clone(), b[1].clone(), b[2].clone()];
    want.sort();
    assert_eq!(e.ids(), want);
    // 3 in all: the share is 1, then nothing more is over.
    let s =
        e.m.garbage_collect_at(
            &policy(Duration::ZERO, -1, 3),
            true,
            false,
            &live,
            later(HOUR),
        )
        .await
        .expect("gc");
    assert_eq!(s.containers_removed, 2);
    let mut want = vec![a[2].clone(), b[2].clone()];
    want.sort();
    assert_eq!(e.ids(), want);
}

#[tokio::test]
async fn global_limit_removes_oldest_across_containers_beyond_the_share() {
    let e = env();
    let sb = e.sandbox("u1", 0).await;
    let mut c = Vec::new();
    for i in 0..4 {
        c.push(e.container(&sb, "u1", "c", i, false).await);
    }
    let d = e.container(&sb, "u1", "d", 0, false).await;
    // 5 > 2: share 1 each leaves 2; within the limit.
    let s =
        e.m.garbage_collect_at(
            &policy(Duration::ZERO, -1, 2),
            true,
            false,
            &live,
            later(HOUR),
        )
        .await
        .expect("gc");
    assert_eq!(s.containers_removed, 3);
    let mut want = vec![c[3].clone(), d];
    want.sort();
    assert_eq!(e.ids(), want);
}

#[tokio::test]
async fn a_gone_pod_loses_everything_once_sources_are_ready() {
    let e = env();
    let old_sb = e.sandbox("gone", 0).await;
    e.fake.stop_pod_sandbox(&old_sb).await.expect("stop");
    let sb = e.sandbox("gone", 1).await;
    e.container(&sb, "gone", "c", 0, false).await;
    e.container(&sb, "gone", "c", 1, false).await;
    e.fake.stop_pod_sandbox(&sb).await.expect("stop");
    let live_sb = e.sandbox("live", 0).await;
    let live_c = e.container(&live_sb, "live", "c", 0, false).await;
    std::fs::create_dir_all(e.dir.path().join("default_orphan_gone2")).expect("dir");
    let state = |uid: &str| (uid == "live").then_some(false);
    let p = policy(Duration::ZERO, 1, -1);
    // Sources not ready: the unknown pod may be one not seen yet.
    let s =
        e.m.garbage_collect_at(&p, false, false, &state, later(HOUR))
            .await
            .expect("gc");
    assert_eq!(s.removed_with_pod, 0);
    assert_eq!(s.log_dirs_removed, 0);
    assert_eq!(s.sandboxes_removed, 1, "only the older dead sandbox");
    assert!(e.dir.path().join("default_pod-gone_gone").exists());
    assert_eq!(
        e.fake.containers().len(),
        2,
        "newest dead of each container"
    );
    let s =
        e.m.garbage_collect_at(&p, true, false, &state, later(HOUR))
            .await
            .expect("gc");
    assert_eq!(s.removed_with_pod, 1);
    assert_eq!(s.sandboxes_removed, 1);
    assert_eq!(s.log_dirs_removed, 2);
    assert_eq!(e.ids(), vec![live_c]);
    assert_eq!(e.sandbox_ids(), vec![live_sb]);
    assert!(!e.dir.path().join("default_pod-gone_gone").exists());
    assert!(!e.dir.path().join("default_orphan_gone2").exists());
    assert!(e.dir.path().join("default_pod-live_live").exists());
}

#[tokio::test]
async fn sandboxes_of_a_live_pod_keep_the_newest_and_those_in_use() {
    let e = env();
    let s0 = e.sandbox("u1", 0).await;
    let s1 = e.sandbox("u1", 1).await;
    e.container(&s1, "u1", "c", 0, false).await;
    let s2 = e.sandbox("u1", 2).await;
    let s3 = e.sandbox("u1", 3).await;
    for s in [&s0, &s1, &s2, &s3] {
        e.fake.stop_pod_sandbox(s).await.expect("stop");
    }
    let s =
        e.m.garbage_collect_at(
            &policy(Duration::ZERO, 1, -1),
            true,
            false,
            &live,
            later(HOUR),
        )
        .await
        .expect("gc");
    assert_eq!(s.sandboxes_removed, 2);
    let mut want = vec![s1, s3];
    want.sort();
    assert_eq!(e.sandbox_ids(), want);
}

#[tokio::test]
async fn terminated_pods_go_whole_only_for_eviction() {
    let e = env();
    let sb = e.sandbox("done", 0).await;
    let c = e.container(&sb, "done", "c", 0, false).await;
    e.fake.stop_pod_sandbox(&sb).await.expect("stop");
    let terminated = |_: &str| Some(true);
    let p = policy(Duration::ZERO, 1, -1);
    let s =
        e.m.garbage_collect_at(&p, true, false, &terminated, later(HOUR))
            .await
            .expect("gc");
    assert_eq!(s.containers_removed, 0, "its logs are still read");
    assert_eq!(e.ids(), vec![c]);
    assert!(e.dir.path().join("default_pod-done_done").exists());
    // Eviction's DeleteAllUnusedContainers.
    let s =
        e.m.garbage_collect_at(&p, true, true, &terminated, later(HOUR))
            .await
            .expect("gc");
    assert_eq!((s.containers_removed, s.sandboxes_removed), (1, 1));
    assert!(e.ids().is_empty());
    assert!(
        e.dir.path().join("default_pod-done_done").exists(),
        "the pod is still wanted: its log directory stays"
    );
}

#[tokio::test]
async fn containers_not_the_kubelets_are_left_alone_and_list_failures_surface() {
    let e = env();
    let sb = e.sandbox("u1", 0).await;
    let cfg = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: "crictl".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let foreign = e
        .fake
        .create_container(&sb, cfg, pb::PodSandboxConfig::default())
        .await
        .expect("create");
    e.fake.exit_container(&foreign, 0);
    let p = policy(Duration::ZERO, 0, 0);
    e.m.garbage_collect_at(&p, true, true, &|_: &str| None, later(HOUR))
        .await
        .expect("gc");
    assert_eq!(e.ids(), vec![foreign]);
    e.fake.fail_next(
        "ListContainers",
        cri::CriError::Unavailable {
            op: "ListContainers",
            message: "down".into(),
        },
    );
    assert!(
        e.m.garbage_collect_at(&p, true, true, &live, later(HOUR))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn the_sync_path_prune_removes_logs_too() {
    let e = env();
    let sb = e.sandbox("u1", 0).await;
    e.container(&sb, "u1", "c", 0, false).await;
    e.container(&sb, "u1", "c", 1, false).await;
    let status =
        e.m.get_pod_status("u1", "pod-u1", "default")
            .await
            .expect("status");
    e.m.prune_instances(&status, "c").await;
    assert_eq!(e.fake.containers().len(), 1);
    let logs: &Path = &e.dir.path().join("default_pod-u1_u1/c");
    assert!(!logs.join("0.log").exists());
    assert!(logs.join("1.log").exists());
}

/// `--maximum-dead-containers-per-container=2`: a restart keeps two dead
/// instances, not one; 0 still keeps the newest (`lastState`).
#[tokio::test]
async fn the_sync_path_prune_keeps_what_the_policy_allows() {
    for (keep, left) in [(2, 2), (0, 1)] {
        let e = env_keeping(keep);
        let sb = e.sandbox("u1", 0).await;
        for attempt in 0..3 {
            e.container(&sb, "u1", "c", attempt, false).await;
        }
        let status =
            e.m.get_pod_status("u1", "pod-u1", "default")
                .await
                .expect("status");
        e.m.prune_instances(&status, "c").await;
        assert_eq!(e.fake.containers().len(), left, "keeping {keep}");
    }
}
