//! Runtime changes made behind the kubelet's back, and graceful termination, on real containerd.

use std::time::Duration;

use cri::RuntimeService;
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sandbox_is_recreated_with_the_next_attempt() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest("sb.yaml", &pod_yaml("sb", "Always", BUSYBOX, "sleep 3600"));
    let s = node
        .wait_status("sb", T, "running", |s| is_running(s, "c"))
        .await?;
    let old_cid = container_id(&s, "c").ctx("cid")?;
    let old = node.sandboxes().await;
    assert_eq!(old.len(), 1);
    // What `crictl stopp` does: the pause process and the pod's containers go away.
    node.runtime.stop_pod_sandbox(&old[0].id).await?;
    let s = node
        .wait_status("sb", T, "running again", |s| {
            is_running(s, "c") && container_id(s, "c").is_some_and(|c| c != old_cid)
        })
        .await?;
    let ready: Vec<_> = node
        .sandboxes()
        .await
        .into_iter()
        .filter(|s| s.state == cri::pb::PodSandboxState::SandboxReady as i32)
        .collect();
    assert_eq!(ready.len(), 1, "one new ready sandbox");
    assert_ne!(ready[0].id, old[0].id);
    assert_eq!(ready[0].metadata.as_ref().map(|m| m.attempt), Some(1));
    assert_eq!(container(&s, "c").map(|c| c.restart_count), Some(1));
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_behind_our_back_is_restarted_within_seconds() -> anyhow::Result<()> {
    // A long resync: only the PLEG can notice in time.
    let node = Node::start(|f| f.sync_frequency = Some("10m".into())).await;
    node.write_manifest("k.yaml", &pod_yaml("k", "Always", BUSYBOX, "sleep 3600"));
    let s = node
        .wait_status("k", T, "running", |s| is_running(s, "c"))
        .await?;
    let cid = container_id(&s, "c").ctx("cid")?;
    let raw = cid.trim_start_matches("containerd://").to_string();
    node.runtime.stop_container(&raw, Duration::ZERO).await?;
    let t0 = tokio::time::Instant::now();
    node.wait_status("k", Duration::from_secs(15), "restarted", |s| {
        is_running(s, "c") && container(s, "c").is_some_and(|c| c.restart_count == 1)
    })
    .await?;
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "restart took {:?}",
        t0.elapsed()
    );
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_waits_for_the_grace_period_then_kills() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    // Ignores SIGTERM: only the kill after terminationGracePeriodSeconds stops it.
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: g}}\nspec:\n  terminationGracePeriodSeconds: 4\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sh, -c, \"trap '' TERM; while true; do sleep 1; done\"]\n"
    );
    node.write_manifest("g.yaml", &yaml);
    node.wait_status("g", T, "running", |s| is_running(s, "c"))
        .await?;
    node.remove_manifest("g.yaml");
    let t0 = tokio::time::Instant::now();
    let mut stopped_after = None;
    while t0.elapsed() < T {
        let running = node
            .containers()
            .await
            .iter()
            .any(|c| c.state == cri::pb::ContainerState::ContainerRunning as i32);
        if !running {
            stopped_after = Some(t0.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = stopped_after.ctx("container never stopped")?;
    assert!(
        took >= Duration::from_secs(3),
        "killed before the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_message_from_file_or_from_logs() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "msg.yaml",
        &pod_yaml(
            "msg",
            "Never",
            BUSYBOX,
            "echo -n all done > /dev/termination-log; exit 3",
        ),
    );
    let fallback = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: logs}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [sh, -c, 'echo first >&2; echo it broke >&2; exit 2']\n"
    );
    node.write_manifest("logs.yaml", &fallback);
    let terminated = |s: &k8s_openapi::api::core::v1::PodStatus| {
        container(s, "c")
            .and_then(|c| c.state.as_ref())
            .and_then(|st| st.terminated.clone())
    };
    let s = node
        .wait_status("msg", T, "Failed", |s| s.phase.as_deref() == Some("Failed"))
        .await?;
    let t = terminated(&s).ctx("terminated")?;
    assert_eq!((t.exit_code, t.message.as_deref()), (3, Some("all done")));
    let s = node
        .wait_status("logs", T, "Failed", |s| {
            s.phase.as_deref() == Some("Failed")
        })
        .await?;
    let t = terminated(&s).ctx("terminated")?;
    assert_eq!(t.exit_code, 2);
    assert_eq!(t.message.as_deref(), Some("first\nit broke"));
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_deadline_stops_the_pod_and_fails_it() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: dl}}\nspec:\n  activeDeadlineSeconds: 3\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {BUSYBOX}, command: [sleep, '3600']}}\n"
    );
    node.write_manifest("dl.yaml", &yaml);
    node.wait_status("dl", T, "running", |s| is_running(s, "c"))
        .await?;
    let s = node
        .wait_status("dl", T, "DeadlineExceeded", |s| {
            s.reason.as_deref() == Some("DeadlineExceeded")
        })
        .await?;
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    // Stopped, and it stays stopped and failed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let running = node
        .containers()
        .await
        .iter()
        .any(|c| c.state == cri::pb::ContainerState::ContainerRunning as i32);
    assert!(!running, "containers stopped");
    let s = node.status("dl").ctx("status")?;
    assert_eq!(
        (s.phase.as_deref(), s.reason.as_deref()),
        (Some("Failed"), Some("DeadlineExceeded"))
    );
    node.cleanup().await;
    Ok(())
}
