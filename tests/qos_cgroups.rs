//! QoS cgroups on real containerd (upstream `pkg/kubelet/cm`, `qos/policy.go`,
//! and the checks of `test/e2e_node/pods_container_manager_test.go` "Kubelet
//! Cgroup Manager ... QOS containers ... Pod containers should create the
//! pod cgroup with the pod's resources"): one pod per QoS class under a
//! private `cgroupRoot`, then the values the kernel holds for the QoS tiers,
//! the pod cgroups and the containers, the containers' `oom_score_adj`, and
//! `kubepods`' node allocatable limit.
//!
//! containerd here runs with `restrict_oom_score_adj = true`
//! (deploy/containerd/kubelet-rs.toml): it never gives a container an
//! oom_score_adj below its own. containerd's own value on these machines is
//! 0, so the Guaranteed container asks for -997 and gets 0; Burstable and
//! BestEffort values (above 0) are kept. The test reads containerd's value
//! and expects `max(asked, containerd's)`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kubelet_rs_integration::{BUSYBOX, Node, is_running};

const CONTROLLERS: &[&str] = &["cpu", "cpuacct", "cpuset", "memory", "pids", "systemd"];

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn read_i64(p: &Path) -> i64 {
    read(p)
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn cg(ctl: &str, rel: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup")
        .join(ctl)
        .join(rel.trim_start_matches('/'))
}

/// containerd's own oom_score_adj (the floor `restrict_oom_score_adj` keeps).
fn containerd_oom_score_adj() -> i64 {
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let lane2 = std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("lane2.toml"));
        if !lane2
            && std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "containerd")
        {
            return read_i64(&e.path().join("oom_score_adj"));
        }
    }
    panic!("containerd is not running");
}

fn mem_total() -> i64 {
    let info = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kb: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    kb * 1024
}

/// Removes a cgroup tree, deepest first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn manifest(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"sleep 3600\"]\n{resources}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_get_qos_cgroups_limits_and_oom_scores() {
    // A private cgroupRoot keeps this kubelet's kubepods away from others'.
    let root = format!("/kubelet-rs-qos-{:08x}", rand::random::<u32>());
    for ctl in CONTROLLERS {
        std::fs::create_dir_all(cg(ctl, &root)).expect("cgroup root");
    }
    let r = root.clone();
    let node = Node::start(move |f| {
        f.cgroup_root = Some(r);
        f.kube_reserved = Some("memory=256Mi".into());
        f.system_reserved = Some("memory=128Mi".into());
        f.extra.push("pod-max-pids", "100").expect("--pod-max-pids");
    })
    .await;
    let kp = format!("{root}/kubepods");

    // Node allocatable: capacity - kube-reserved - system-reserved (upstream
    // does not subtract evictionHard from the cgroup), in whole pages.
    let want = (mem_total() - (384 << 20)) / 4096 * 4096;
    assert_eq!(
        read_i64(&cg("memory", &kp).join("memory.limit_in_bytes")),
        want
    );
    assert_eq!(
        read(&cg("cpu", &format!("{kp}/besteffort")).join("cpu.shares")),
        "2"
    );

    node.write_manifest(
        "g.yaml",
        &manifest(
            "guaranteed",
            "    resources:\n      limits: {cpu: 200m, memory: 64Mi}\n",
        ),
    );
    node.write_manifest(
        "b.yaml",
        &manifest(
            "burstable",
            "    resources:\n      requests: {cpu: 100m, memory: 32Mi}\n      limits: {cpu: 300m, memory: 128Mi}\n",
        ),
    );
    node.write_manifest("be.yaml", &manifest("besteffort", ""));
    for n in ["guaranteed", "burstable", "besteffort"] {
        node.wait_status(n, Duration::from_secs(60), "running", |s| {
            is_running(s, "c")
        })
        .await
        .unwrap_or_else(|e| panic!("{n}: {e}"));
    }
    let floor = containerd_oom_score_adj();
    let mem = mem_total();
    let burstable_adj = (1000 - 1000 * (32 << 20) / mem).clamp(3, 999);
    let cases = [
        // (pod, tier, shares, quota, memory, oom_score_adj asked)
        ("guaranteed", "", 204, 20_000, 64 << 20, -997),
        (
            "burstable",
            "burstable/",
            102,
            30_000,
            128 << 20,
            burstable_adj,
        ),
        (
            "besteffort",
            "besteffort/",
            2,
            -1,
            i64::MAX / 4096 * 4096,
            1000,
        ),
    ];
    for (name, tier, shares, quota, memory, adj) in cases {
        let uid = node.uid_of(name).expect("uid");
        let pod = format!("{kp}/{tier}pod{uid}");
        let cpu = cg("cpu", &pod);
        assert_eq!(
            read_i64(&cpu.join("cpu.shares")),
            shares,
            "{name} pod cpu.shares"
        );
        assert_eq!(
            read_i64(&cpu.join("cpu.cfs_quota_us")),
            quota,
            "{name} pod quota"
        );
        assert_eq!(
            read_i64(&cpu.join("cpu.cfs_period_us")),
            100_000,
            "{name} pod period"
        );
        assert_eq!(
            read_i64(&cg("memory", &pod).join("memory.limit_in_bytes")),
            memory,
            "{name} pod memory"
        );
        assert_eq!(
            read(&cg("pids", &pod).join("pids.max")),
            "100",
            "{name} podPidsLimit"
        );

        // The container's cgroup (containerd's cgroupfs layout: <parent>/<id>).
        let status = node.status(name).expect("status");
        let id = kubelet_rs_integration::container_id(&status, "c").expect("container id");
        let id = id.rsplit("://").next().expect("id").to_string();
        let ctr = format!("{pod}/{id}");
        assert_eq!(
            read_i64(&cg("cpu", &ctr).join("cpu.shares")),
            shares,
            "{name} container shares"
        );
        assert_eq!(
            read_i64(&cg("cpu", &ctr).join("cpu.cfs_quota_us")),
            quota,
            "{name} container quota"
        );
        assert_eq!(
            read_i64(&cg("memory", &ctr).join("memory.limit_in_bytes")),
            memory,
            "{name} container memory"
        );
        let procs = read(&cg("memory", &ctr).join("cgroup.procs"));
        let pid = procs
            .lines()
            .next()
            .unwrap_or_else(|| panic!("{name}: no process"));
        let got = read_i64(&Path::new("/proc").join(pid).join("oom_score_adj"));
        assert_eq!(
            got,
            adj.max(floor),
            "{name} oom_score_adj (asked {adj}, containerd's {floor})"
        );
    }
    // Burstable shares are the sum of Burstable requests (100m), set before the pod's cgroup.
    assert_eq!(
        read(&cg("cpu", &format!("{kp}/burstable")).join("cpu.shares")),
        "102"
    );

    // A pod that is gone takes its cgroup with it.
    let be_uid = node.uid_of("besteffort").expect("uid");
    node.remove_manifest("be.yaml");
    let gone = cg("cpu", &format!("{kp}/besteffort/pod{be_uid}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while gone.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod cgroup not removed: {}",
            gone.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    node.cleanup().await;
    for ctl in CONTROLLERS {
        remove_tree(&cg(ctl, &root));
    }
}
