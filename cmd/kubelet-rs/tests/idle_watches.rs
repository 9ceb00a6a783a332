//! Issue 28 guard: an idle kubelet does not read the directories it
//! watches over and over. Reading a directory makes the kernel report an
//! `IN_OPEN` on it to every inotify watch that asks for opens; a watch that
//! reacted to that would read the directory again, forever (seen on a real
//! node: the empty static pod directory listed 19 times a second).
//!
//! The real binary runs standalone on the real containerd with an empty
//! static pod directory; after start-up settles, the test counts for 20 s
//! how often each directory is opened (its own inotify watch on `IN_OPEN`
//! of the directory itself). Allowed: upstream's periodic re-read of the
//! static pod path (`fileCheckFrequency`, 20 s) and the plugin registry's
//! one-minute rescan, so at most two opens of each in the window.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{BIN, Kubelet};
use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};

const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const WINDOW: Duration = Duration::from_secs(20);
const MAX_READS: usize = 2;

/// Opens of each watched directory itself (not of entries in it) seen
/// until `window` has passed.
async fn count_opens(dirs: &[&Path], window: Duration) -> Vec<usize> {
    let inotify = Inotify::init().expect("inotify");
    let mut wds = Vec::new();
    for dir in dirs {
        wds.push(
            inotify
                .watches()
                .add(dir, WatchMask::OPEN)
                .expect("watch directory"),
        );
    }
    let mut counts = vec![0; dirs.len()];
    let mut events = inotify
        .into_event_stream(vec![0u8; 4096])
        .expect("event stream");
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.next()).await {
        let ev = ev.expect("inotify event");
        if ev.mask.contains(EventMask::OPEN | EventMask::ISDIR)
            && ev.name.is_none()
            && let Some(i) = wds.iter().position(|wd| *wd == ev.wd)
        {
            counts[i] += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kubelet_reads_its_static_pod_and_plugin_directories_only_periodically() {
    assert!(!BIN.is_empty());
    let _lock = tokio::task::spawn_blocking(common::machine_lock)
        .await
        .expect("machine lock");
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    let root = dir.path().join("root");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    let node = format!("idle-watch-{:x}", std::process::id());
    let args: Vec<String> = vec![
        format!("--container-runtime-endpoint={ENDPOINT}"),
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--root-dir={}", root.display()),
        format!("--hostname-override={node}"),
        "--healthz-port=0".into(),
        "--address=127.0.0.1".into(),
        format!("--port={}", common::free_port()),
        "--read-only-port=0".into(),
        "--eviction-hard=".into(),
        "--image-gc-high-threshold=100".into(),
        "--image-gc-low-threshold=99".into(),
    ];
    let mut kubelet = Kubelet::start(&args);
    assert!(
        kubelet.wait_for("Started kubelet", Duration::from_secs(60))
            && kubelet.wait_for("Plugin Watcher Start", Duration::from_secs(30)),
        "kubelet-rs starts:\n{}",
        kubelet.output()
    );
    // Start-up reads (the first snapshot, the first walk) are over.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let registry = root.join("plugins_registry");
    let counts = count_opens(&[&manifests, &registry], WINDOW).await;
    assert!(
        kubelet.exited_within(Duration::ZERO).is_none(),
        "kubelet-rs still runs:\n{}",
        kubelet.output()
    );
    let status = kubelet.terminate();
    assert!(status.success(), "{status}\n{}", kubelet.output());
    eprintln!(
        "in {WINDOW:?} idle: static pod directory opened {} times, plugin registry {} times",
        counts[0], counts[1]
    );
    assert!(
        counts[0] <= MAX_READS,
        "the empty static pod directory was read {} times in {WINDOW:?} (at most {MAX_READS}: the {}-second periodic re-read)",
        counts[0],
        20
    );
    assert!(
        counts[1] <= MAX_READS,
        "the plugin registry directory was read {} times in {WINDOW:?} (at most {MAX_READS})",
        counts[1]
    );
}
