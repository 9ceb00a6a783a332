//! Issue 28: isolation a pod asks for and the node cannot give is refused,
//! never dropped. On containerd 1.6, which reports no runtime handlers and
//! no runtime features over CRI `Status`, upstream's 1.35 kubelet:
//! - leaves a `hostUsers: false` pod in `ContainerCreating` with a
//!   `FailedCreatePodSandBox` event (`can't set \`spec.hostUsers: false\`,
//!   runtime does not support user namespaces: ...`), with no sandbox;
//! - rejects a `supplementalGroupsPolicy: Strict` pod at admission
//!   (`SupplementalGroupsPolicyNotSupported`, upstream
//!   `test/e2e/common/node/security_context.go`'s "SupplementalGroupsPolicy
//!   ... Strict" spec on a node without the feature);
//! - fails a container whose mount asks `recursiveReadOnly: Enabled` with
//!   `CreateContainerConfigError` (`test/e2e_node/mount_rro_linux_test.go`'s
//!   message), and mounts `IfPossible` merely read-only.
//!
//! The same pods without those fields run. On the 1.19 profile the
//! apiserver does not know the fields and drops them, so every pod runs.

use std::time::Duration;

use apiserver_double::Options;
use kubelet_rs_integration::BUSYBOX;
use kubelet_rs_integration::cluster::{Joined, phase, sleeper};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

fn running(p: Option<&Value>) -> bool {
    p.is_some_and(|p| !p["status"]["containerStatuses"][0]["state"]["running"].is_null())
}

fn waiting(p: Option<&Value>) -> (String, String) {
    let w = p.map(|p| p["status"]["containerStatuses"][0]["state"]["waiting"].clone());
    let s = |k: &str| {
        w.as_ref()
            .and_then(|w| w[k].as_str())
            .unwrap_or("")
            .to_string()
    };
    (s("reason"), s("message"))
}

fn with(spec: Value, f: impl FnOnce(&mut Value)) -> Value {
    let mut spec = spec;
    f(&mut spec);
    spec
}

fn rro(mode: &str) -> Value {
    json!({
        "terminationGracePeriodSeconds": 2,
        "volumes": [{"name": "mnt", "emptyDir": {}}],
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "sleep 3600"],
            "volumeMounts": [{"name": "mnt", "mountPath": "/mnt", "readOnly": true,
                "recursiveReadOnly": mode}]}]
    })
}

async fn wait_event(j: &Joined, name: &str, reason: &str, message: &str) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let events = j.pod_events(name);
        if events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == reason && m == message)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: no Warning {reason} {message:?}: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_the_runtime_cannot_give_is_refused_never_dropped() {
    let j = Joined::start(Options::default()).await;
    let knows = j.api.profile().at_least(33);
    let base = sleeper("sleep 3600");
    j.create_pod(
        "userns",
        with(base.clone(), |s| s["hostUsers"] = json!(false)),
    )
    .await;
    j.create_pod(
        "userns-host",
        with(base.clone(), |s| s["hostUsers"] = json!(true)),
    )
    .await;
    j.create_pod(
        "sgp-strict",
        with(base.clone(), |s| {
            s["securityContext"] = json!({"supplementalGroupsPolicy": "Strict"})
        }),
    )
    .await;
    j.create_pod(
        "sgp-merge",
        with(base.clone(), |s| {
            s["securityContext"] = json!({"supplementalGroupsPolicy": "Merge"})
        }),
    )
    .await;
    j.create_pod("rro-enabled", rro("Enabled")).await;
    j.create_pod("rro-ifpossible", rro("IfPossible")).await;

    for name in ["userns-host", "sgp-merge", "rro-ifpossible"] {
        j.wait_api(name, T, "running", running).await;
    }
    if !knows {
        // A 1.19 apiserver drops what it does not know: the pods as stored
        // ask for nothing more, and run.
        for name in ["userns", "sgp-strict", "rro-enabled"] {
            let p = j.wait_api(name, T, "running", running).await;
            let p = p.expect("pod");
            assert!(p["spec"].get("hostUsers").is_none(), "{p}");
            assert!(
                p["spec"]["securityContext"]
                    .get("supplementalGroupsPolicy")
                    .is_none(),
                "{p}"
            );
            assert!(
                p["spec"]["containers"][0]["volumeMounts"][0]
                    .get("recursiveReadOnly")
                    .is_none(),
                "{p}"
            );
        }
        j.cleanup().await;
        return;
    }

    // hostUsers: false, upstream's sandbox failure; no sandbox at all.
    wait_event(
        &j,
        "userns",
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user namespaces: the handler \"\" is not known",
    )
    .await;
    let p = j.api_pod("userns");
    assert_eq!(phase(p.as_ref()), Some("Pending"), "{p:?}");
    assert_eq!(waiting(p.as_ref()).0, "ContainerCreating", "{p:?}");
    let full = j.pod_name("userns");
    assert!(
        !j.node
            .sandboxes()
            .await
            .iter()
            .any(|s| s.labels.get("io.kubernetes.pod.name") == Some(&full)),
        "a hostUsers: false pod got a sandbox on a runtime without user namespaces"
    );

    // Strict supplemental groups: rejected at admission.
    let p = j
        .wait_api("sgp-strict", T, "rejected", |p| phase(p) == Some("Failed"))
        .await
        .expect("pod");
    assert_eq!(
        p["status"]["reason"], "SupplementalGroupsPolicyNotSupported",
        "{p}"
    );
    assert_eq!(
        p["status"]["message"],
        "Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node",
        "{p}"
    );
    wait_event(
        &j,
        "sgp-strict",
        "SupplementalGroupsPolicyNotSupported",
        "SupplementalGroupsPolicy=Strict is not supported in this node",
    )
    .await;

    // recursiveReadOnly: Enabled fails the container, as upstream.
    let want = "failed to resolve recursive read-only mode: volume \"mnt\" requested recursive read-only mode, but it is not supported by the runtime";
    let p = j
        .wait_api("rro-enabled", T, "CreateContainerConfigError", |p| {
            waiting(p).0 == "CreateContainerConfigError"
        })
        .await;
    assert_eq!(waiting(p.as_ref()).1, want, "{p:?}");
    wait_event(&j, "rro-enabled", "Failed", &format!("Error: {want}")).await;
    // And it stays so (retried, never started without it).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!running(j.api_pod("rro-enabled").as_ref()));
    assert!(!running(j.api_pod("userns").as_ref()));
    j.cleanup().await;
}
