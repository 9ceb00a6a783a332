//! Upstream's `KubeletManagedEtcHosts` spec
//! (`test/e2e/common/node/kubelet_etc_hosts.go`) on one joined kubelet: the
//! kubelet writes /etc/hosts for pods without host networking, except for a
//! container that mounts its own /etc/hosts; host-network pods get the host's.

use std::time::Duration;

use kubelet_rs_integration::conformance::*;
use serde_json::{Value, json};

const SPEC: &str = "should test kubelet managed /etc/hosts file";
const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.";

/// A long-running container (upstream: agnhost with no arguments) with `mounts`.
fn container(name: &str, mounts: Value) -> Value {
    let mut c = busybox(
        name,
        &["sh", "-c", "trap exit TERM; while true; do sleep 1; done"],
    );
    c["volumeMounts"] = mounts;
    c
}

fn host_etc_hosts() -> Value {
    json!([{"name": "host-etc-hosts", "hostPath": {"path": "/etc/hosts", "type": "FileOrCreate"}}])
}

/// `assertManagedStatus`: /etc/hosts against /etc/hosts-original (the host's),
/// retried for 30 s as upstream does.
async fn assert_managed(s: &Suite, short: &str, container: &str, expect_managed: bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last;
    loop {
        let hosts = s.exec(short, container, &["cat", "/etc/hosts"]).await;
        let original = s
            .exec(short, container, &["cat", "/etc/hosts-original"])
            .await;
        if let (Ok((0, hosts, _)), Ok((0, original, _))) = (&hosts, &original)
            && !hosts.is_empty()
            && !original.is_empty()
            && (hosts.starts_with(MANAGED_HEADER) && hosts != original) == expect_managed
        {
            return;
        }
        last = format!("/etc/hosts: {hosts:?}; /etc/hosts-original: {original:?}");
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let what = if expect_managed {
        "should be kubelet managed"
    } else {
        "should not be kubelet managed"
    };
    s.fail(
        SPEC,
        format!("pod {short} container {container}: /etc/hosts {what}; {last}"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_managed_etc_hosts() {
    let s = Suite::start().await;
    // Upstream's mounts leave readOnly unset (false).
    let original = json!([{"name": "host-etc-hosts", "mountPath": "/etc/hosts-original"}]);
    let both = json!([
        {"name": "host-etc-hosts", "mountPath": "/etc/hosts-original"},
        {"name": "host-etc-hosts", "mountPath": "/etc/hosts"},
    ]);
    s.pod(
        SPEC,
        "test-pod",
        json!({"spec": {
            "containers": [
                container("busybox-1", original.clone()),
                container("busybox-2", original.clone()),
                container("busybox-3", both.clone()),
            ],
            "volumes": host_etc_hosts(),
        }}),
    )
    .await;
    s.pod(
        SPEC,
        "test-host-network-pod",
        json!({"spec": {
            "hostNetwork": true,
            "securityContext": {},
            "containers": [container("busybox-1", original.clone()), container("busybox-2", original.clone())],
            "volumes": host_etc_hosts(),
        }}),
    )
    .await;
    let ok = s.wait_running(SPEC, "test-pod", POD_TIMEOUT).await
        & s.wait_running(SPEC, "test-host-network-pod", POD_TIMEOUT)
            .await;
    if ok {
        assert_managed(&s, "test-pod", "busybox-1", true).await;
        assert_managed(&s, "test-pod", "busybox-2", true).await;
        assert_managed(&s, "test-pod", "busybox-3", false).await;
        assert_managed(&s, "test-host-network-pod", "busybox-1", false).await;
        assert_managed(&s, "test-host-network-pod", "busybox-2", false).await;
    }
    s.finish("etc_hosts").await;
}
