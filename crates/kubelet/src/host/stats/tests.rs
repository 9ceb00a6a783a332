use std::sync::Arc;

use super::*;

#[tokio::test(start_paused = true)]
async fn concurrent_scrapes_share_one_collection() {
    let cache = Arc::new(SummaryCache::default());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let scrape = |full: bool| {
        let cache = cache.clone();
        let calls = calls.clone();
        async move {
            cache
                .get_or_collect(full, || async {
                    calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    Ok(Summary::default())
                })
                .await
        }
    };
    let all = futures::future::join_all((0..8).map(|_| scrape(true))).await;
    assert!(all.iter().all(Result::is_ok));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // A cpu-and-memory scrape is served by the full summary.
    scrape(false).await.expect("ok");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    tokio::time::sleep(SUMMARY_REUSE).await;
    scrape(true).await.expect("ok");
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "stale: collected again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reader_asking_for_newer_stats_never_gets_an_older_collection() {
    let cache = SummaryCache::default();
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let collect = || async {
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        Ok(Summary::default())
    };
    let before = tokio::time::Instant::now();
    cache.get_or_collect(true, collect).await.expect("ok");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // Still within SUMMARY_REUSE for a scrape ...
    cache.get_or_collect(true, collect).await.expect("ok");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // ... but started before what eviction asks for: collected again.
    let now = tokio::time::Instant::now();
    cache
        .get_or_collect_since(true, now, collect)
        .await
        .expect("ok");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    // A collection started at or after the time asked for is shared.
    cache
        .get_or_collect_since(true, now, collect)
        .await
        .expect("ok");
    cache
        .get_or_collect_since(true, before, collect)
        .await
        .expect("ok");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[test]
fn chooses_ready_sandbox_and_running_containers() {
    let sb = |id: &str, uid: &str, state: pb::PodSandboxState, created: i64| pb::PodSandbox {
        id: id.into(),
        metadata: Some(pb::PodSandboxMetadata {
            name: "p".into(),
            uid: uid.into(),
            namespace: "ns".into(),
            attempt: 0,
        }),
        state: state as i32,
        created_at: created,
        ..Default::default()
    };
    let ct = |id: &str, sandbox: &str, state: pb::ContainerState| pb::Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        metadata: Some(pb::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        state: state as i32,
        ..Default::default()
    };
    let pods = choose(
        vec![
            sb("old-ready", "u1", pb::PodSandboxState::SandboxReady, 1),
            sb("new-dead", "u1", pb::PodSandboxState::SandboxNotready, 2),
            sb("gone", "u2", pb::PodSandboxState::SandboxNotready, 3),
        ],
        vec![
            ct("c1", "old-ready", pb::ContainerState::ContainerRunning),
            ct("c0", "old-ready", pb::ContainerState::ContainerExited),
            ct("c2", "new-dead", pb::ContainerState::ContainerRunning),
        ],
        Path::new("/var/log/pods"),
    );
    let ids: Vec<&str> = pods.iter().map(|p| p.sandbox.id.as_str()).collect();
    assert_eq!(ids, ["old-ready", "gone"]);
    let c: Vec<&str> = pods[0]
        .containers
        .iter()
        .map(|c| c.container.id.as_str())
        .collect();
    assert_eq!(c, ["c1"]);
    assert_eq!(
        pods[0].containers[0].log_dir,
        Path::new("/var/log/pods/ns_p_u1/app")
    );
    assert!(pods[1].containers.is_empty());
}

mod runtime_failures;
