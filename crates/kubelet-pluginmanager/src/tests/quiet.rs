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

/// Issue 28: walking the tree (the manager's own reads, and anyone else's)
/// wakes nothing; a socket bound in a subdirectory made after the start is
/// registered through inotify, not by the minute's rescan.
#[tokio::test]
async fn reads_of_the_tree_wake_nothing_and_a_new_subdirectory_is_watched() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = registry(&tmp);
    std::fs::create_dir_all(dir.join("old")).expect("mkdir");
    let handler = Arc::new(FakeHandler::default());
    let running = start_with(&dir, handler.clone(), PluginManagerConfig::default());
    wait_for("the first walk", || running.desired.walks() >= 1).await;
    let idle = running.desired.walks();
    for _ in 0..10 {
        crate::scan::scan(&dir, |_| {}).expect("walk");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        running.desired.walks(),
        idle,
        "reading the tree woke the manager"
    );

    let sub = dir.join("new").join("deeper");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let sock = sub.join("r.sock");
    let mut plugin = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "r.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    let status = tokio::time::timeout(DEADLINE, plugin.next_status())
        .await
        .expect("registered through inotify, long before a rescan");
    assert!(status.plugin_registered, "{status:?}");
    // And in a directory that was there at the start.
    let sock = dir.join("old").join("s.sock");
    let mut plugin2 = serve_plugin(
        &sock,
        info(CSI_PLUGIN, "s.example.com", "", &["1.0.0"]),
        false,
        0,
    );
    let status = tokio::time::timeout(DEADLINE, plugin2.next_status())
        .await
        .expect("registered through inotify");
    assert!(status.plugin_registered, "{status:?}");
    plugin.stop.cancel();
    plugin2.stop.cancel();
    running.stop().await;
}
