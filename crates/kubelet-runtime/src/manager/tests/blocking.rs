//! No blocking IO on the async runtime: the runtime manager reads
//! resolv.conf and termination messages off it (FIFOs with no writer).

use super::*;

/// A FIFO at `path`: opening it for reading blocks until a writer comes.
fn fifo(path: &std::path::Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

/// After `after`, writes `text` into the FIFO at `path` from a plain thread
/// (retrying until a reader has it open, for at most 10 s).
fn feed_fifo_later(
    path: &std::path::Path,
    text: &'static str,
    after: Duration,
) -> std::thread::JoinHandle<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        for _ in 0..200 {
            // O_NONBLOCK: fails at once while nobody reads, instead of hanging.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(0o4000)
                .open(&path);
            if let Ok(mut f) = f {
                let _ = f.write_all(text.as_bytes());
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

/// True when a 100 ms timer on this (single-threaded) runtime fired within a
/// second while `work` ran, i.e. `work` never blocked the runtime's thread.
async fn runtime_stays_responsive<F>(work: F) -> (bool, F::Output)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let t0 = SystemTime::now();
    let task = tokio::spawn(work);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let responsive = t0.elapsed().unwrap_or_default() < Duration::from_secs(1);
    let out = task.await.expect("task");
    (responsive, out)
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_resolv_conf_does_not_block_the_runtime() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let resolv = dir.path().join("resolv.conf");
    fifo(&resolv);
    let cfg = RuntimeConfig {
        pod_logs_dir: dir.path().to_path_buf(),
        root_dir: dir.path().join("root"),
        resolv_conf: resolv.to_string_lossy().into_owned(),
        ..Default::default()
    };
    let m = Arc::new(KubeRuntimeManager::new(
        Arc::new(fake.clone()),
        Arc::new(fake.clone()),
        cfg,
    ));
    let writer = feed_fifo_later(
        &resolv,
        "nameserver 192.0.2.53\n",
        Duration::from_millis(1500),
    );
    let p = pod("Always");
    let (responsive, r) = runtime_stays_responsive(async move {
        m.sync_pod(&p, &PodStatus::default(), SystemTime::now())
            .await
    })
    .await;
    let _ = writer.join();
    assert!(responsive, "reading resolv.conf blocked the async runtime");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    // It was read all the same: ClusterFirst without clusterDNS uses the node's resolver.
    let servers: Vec<String> = fake
        .sandbox_configs()
        .into_iter()
        .flat_map(|c| c.dns_config.map(|d| d.servers).unwrap_or_default())
        .collect();
    assert_eq!(servers, vec!["192.0.2.53"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_termination_message_does_not_block_the_runtime() {
    let fake = FakeRuntime::new();
    let dir = tempfile_dir();
    let m = Arc::new(manager(&fake, dir.path()));
    let msg = dir.path().join("message");
    fifo(&msg);
    let p = pod("Always");
    let sb_cfg = sandbox_config(
        &RuntimeConfig::default(),
        &p,
        0,
        &crate::sandbox::HostDns::default(),
    );
    let sb = fake
        .run_pod_sandbox(sb_cfg.clone(), "")
        .await
        .expect("sandbox");
    let cc = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        }),
        labels: crate::labels::container_labels(&p, &pod::containers(&p)[0]),
        annotations: HashMap::from([(
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_string(),
            "/dev/termination-log".to_string(),
        )]),
        mounts: vec![pb::Mount {
            container_path: "/dev/termination-log".into(),
            host_path: msg.to_string_lossy().into_owned(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let id = fake
        .create_container(&sb, cc, sb_cfg)
        .await
        .expect("create");
    fake.start_container(&id).await.expect("start");
    fake.exit_container(&id, 1);
    let writer = feed_fifo_later(&msg, "disk full", Duration::from_millis(1500));
    let (responsive, status) =
        runtime_stays_responsive(async move { m.get_pod_status("uid-1", "p", "default").await })
            .await;
    let _ = writer.join();
    assert!(
        responsive,
        "reading the termination message blocked the async runtime"
    );
    let status = status.expect("status");
    assert_eq!(
        status.find_container("c").map(|c| c.message.as_str()),
        Some("disk full")
    );
}
