//! Static pods from a manifest directory on real containerd.

use std::time::Duration;

use cri::RuntimeService;
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pod_runs_with_upstream_names_labels_and_logs() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "web.yaml",
        &pod_yaml("web", "Always", BUSYBOX, "echo hello-from-web; sleep 3600"),
    );
    let s = node
        .wait_status("web", T, "running", |s| is_running(s, "c"))
        .await?;
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert!(
        s.pod_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.88.")),
        "{:?}",
        s.pod_ip
    );
    let cid = container_id(&s, "c").ctx("container id")?;
    assert!(cid.starts_with("containerd://"), "{cid}");

    // What crictl shows: the pod's names on the sandbox and the container.
    let uid = node.uid_of("web").ctx("uid")?;
    let sandboxes = node.sandboxes().await;
    assert_eq!(sandboxes.len(), 1);
    let sb = &sandboxes[0];
    let meta = sb.metadata.clone().ctx("sandbox metadata")?;
    assert_eq!(
        (
            meta.name.as_str(),
            meta.namespace.as_str(),
            meta.uid.as_str()
        ),
        (node.pod_name("web").as_str(), "default", uid.as_str())
    );
    assert_eq!(sb.labels.get("io.kubernetes.pod.uid"), Some(&uid));
    assert_eq!(
        sb.annotations
            .get("kubernetes.io/config.source")
            .map(String::as_str),
        Some("file")
    );
    assert_eq!(sb.annotations.get("kubernetes.io/config.hash"), Some(&uid));
    let cs = node.containers().await;
    assert_eq!(cs.len(), 1);
    assert_eq!(
        cs[0]
            .labels
            .get("io.kubernetes.container.name")
            .map(String::as_str),
        Some("c")
    );
    assert_eq!(
        cs[0]
            .annotations
            .get("io.kubernetes.container.restartCount")
            .map(String::as_str),
        Some("0")
    );
    assert!(
        cs[0]
            .annotations
            .contains_key("io.kubernetes.container.hash")
    );

    // Logs under /var/log/pods/<ns>_<name>_<uid>/<container>/<restartCount>.log.
    let log = kubelet_rs_integration::pod_logs_dir()
        .join(format!("default_{}_{}", node.pod_name("web"), uid))
        .join("c/0.log");
    let mut found = false;
    for _ in 0..50 {
        if std::fs::read_to_string(&log).is_ok_and(|t| t.contains("hello-from-web")) {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(found, "log line in {}", log.display());
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_manifest_replaces_the_container() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "app.yaml",
        &pod_yaml("app", "Always", BUSYBOX, "echo v1; sleep 3600"),
    );
    let s1 = node
        .wait_status("app", T, "running", |s| is_running(s, "c"))
        .await?;
    let old_uid = node.uid_of("app").ctx("uid")?;
    let old_cid = container_id(&s1, "c").ctx("cid")?;

    node.write_manifest(
        "app.yaml",
        &pod_yaml("app", "Always", BUSYBOX, "echo v2; sleep 3600"),
    );
    let s2 = node
        .wait_status("app", T, "replaced", |s| {
            is_running(s, "c") && container_id(s, "c").is_some_and(|c| c != old_cid)
        })
        .await?;
    assert_ne!(
        node.uid_of("app").ctx("uid")?,
        old_uid,
        "a changed static manifest is a new pod"
    );
    assert!(container_id(&s2, "c").is_some());
    // The old pod's sandbox and container are gone from the runtime.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let old_left = node
            .sandboxes()
            .await
            .iter()
            .any(|s| s.labels.get("io.kubernetes.pod.uid") == Some(&old_uid));
        if !old_left {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "old sandbox still there"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(node.containers().await.len(), 1);
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_manifest_stops_containers_and_the_sandbox() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "gone.yaml",
        &pod_yaml("gone", "Always", BUSYBOX, "sleep 3600"),
    );
    node.wait_status("gone", T, "running", |s| is_running(s, "c"))
        .await?;
    assert_eq!(node.sandboxes().await.len(), 1);
    let uid = node.uid_of("gone").ctx("uid")?;
    let cg = kubelet_rs_integration::lane::pod_memory_cgroup("besteffort", &uid);
    assert!(
        cg.is_dir(),
        "pod cgroup {} exists while running",
        cg.display()
    );
    node.remove_manifest("gone.yaml");
    let deadline = tokio::time::Instant::now() + T;
    while !node.sandboxes().await.is_empty() || !node.containers().await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod still in the runtime"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(node.uid_of("gone").is_none());
    // The pod's cgroup goes too (the runtime only ever creates it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cg.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} left behind",
            cg.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_before_the_app_container() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: init}}\nspec:\n  terminationGracePeriodSeconds: 2\n  initContainers:\n  - {{name: first, image: {BUSYBOX}, command: [sh, -c, 'sleep 1']}}\n  - {{name: second, image: {BUSYBOX}, command: [sh, -c, 'sleep 1']}}\n  containers:\n  - {{name: c, image: {BUSYBOX}, command: [sh, -c, 'sleep 3600']}}\n"
    );
    node.write_manifest("init.yaml", &yaml);
    let pending = node
        .wait_status("init", T, "initializing", |s| {
            s.phase.as_deref() == Some("Pending")
        })
        .await?;
    assert!(!is_running(&pending, "c"));
    let s = node
        .wait_status("init", T, "running", |s| is_running(s, "c"))
        .await?;
    let term = |n: &str| {
        init_container(&s, n)
            .and_then(|c| c.state.as_ref())
            .and_then(|st| st.terminated.clone())
    };
    let first = term("first").ctx("first terminated")?;
    let second = term("second").ctx("second terminated")?;
    assert_eq!((first.exit_code, second.exit_code), (0, 0));
    let first_done = first.finished_at.ctx("first finished")?.0;
    let second_start = second.started_at.ctx("second started")?.0;
    let second_done = second.finished_at.ctx("second finished")?.0;
    let app_start = container(&s, "c")
        .and_then(|c| c.state.as_ref())
        .and_then(|st| st.running.as_ref())
        .and_then(|r| r.started_at.clone())
        .ctx("app started")?
        .0;
    assert!(
        first_done <= second_start,
        "second started before first finished"
    );
    assert!(second_done <= app_start, "app started before init finished");
    let initialized = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Initialized")
        .ctx("cond")?;
    assert_eq!(initialized.status, "True");
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_manifest_is_reported_and_other_pods_keep_running() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "good.yaml",
        &pod_yaml("good", "Always", BUSYBOX, "sleep 3600"),
    );
    let s = node
        .wait_status("good", T, "running", |s| is_running(s, "c"))
        .await?;
    let cid = container_id(&s, "c").ctx("cid")?;
    node.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken\nspec: [",
    );
    node.write_manifest(
        "nocontainers.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n",
    );
    let errors = node
        .handle()
        .manifest_errors
        .clone()
        .ctx("file source errors")?;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let e = errors.lock().clone();
        if e.len() == 2 {
            let broken = e
                .iter()
                .find(|(f, _)| f.ends_with("broken.yaml"))
                .ctx("broken reported")?;
            assert!(broken.1.contains("invalid YAML"), "{}", broken.1);
            let empty = e
                .iter()
                .find(|(f, _)| f.ends_with("nocontainers.yaml"))
                .ctx("empty reported")?;
            assert!(empty.1.contains("spec.containers"), "{}", empty.1);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "errors not reported: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Several resync periods later, the good pod is untouched.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = node.status("good").ctx("good status")?;
    assert!(is_running(&s, "c"));
    assert_eq!(container_id(&s, "c"), Some(cid));
    assert_eq!(container(&s, "c").map(|c| c.restart_count), Some(0));
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_image_gives_err_image_pull_then_backoff_without_affecting_others()
-> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest("ok.yaml", &pod_yaml("ok", "Always", BUSYBOX, "sleep 3600"));
    node.write_manifest(
        "bad.yaml",
        &pod_yaml("bad", "Always", "localhost:5000/does-not-exist:1", "true"),
    );
    node.wait_status("bad", T, "ErrImagePull", |s| {
        waiting_reason(s, "c").as_deref() == Some("ErrImagePull")
    })
    .await?;
    let s = node
        .wait_status("bad", T, "ImagePullBackOff", |s| {
            waiting_reason(s, "c").as_deref() == Some("ImagePullBackOff")
        })
        .await?;
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let ok = node
        .wait_status("ok", T, "running", |s| is_running(s, "c"))
        .await?;
    assert_eq!(container(&ok, "c").map(|c| c.restart_count), Some(0));
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_beyond_max_pods_are_rejected_out_of_pods() -> anyhow::Result<()> {
    let node = Node::start(|f| f.max_pods = Some(1)).await;
    node.write_manifest(
        "first.yaml",
        &pod_yaml("first", "Always", BUSYBOX, "sleep 3600"),
    );
    node.wait_status("first", T, "running", |s| is_running(s, "c"))
        .await?;
    node.write_manifest(
        "second.yaml",
        &pod_yaml("second", "Always", BUSYBOX, "sleep 3600"),
    );
    let s = node
        .wait_status("second", T, "rejected", |s| {
            s.phase.as_deref() == Some("Failed")
        })
        .await?;
    assert_eq!(s.reason.as_deref(), Some("OutOfpods"));
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("capacity: 1")),
        "{:?}",
        s.message
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = node.pod_name("second");
    let started = node
        .sandboxes()
        .await
        .iter()
        .any(|s| s.labels.get("io.kubernetes.pod.name") == Some(&second));
    assert!(!started, "a rejected pod never gets a sandbox");
    assert!(is_running(&node.status("first").ctx("first")?, "c"));
    node.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_pid_ipc_pod_runs_with_the_node_ip() -> anyhow::Result<()> {
    let node = Node::start(|f| f.node_ip = Some("127.0.0.1".into())).await;
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: hn}}\nspec:\n  hostNetwork: true\n  hostPID: true\n  hostIPC: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {BUSYBOX}, command: [sleep, '3600']}}\n"
    );
    node.write_manifest("hn.yaml", &yaml);
    let s = node
        .wait_status("hn", T, "running", |s| is_running(s, "c"))
        .await?;
    assert_eq!(s.host_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(s.pod_ip.as_deref(), Some("127.0.0.1"));
    let ns = node.sandboxes().await[0].clone();
    let status = node.runtime.pod_sandbox_status(&ns.id).await?;
    let mode = status
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .map(|o| o.network);
    assert_eq!(
        mode,
        Some(cri::pb::NamespaceMode::Node as i32),
        "sandbox in the node's network namespace"
    );
    node.cleanup().await;
    Ok(())
}
