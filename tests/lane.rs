//! Test lanes: the two apiserver profiles' passes of `hack/test.sh` run at
//! the same time, each against its own containerd, so that one kubelet
//! never sees (and, as upstream's housekeeping does with pods it does not
//! know, kills) another lane's pods.
//!
//! Lane 1 (the default) is the containerd `deploy/setup-runtime.sh` starts
//! on `/run/containerd/containerd.sock`. `KUBELET_RS_TEST_LANE=2` selects
//! the second one (`setup-runtime.sh --lane2`): its own socket, root and
//! state, a kubelet cgroup root of its own (pod cgroups and the QoS tree
//! under `/kubelet-rs-lane2`), its own pod log directory, and its own
//! machine lock. Both share the CNI bridge (host-local IPAM locks its
//! store) and the loopback registries.

use std::path::PathBuf;

/// One lane's host resources.
#[derive(Debug, Clone)]
pub struct Lane {
    /// 1 or 2.
    pub number: u8,
    /// CRI endpoint of the lane's containerd.
    pub endpoint: &'static str,
    /// The lane's machine lock (tests hold it while a kubelet runs).
    pub lock_path: &'static str,
    /// `--cgroup-root` for the lane's kubelets (`None`: upstream's default `/`).
    pub cgroup_root: Option<&'static str>,
    /// `podLogsDir` for the lane's kubelets.
    pub pod_logs_dir: &'static str,
}

const LANES: [Lane; 2] = [
    Lane {
        number: 1,
        endpoint: "unix:///run/containerd/containerd.sock",
        lock_path: "/tmp/kubelet-rs-integration.lock",
        cgroup_root: None,
        pod_logs_dir: "/var/log/pods",
    },
    Lane {
        number: 2,
        endpoint: "unix:///run/containerd-lane2/containerd.sock",
        lock_path: "/tmp/kubelet-rs-integration-lane2.lock",
        cgroup_root: Some("/kubelet-rs-lane2"),
        pod_logs_dir: "/var/log/pods-lane2",
    },
];

/// The lane this test process runs in (`KUBELET_RS_TEST_LANE`, default 1).
pub fn lane() -> &'static Lane {
    match std::env::var("KUBELET_RS_TEST_LANE").as_deref() {
        Ok("2") => &LANES[1],
        Ok("1") | Err(_) => &LANES[0],
        Ok(other) => panic!("KUBELET_RS_TEST_LANE={other}: use 1 or 2"),
    }
}

/// The CRI endpoint of this lane's containerd.
pub fn endpoint() -> &'static str {
    lane().endpoint
}

/// Where this lane's kubelets write container logs (`podLogsDir`).
pub fn pod_logs_dir() -> PathBuf {
    PathBuf::from(lane().pod_logs_dir)
}

/// The cgroupfs directory holding this lane's `kubepods` tree under the
/// controller mounted at `controller` (e.g. `/sys/fs/cgroup/memory`).
pub fn kubepods_under(controller: &std::path::Path) -> PathBuf {
    let root = lane().cgroup_root.unwrap_or("/").trim_start_matches('/');
    controller.join(root).join("kubepods")
}

/// The memory cgroup directory of a pod of `tier` ("" for Guaranteed,
/// `burstable`, `besteffort`) on this host: the v1 memory hierarchy or the
/// v2 tree, named as the cgroup driver the tests' kubelets use
/// (`KUBELET_RS_TEST_CGROUP_DRIVER`, the VM lane's `systemd`; else cgroupfs
/// below this lane's cgroup root).
pub fn pod_memory_cgroup(tier: &str, uid: &str) -> PathBuf {
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
    let base = if v1.is_dir() {
        v1
    } else {
        std::path::Path::new("/sys/fs/cgroup")
    };
    if std::env::var("KUBELET_RS_TEST_CGROUP_DRIVER").as_deref() == Ok("systemd") {
        let mut dir = base.join("kubepods.slice");
        let mut prefix = "kubepods".to_string();
        if !tier.is_empty() {
            prefix = format!("kubepods-{tier}");
            dir = dir.join(format!("{prefix}.slice"));
        }
        return dir.join(format!("{prefix}-pod{}.slice", uid.replace('-', "_")));
    }
    let kubepods = kubepods_under(base);
    let tier_dir = if tier.is_empty() {
        kubepods
    } else {
        kubepods.join(tier)
    };
    tier_dir.join(format!("pod{uid}"))
}

/// A loopback port nothing listens on right now, from this lane's own range
/// (lane 1: 20000-24999, lane 2: 25000-29999), below the kernel's ephemeral
/// range (32768 and up) that every `:0` bind draws from: a port picked here
/// and bound a moment later by a kubelet or test server is never taken in
/// between by the other lane or an ephemeral bind. Within a lane the
/// machine lock keeps kubelets one at a time.
pub fn free_port() -> u16 {
    let base = 20_000 + 5_000 * u16::from(lane().number - 1);
    for _ in 0..1_000 {
        let port = base + rand::random::<u16>() % 5_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {base}..{}", base + 5_000)
}

/// Takes this lane's machine lock (blocking: call from `spawn_blocking`).
pub fn lock() -> std::fs::File {
    let f = std::fs::File::create(lane().lock_path).expect("lock file");
    f.lock().expect("lock");
    f
}

/// Takes a lock on a host resource both lanes' tests use (`name`: for
/// example `tmp` for specs writing the host's `/tmp`, `memory` for a test
/// that puts the node under memory pressure), held while the returned file
/// lives. Taken before the lane's own lock, so lanes never wait on each
/// other in the opposite order.
pub async fn host_lock(name: &str) -> std::fs::File {
    let path = format!("/tmp/kubelet-rs-host-{name}.lock");
    tokio::task::spawn_blocking(move || {
        let f = std::fs::File::create(&path).expect("host lock file");
        f.lock().expect("host lock");
        f
    })
    .await
    .expect("host lock task")
}

/// Creates this lane's cgroup root (if it has one) in every hierarchy, as an
/// operator creates a `--cgroup-root` before pointing a kubelet at it:
/// under each mounted v1 controller, or in the v2 tree with the controllers
/// delegated to it.
pub fn ensure_cgroup_root() {
    let Some(root) = lane().cgroup_root else {
        return;
    };
    let base = std::path::Path::new("/sys/fs/cgroup");
    let root = root.trim_start_matches('/');
    if base.join("cgroup.controllers").exists() {
        let dir = base.join(root);
        std::fs::create_dir_all(&dir).expect("lane cgroup root");
        let controllers =
            std::fs::read_to_string(dir.join("cgroup.controllers")).expect("cgroup.controllers");
        for c in controllers.split_whitespace() {
            std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"))
                .unwrap_or_else(|e| panic!("delegating {c} to {}: {e}", dir.display()));
        }
        return;
    }
    for e in std::fs::read_dir(base).expect("/sys/fs/cgroup").flatten() {
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && e.path().join("cgroup.procs").exists() {
            let dir = e.path().join(root);
            std::fs::create_dir_all(&dir).expect("lane cgroup root");
            // A v1 cpuset starts empty: it takes its parent's CPUs and nodes.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let own = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
                if dir.join(f).exists() && own.trim().is_empty() {
                    let parent = std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
                    let _ = std::fs::write(dir.join(f), parent.trim());
                }
            }
        }
    }
}
