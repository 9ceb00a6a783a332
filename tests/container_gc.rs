//! Container garbage collection (upstream `test/e2e_node/garbage_collector_test.go`)
//! on real containerd: a pod whose container restarts keeps its number of
//! dead containers within the limit (`--maximum-dead-containers-per-container`,
//! default 1) while `kubectl logs --previous` still works; dead containers
//! the sync path never prunes, a deleted pod's runtime objects, and the log
//! directory of a pod that is gone are collected.
//!
//! Collection runs every minute from the kubelet's start (upstream
//! `ContainerGCPeriod`), so the test waits for one run after the first.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use cri::{RuntimeService, pb};
use http::StatusCode;
use kubelet_rs_integration::node_api::{Credentials, NodeApiClient};
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);
/// One collection period and some.
const GC_WAIT: Duration = Duration::from_secs(100);

/// Containers named `name` of the pod with `uid`, newest first.
async fn instances(node: &Node, uid: &str, name: &str) -> Vec<pb::Container> {
    let mut v: Vec<_> = node
        .containers()
        .await
        .into_iter()
        .filter(|c| {
            c.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid)
                && c.metadata.as_ref().is_some_and(|m| m.name == name)
        })
        .collect();
    v.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    v
}

/// Adds a container named `old` to the pod's sandbox without starting it:
/// a dead instance of a container the spec no longer has, which only the
/// collector removes (upstream's e2e makes them by restarting containers).
async fn add_dead_container(
    node: &Node,
    sandbox: &str,
    uid: &str,
    pod_name: &str,
    attempt: u32,
) -> anyhow::Result<String> {
    let labels = HashMap::from([
        ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
        ("io.kubernetes.pod.name".to_string(), pod_name.to_string()),
        ("io.kubernetes.pod.namespace".to_string(), "default".into()),
        ("io.kubernetes.container.name".to_string(), "old".into()),
    ]);
    let cfg = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: "old".into(),
            attempt,
        }),
        image: Some(pb::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["true".into()],
        labels,
        ..Default::default()
    };
    let sandbox_cfg = pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: pod_name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    Ok(node
        .runtime
        .create_container(sandbox, cfg, sandbox_cfg)
        .await?)
}

fn pod_log_dir(uid: &str, pod_name: &str) -> PathBuf {
    kubelet_rs_integration::pod_logs_dir().join(format!("default_{pod_name}_{uid}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_containers_sandboxes_and_log_dirs_are_collected_and_previous_logs_kept()
-> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    // A log directory left by a pod that is gone (a kubelet that died
    // between the removal of the runtime objects and of the logs).
    let stray = pod_log_dir(
        &format!("{:08x}-0000-4000-8000-000000000000", rand::random::<u32>()),
        &node.pod_name("stray"),
    );
    std::fs::create_dir_all(stray.join("c"))?;
    std::fs::write(stray.join("c/0.log"), "old\n")?;

    node.write_manifest(
        "crash.yaml",
        &pod_yaml(
            "crash",
            "Always",
            BUSYBOX,
            "echo run-$(date +%s%N); sleep 1; exit 1",
        ),
    );
    node.write_manifest(
        "gone.yaml",
        &pod_yaml("gone", "Always", BUSYBOX, "echo hi; sleep 3600"),
    );
    node.wait_status("crash", T, "running", |s| is_running(s, "c"))
        .await?;
    node.wait_status("gone", T, "running", |s| is_running(s, "c"))
        .await?;
    let uid = node.uid_of("crash").ctx("crash uid")?;
    let gone_uid = node.uid_of("gone").ctx("gone uid")?;
    let sandbox = node
        .sandboxes()
        .await
        .into_iter()
        .find(|s| s.labels.get("io.kubernetes.pod.uid") == Some(&uid))
        .ctx("crash sandbox")?;
    let mut old = Vec::new();
    for attempt in 0..3 {
        old.push(
            add_dead_container(&node, &sandbox.id, &uid, &node.pod_name("crash"), attempt).await?,
        );
    }

    // The deleted pod: its containers, sandbox and log directory go.
    node.remove_manifest("gone.yaml");
    let gone_dir = pod_log_dir(&gone_uid, &node.pod_name("gone"));

    // Wait for a collection: the dead `old` instances drop to the newest.
    let deadline = tokio::time::Instant::now() + GC_WAIT;
    loop {
        let left = instances(&node, &uid, "old").await;
        if left.len() == 1 {
            assert_eq!(left[0].id, old[2], "the newest dead instance stays");
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no collection within {GC_WAIT:?}: {} dead `old` containers",
            left.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The same collection removes the stray log directory (every source
    // has reported by now), after the containers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while stray.exists() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} survived the collection",
            stray.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The restarting container: never more than its current instance and
    // the previous one, whose logs `kubectl logs --previous` reads.
    node.wait_status("crash", T, "restarted", |s| {
        container(s, "c").is_some_and(|c| c.restart_count >= 1)
    })
    .await?;
    let c_instances = instances(&node, &uid, "c").await;
    assert!(
        (1..=2).contains(&c_instances.len()),
        "{} instances of the restarting container",
        c_instances.len()
    );
    let addr = node.handle().server_addr.ctx("server port")?;
    let client = NodeApiClient::new(addr, &node.serving_ca(), &node.name, Credentials::None)?;
    let base = format!("/containerLogs/default/{}/c", node.pod_name("crash"));
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let prev = client.get(&format!("{base}?previous=true")).await?;
        if prev.status == StatusCode::OK && prev.text().starts_with("run-") {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no previous logs: {} {:?}",
            prev.status,
            prev.text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The deleted pod left nothing behind.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let sandboxes = node
            .sandboxes()
            .await
            .into_iter()
            .filter(|s| s.labels.get("io.kubernetes.pod.uid") == Some(&gone_uid))
            .count();
        let containers = node
            .containers()
            .await
            .into_iter()
            .filter(|c| c.labels.get("io.kubernetes.pod.uid") == Some(&gone_uid))
            .count();
        if (sandboxes, containers, gone_dir.exists()) == (0, 0, false) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "deleted pod left {sandboxes} sandboxes, {containers} containers, log dir {}",
            gone_dir.exists()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = std::fs::remove_dir_all(&stray);
    let crash_dir = pod_log_dir(&uid, &node.pod_name("crash"));
    node.cleanup().await;
    let _ = std::fs::remove_dir_all(crash_dir);
    Ok(())
}
