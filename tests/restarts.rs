//! Restart policies, crash-loop backoff and kubelet restarts on real containerd.

use std::collections::HashMap;
use std::time::Duration;

use kubelet_rs_integration::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies_on_exit_0_and_exit_1() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    let cases = [
        ("always-0", "Always", 0),
        ("always-1", "Always", 1),
        ("onfailure-0", "OnFailure", 0),
        ("onfailure-1", "OnFailure", 1),
        ("never-0", "Never", 0),
        ("never-1", "Never", 1),
    ];
    for (name, policy, code) in cases {
        node.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(name, policy, BUSYBOX, &format!("sleep 1; exit {code}")),
        );
    }
    let t = Duration::from_secs(90);
    // Restarted ones: at least one restart, and the pod stays Running.
    for name in ["always-0", "always-1", "onfailure-1"] {
        let s = node
            .wait_status(name, t, "restarted", |s| {
                container(s, "c").is_some_and(|c| c.restart_count >= 1)
            })
            .await?;
        assert_eq!(s.phase.as_deref(), Some("Running"), "{name}");
    }
    // Not restarted: terminal phase and restartCount 0.
    for (name, phase) in [
        ("onfailure-0", "Succeeded"),
        ("never-0", "Succeeded"),
        ("never-1", "Failed"),
    ] {
        let s = node
            .wait_status(name, t, phase, |s| s.phase.as_deref() == Some(phase))
            .await?;
        let c = container(&s, "c").ctx("container status")?;
        assert_eq!(c.restart_count, 0, "{name}");
        let code = c
            .state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .map(|t| t.exit_code);
        assert_eq!(code, Some(if name == "never-1" { 1 } else { 0 }), "{name}");
    }
    // And they stay that way.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for name in ["onfailure-0", "never-0", "never-1"] {
        let s = node.status(name).ctx("status")?;
        assert_eq!(
            container(&s, "c").map(|c| c.restart_count),
            Some(0),
            "{name}"
        );
    }
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_restart_gaps_grow() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "crash.yaml",
        &pod_yaml("crash", "Always", BUSYBOX, "exit 1"),
    );
    let start = tokio::time::Instant::now();
    let mut first_seen: HashMap<i32, Duration> = HashMap::new();
    let mut saw_backoff = false;
    while start.elapsed() < Duration::from_secs(80) && !first_seen.contains_key(&3) {
        if let Some(s) = node.status("crash") {
            if let Some(c) = container(&s, "c") {
                first_seen.entry(c.restart_count).or_insert(start.elapsed());
            }
            saw_backoff |= waiting_reason(&s, "c").as_deref() == Some("CrashLoopBackOff");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at = |n: i32| {
        first_seen
            .get(&n)
            .copied()
            .ctx(&format!("restart {n} seen: {first_seen:?}"))
    };
    let (r1, r2, r3) = (at(1)?, at(2)?, at(3)?);
    let (gap12, gap23) = (r2 - r1, r3 - r2);
    assert!(saw_backoff, "CrashLoopBackOff shown while waiting");
    // Upstream: immediate first restart, then 10s, 20s (doubling, to 300s).
    assert!(
        gap12 >= Duration::from_secs(8),
        "second restart after {gap12:?}"
    );
    assert!(
        gap23 >= Duration::from_secs(17),
        "third restart after {gap23:?}"
    );
    assert!(gap23 > gap12, "gaps grow: {gap12:?} then {gap23:?}");
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_kubelet_restarts_no_container() -> anyhow::Result<()> {
    let mut node = Node::start(|_| {}).await;
    node.write_manifest("a.yaml", &pod_yaml("a", "Always", BUSYBOX, "sleep 3600"));
    node.write_manifest("b.yaml", &pod_yaml("b", "OnFailure", BUSYBOX, "sleep 3600"));
    let t = Duration::from_secs(60);
    let a = node
        .wait_status("a", t, "running", |s| is_running(s, "c"))
        .await?;
    let b = node
        .wait_status("b", t, "running", |s| is_running(s, "c"))
        .await?;
    let before = (container_id(&a, "c"), container_id(&b, "c"));
    let sandboxes_before: Vec<String> = node.sandboxes().await.into_iter().map(|s| s.id).collect();

    node.restart().await;
    let a = node
        .wait_status("a", t, "running", |s| is_running(s, "c"))
        .await?;
    let b = node
        .wait_status("b", t, "running", |s| is_running(s, "c"))
        .await?;
    // Let several sync ticks, relists and housekeeping rounds pass.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let a = node.status("a").unwrap_or(a);
    let b = node.status("b").unwrap_or(b);
    assert_eq!((container_id(&a, "c"), container_id(&b, "c")), before);
    assert_eq!(container(&a, "c").map(|c| c.restart_count), Some(0));
    assert_eq!(container(&b, "c").map(|c| c.restart_count), Some(0));
    let mut sandboxes_after: Vec<String> =
        node.sandboxes().await.into_iter().map(|s| s.id).collect();
    let mut sb = sandboxes_before;
    sb.sort();
    sandboxes_after.sort();
    assert_eq!(sandboxes_after, sb, "no sandbox created or removed");
    node.cleanup().await;
    Ok(())
}
