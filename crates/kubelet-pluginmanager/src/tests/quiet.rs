//! An idle registry directory is not walked (issue 21): inotify alone
//! brings changes, and the rescan is a safety net a minute apart.

use super::*;

#[tokio::test]
async fn an_idle_directory_is_not_walked_and_a_new_socket_still_registers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start_with(&dir, handler.clone(), PluginManagerConfig::default());
    wait_for("the first walk", || running.desired.walks() >= 1).await;
    let idle = running.desired.walks();
    // Three seconds with nothing happening: no walk (one each 2 s before).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        running.desired.walks(),
        idle,
        "an idle directory was walked"
    );

    // A socket appears: inotify wakes the manager, which registers it.
    let sock = dir.join("q.sock");
    let mut plugin = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "q.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    let status = tokio::time::timeout(DEADLINE, plugin.next_status())
        .await
        .expect("registered through inotify, long before a rescan");
    assert!(status.plugin_registered, "{status:?}");
    assert!(running.desired.walks() > idle);
    assert_eq!(running.desired.sockets(), vec![sock.clone()]);
    plugin.stop.cancel();
    running.stop().await;
}
