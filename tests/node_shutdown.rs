//! Graceful node shutdown (upstream `test/e2e_node/node_shutdown_linux_test.go`)
//! against a test logind on a private D-Bus (`dbus-daemon`; these machines
//! have no systemd): the kubelet raises logind's `InhibitDelayMaxSec` through
//! its drop-in and takes a delay lock at start; on `PrepareForShutdown(true)`
//! the Node becomes NotReady ("node is shutting down") at once, not on the
//! next status tick (the default 10s), a new pod is refused (`NodeShutdown`),
//! the non-critical pods end `Failed`/`Terminated` with upstream's message
//! and `DisruptionTarget` while the critical pod still runs and the lock is
//! still held, then the critical pod, and only then is the lock's file
//! descriptor closed.

use std::time::Duration;

use apiserver_double::Options;
use kubelet_nodeshutdown::testing::TestLogind;
use kubelet_rs_integration::cluster::{Joined, phase, sleeper};
use serde_json::{Value, json};

const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Exits on SIGTERM.
const RUN: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";
/// Ignores SIGTERM (a shell as PID 1 without a handler): dies only when
/// its grace period runs out.
const STUBBORN: &str = "while true; do sleep 1; done";

fn terminated(p: Option<&Value>) -> bool {
    phase(p) == Some("Failed")
}

fn ready_condition(node: &Value) -> Option<Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_killed_by_priority_then_the_inhibitor_lock_is_released() {
    let dir = tempfile::tempdir().expect("tmp");
    // logind allows 5s; the kubelet needs 10s (6s + 4s for critical pods).
    let logind = TestLogind::start(dir.path(), Duration::from_secs(5))
        .await
        .expect("test logind (dbus-daemon from deploy/setup-runtime.sh)");
    let config = dir.path().join("kubelet-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 4s\n\
             shutdownSystemBusAddress: \"{}\"\nshutdownLogindConfigDirectory: \"{}\"\n",
            logind.address,
            logind.logind_conf_dir().display()
        ),
    )
    .expect("config file");
    let j = Joined::start_with(Options::default(), |f, _| f.config = Some(config.clone())).await;

    // At start: the drop-in, logind reloaded, the delay lock taken.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while logind.inhibit_calls().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no inhibitor lock taken"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let call = &logind.inhibit_calls()[0];
    assert_eq!(
        (call.what.as_str(), call.who.as_str(), call.mode.as_str()),
        ("shutdown", "kubelet", "delay")
    );
    assert_eq!(logind.inhibit_delay_max(), Duration::from_secs(10));
    assert_eq!(
        logind.kill_unit_calls(),
        vec![("systemd-logind.service".to_string(), "all".to_string(), 1)]
    );

    // The critical pod also ignores SIGTERM: it runs its whole share (4s)
    // after the non-critical ones, a window to see the lock still held.
    let mut critical = sleeper(STUBBORN);
    critical["terminationGracePeriodSeconds"] = json!(30);
    critical["priorityClassName"] = json!("system-node-critical");
    critical["priority"] = json!(2_000_001_000);
    let mut stubborn = sleeper(STUBBORN);
    stubborn["terminationGracePeriodSeconds"] = json!(30);
    j.create_pod("sd-normal", sleeper(RUN)).await;
    j.create_pod("sd-stubborn", stubborn).await;
    j.create_pod("sd-critical", critical).await;
    for name in ["sd-normal", "sd-stubborn", "sd-critical"] {
        j.wait_api(name, Duration::from_secs(60), "Running", |p| {
            phase(p) == Some("Running")
        })
        .await;
    }
    assert!(
        !logind.lock_released(0),
        "the lock is held before any shutdown"
    );

    logind.prepare_for_shutdown(true).await.expect("signal");

    // NotReady with upstream's message, pushed at once: well before the
    // next status tick (nodeStatusUpdateFrequency keeps its default, 10s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let node = j.api.get("nodes", "", &j.node.name).expect("node");
        let ready = ready_condition(&node).unwrap_or_default();
        if ready["status"] == "False" {
            assert_eq!(ready["reason"], "KubeletNotReady");
            assert_eq!(ready["message"], "node is shutting down", "{ready}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Node is still Ready 5s after the shutdown signal: {ready}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A pod that arrives now is refused.
    j.create_pod("sd-late", sleeper(RUN)).await;

    // Non-critical pods first; the critical pod runs until both are gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let mut lock_held_after_non_critical = None;
    loop {
        let normal = j.api_pod("sd-normal");
        let stubborn = j.api_pod("sd-stubborn");
        let critical = j.api_pod("sd-critical");
        if terminated(critical.as_ref()) {
            assert!(
                terminated(normal.as_ref()) && terminated(stubborn.as_ref()),
                "the critical pod ended before the non-critical ones: {}",
                serde_json::to_string_pretty(&stubborn).unwrap_or_default()
            );
            break;
        }
        if terminated(normal.as_ref())
            && terminated(stubborn.as_ref())
            && lock_held_after_non_critical.is_none()
        {
            // The critical pod has its 4s share still to run.
            assert_eq!(phase(critical.as_ref()), Some("Running"));
            lock_held_after_non_critical = Some(!logind.lock_released(0));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pods not terminated; critical: {}",
            serde_json::to_string_pretty(&critical).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        lock_held_after_non_critical,
        Some(true),
        "the lock is held while the critical pod is killed"
    );

    for name in ["sd-normal", "sd-stubborn", "sd-critical"] {
        let p = j.api_pod(name).expect("pod");
        assert_eq!(p["status"]["reason"], "Terminated", "{name}");
        assert_eq!(p["status"]["message"], MESSAGE, "{name}");
        let disruption = p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(disruption["status"], "True", "{name}: {p}");
        assert_eq!(disruption["reason"], "TerminationByKubelet", "{name}");
        assert_eq!(disruption["message"], MESSAGE, "{name}");
    }
    // The stubborn pod got the non-critical share (6s), not its own 30s.
    let finished = |name: &str| {
        j.api_pod(name).and_then(|p| {
            p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
                .as_str()
                .map(String::from)
        })
    };
    let (stubborn_end, critical_end) = (finished("sd-stubborn"), finished("sd-critical"));
    assert!(
        stubborn_end.is_some() && stubborn_end <= critical_end,
        "non-critical before critical: {stubborn_end:?} {critical_end:?}"
    );

    assert!(
        logind.wait_lock_released(0, Duration::from_secs(15)).await,
        "the inhibitor lock is closed after the kills"
    );

    // The pod created after the signal was never admitted.
    let late = j
        .wait_api("sd-late", Duration::from_secs(30), "Failed", terminated)
        .await
        .expect("pod");
    assert_eq!(late["status"]["reason"], "NodeShutdown", "{late}");
    assert_eq!(
        late["status"]["message"],
        // Upstream's `rejectPod` prefix, then the shutdown admit message.
        "Pod was rejected: Pod was rejected as the node is shutting down."
    );

    // Still NotReady, and the Node event.
    let node = j.api.get("nodes", "", &j.node.name).expect("node");
    assert_eq!(
        ready_condition(&node).unwrap_or_default()["message"],
        "node is shutting down"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let found = j.api.list("events").iter().any(|e| {
            e["involvedObject"]["kind"] == "Node"
                && e["reason"] == "Shutdown"
                && e["type"] == "Normal"
                && e["message"] == "Shutdown manager detected shutdown event"
        });
        if found {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Shutdown event on the Node"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Cancelled: Ready again and a new lock.
    logind.prepare_for_shutdown(false).await.expect("signal");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let node = j.api.get("nodes", "", &j.node.name).expect("node");
        if ready_condition(&node).is_some_and(|c| c["status"] == "True")
            && logind.inhibit_calls().len() == 2
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not Ready again with a new lock after the cancellation"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    j.cleanup().await;
    logind.stop().await;
}
