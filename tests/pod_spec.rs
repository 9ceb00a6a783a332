//! Pod spec features reaching the container on real containerd, checked from inside with ExecSync.

use std::time::Duration;

use cri::RuntimeService;
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(60);

async fn exec(
    node: &Node,
    pod: &str,
    container: &str,
    script: &str,
) -> anyhow::Result<(i32, String)> {
    let s = node.status(pod).ctx("status")?;
    let id = container_id(&s, container).ctx("container id")?;
    let out = node
        .runtime
        .exec_sync(
            id.trim_start_matches("containerd://"),
            vec!["sh".into(), "-c".into(), script.into()],
            Duration::from_secs(10),
        )
        .await?;
    Ok((
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    ))
}

fn manifest(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n{spec}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_resources_env_and_namespaces_reach_the_container() -> anyhow::Result<()> {
    let node = Node::start(|_| {}).await;
    node.write_manifest(
        "sec.yaml",
        &manifest(
            "sec",
            &format!(
                "  securityContext: {{runAsUser: 1000, runAsGroup: 3000, seccompProfile: {{type: RuntimeDefault}}, sysctls: [{{name: net.ipv4.ping_group_range, value: '0 2147483647'}}]}}\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n"
            ),
        ),
    );
    node.write_manifest(
        "res.yaml",
        &manifest(
            "res",
            &format!(
                "  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    workingDir: /tmp\n    env: [{{name: A, value: one}}, {{name: B, value: '$(A)-two'}}]\n    resources: {{limits: {{cpu: 500m, memory: 64Mi}}}}\n"
            ),
        ),
    );
    node.write_manifest(
        "priv.yaml",
        &manifest("priv", &format!("  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    securityContext: {{privileged: true}}\n")),
    );
    node.write_manifest(
        "share.yaml",
        &manifest(
            "share",
            &format!(
                "  shareProcessNamespace: true\n  containers:\n  - {{name: a, image: {BUSYBOX}, command: [sh, -c, 'exec sleep 3601']}}\n  - {{name: b, image: {BUSYBOX}, command: [sleep, '3600']}}\n"
            ),
        ),
    );
    node.write_manifest(
        "port.yaml",
        &manifest(
            "port",
            &format!(
                "  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [httpd, -f, -p, '8080']\n    ports: [{{containerPort: 8080, hostPort: 18080}}]\n"
            ),
        ),
    );
    for name in ["sec", "res", "priv", "port"] {
        node.wait_status(name, T, "running", |s| is_running(s, "c"))
            .await?;
    }
    node.wait_status("share", T, "running", |s| {
        is_running(s, "a") && is_running(s, "b")
    })
    .await?;

    let (_, uid) = exec(&node, "sec", "c", "id -u; id -g").await?;
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        vec!["1000", "3000"]
    );
    let (code, _) = exec(&node, "sec", "c", "touch /x").await?;
    assert_ne!(code, 0, "read-only root filesystem");
    let (_, caps) = exec(&node, "sec", "c", "grep CapEff /proc/self/status").await?;
    assert!(
        caps.ends_with("0000000000000000"),
        "all capabilities dropped: {caps}"
    );
    let (_, range) = exec(&node, "sec", "c", "cat /proc/sys/net/ipv4/ping_group_range").await?;
    assert_eq!(
        range.split_whitespace().collect::<Vec<_>>(),
        vec!["0", "2147483647"]
    );

    let (_, out) = exec(&node, "res", "c", "echo $B; pwd").await?;
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["one-two", "/tmp"]);
    let (_, mem) = exec(
        &node,
        "res",
        "c",
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
    )
    .await?;
    assert_eq!(mem, "67108864");
    let (_, quota) = exec(
        &node,
        "res",
        "c",
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max",
    )
    .await?;
    assert_eq!(quota, "50000");

    let (_, masked) = exec(
        &node,
        "sec",
        "c",
        "cat /proc/kcore >/dev/null 2>&1 && echo open || echo masked",
    )
    .await?;
    assert_eq!(
        masked, "masked",
        "default masked paths in unprivileged containers"
    );
    let (_, caps) = exec(&node, "priv", "c", "grep CapEff /proc/self/status").await?;
    assert!(
        !caps.ends_with("0000000000000000"),
        "privileged has capabilities: {caps}"
    );

    let (_, ps) = exec(&node, "share", "b", "ps -o args").await?;
    assert!(
        ps.contains("sleep 3601"),
        "b sees a's process with a shared PID namespace: {ps}"
    );

    let sandboxes = node.sandboxes().await;
    let port_pod = node.pod_name("port");
    let port_sb = sandboxes
        .iter()
        .find(|s| s.labels.get("io.kubernetes.pod.name") == Some(&port_pod))
        .ctx("port sandbox")?;
    let st = node.runtime.pod_sandbox_status(&port_sb.id).await?;
    assert!(st.network.is_some_and(|n| !n.ip.is_empty()));
    node.cleanup().await;
    Ok(())
}
