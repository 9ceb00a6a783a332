//! The connection monitor: plugins that stop answering on a socket that
//! stays (upstream `pluginwatcher/monitor.go`).

use super::*;

fn monitored() -> PluginManagerConfig {
    PluginManagerConfig {
        rescan_interval: Duration::from_millis(300),
        connection_check_interval: Duration::from_millis(200),
        max_check_failures: 2,
        ..PluginManagerConfig::default()
    }
}

#[tokio::test]
async fn a_hung_plugin_is_unregistered_and_registered_again_when_it_answers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start_with(&dir, handler.clone(), monitored());
    let sock = dir.join("h.sock");
    let mut plugin = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "h.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    assert!(plugin.next_status().await.plugin_registered);

    // The socket stays, but the plugin stops answering.
    plugin.unhealthy.store(true, Ordering::SeqCst);
    let gone = Call::Deregister("h.example.com".into(), sock.clone());
    wait_for("the deregistration", || handler.calls().contains(&gone)).await;
    assert!(running.actual.registered_plugins().is_empty());

    // It recovers on the same socket: no inotify event, the monitor sees it.
    plugin.unhealthy.store(false, Ordering::SeqCst);
    assert!(plugin.next_status().await.plugin_registered);
    let registers = handler
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Register(..)))
        .count();
    assert_eq!(registers, 2);
    assert!(running.actual.plugin_at(&sock).is_some());
    running.stop().await;
    plugin.stop.cancel();
}

#[tokio::test]
async fn a_plugin_gone_without_removing_its_socket_is_unregistered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start_with(&dir, handler.clone(), monitored());
    let sock = dir.join("crashed.sock");
    let mut plugin = serve_plugin(
        &sock,
        info(DEVICE_PLUGIN, "example.com/nic", "", &["v1beta1"]),
        false,
        0,
    );
    assert!(plugin.next_status().await.plugin_registered);

    // The process dies; its socket file stays behind.
    plugin.stop.cancel();
    let gone = Call::Deregister("example.com/nic".into(), sock.clone());
    wait_for("the deregistration", || handler.calls().contains(&gone)).await;
    assert!(sock.exists());
    assert!(running.actual.registered_plugins().is_empty());
    running.stop().await;
}
