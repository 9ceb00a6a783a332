//! The shutdown manager over a real D-Bus connection (a private
//! `dbus-daemon` with the test logind and systemd): the drop-in and
//! `KillUnit` raise logind's delay, the lock is a real file descriptor,
//! `PrepareForShutdown` reaches the manager, the lock is closed after the
//! kills and taken again on cancel.

use std::sync::Arc;
use std::time::Duration;

use kubelet_nodeshutdown::testing::TestLogind;
use kubelet_nodeshutdown::{
    KillFailed, Manager, Node, ShutdownPod, SystemdConnector, migrate_config,
};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Node for Recorder {
    fn active_pods(&self) -> Vec<ShutdownPod> {
        vec![ShutdownPod {
            uid: "u1".into(),
            name: "default/p1".into(),
            priority: 0,
            termination_grace_period_seconds: Some(30),
        }]
    }
    async fn kill_pod(&self, pod: &ShutdownPod, grace: i64) -> Result<(), KillFailed> {
        self.log.lock().push(format!("kill {} {grace}", pod.name));
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.log.lock().push(format!("killed {}", pod.name));
        Ok(())
    }
    fn set_shutting_down(&self, v: bool) {
        self.log.lock().push(format!("shutting down {v}"));
    }
    fn record_event(&self, message: &str) {
        self.log.lock().push(message.to_string());
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_holds_and_releases_a_logind_delay_lock() {
    let dir = tempfile::tempdir().expect("tmp");
    let logind = TestLogind::start(dir.path(), Duration::from_secs(5))
        .await
        .expect("test bus (dbus-daemon installed by deploy/setup-runtime.sh)");
    let node = Arc::new(Recorder::default());
    let m = Manager::new(
        migrate_config(Duration::from_secs(10), Duration::from_secs(4)),
        node.clone(),
    )
    .expect("enabled");
    let stop = CancellationToken::new();
    let task = tokio::spawn(m.run(
        Arc::new(SystemdConnector {
            address: logind.address.clone(),
            logind_conf_dir: logind.logind_conf_dir(),
        }),
        stop.clone(),
    ));
    until("lock taken", || logind.inhibit_calls().len() == 1).await;
    let call = &logind.inhibit_calls()[0];
    assert_eq!(
        (call.what.as_str(), call.who.as_str(), call.mode.as_str()),
        ("shutdown", "kubelet", "delay")
    );
    assert_eq!(call.why, "Kubelet needs time to handle node shutdown");
    // 5s was too short for 10s: the drop-in, then SIGHUP to logind.
    let dropin =
        std::fs::read_to_string(logind.logind_conf_dir().join("99-kubelet.conf")).expect("drop-in");
    assert_eq!(
        dropin,
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=10\n"
    );
    assert_eq!(
        logind.kill_unit_calls(),
        vec![("systemd-logind.service".to_string(), "all".to_string(), 1)]
    );
    assert_eq!(logind.inhibit_delay_max(), Duration::from_secs(10));
    assert!(!logind.lock_released(0), "held until a shutdown");

    logind.prepare_for_shutdown(true).await.expect("signal");
    until("pod kill issued", || {
        node.log.lock().iter().any(|l| l.starts_with("kill "))
    })
    .await;
    // Checked before the lock: the kill still running then means the lock
    // must be held.
    let still_killing = !node.log.lock().iter().any(|l| l.starts_with("killed "));
    let released_during_kill = logind.lock_released(0);
    assert!(still_killing, "the kill takes 1s");
    assert!(
        !released_during_kill,
        "the lock is held while the pod is killed"
    );
    assert!(
        logind.wait_lock_released(0, Duration::from_secs(10)).await,
        "released after the kills"
    );
    assert_eq!(
        *node.log.lock(),
        vec![
            "Shutdown manager detected shutdown event",
            "shutting down true",
            "kill default/p1 6",
            "killed default/p1",
        ]
    );

    logind.prepare_for_shutdown(false).await.expect("signal");
    until("lock taken again", || logind.inhibit_calls().len() == 2).await;
    assert!(!logind.lock_released(1));
    assert_eq!(
        node.log.lock()[4..],
        [
            "Shutdown manager detected shutdown cancellation",
            "shutting down false"
        ]
    );
    stop.cancel();
    task.await.expect("manager ends");
    assert!(
        logind.wait_lock_released(1, Duration::from_secs(5)).await,
        "closed when the kubelet stops"
    );
    logind.stop().await;
}

#[tokio::test]
async fn no_bus_is_logged_and_the_manager_returns() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = Manager::new(
        migrate_config(Duration::from_secs(10), Duration::ZERO),
        Arc::new(Recorder::default()),
    )
    .expect("enabled");
    let connect = SystemdConnector {
        address: format!("unix:path={}/nothing", dir.path().display()),
        logind_conf_dir: dir.path().join("conf"),
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        m.run(Arc::new(connect), CancellationToken::new()),
    )
    .await
    .expect("returns without a bus");
}
