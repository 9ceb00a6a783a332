//! cgroup v2 under both cgroup drivers, in the VM lane only (issue 29;
//! `hack/vm/run.sh <suite> cgroups`; the host runs cgroup v1, and
//! `hack/test.sh` leaves every `vm_` test to that lane). Lane 1 is the
//! guest's containerd with `SystemdCgroup = true` and the kubelet's systemd
//! driver; lane 2 (`KUBELET_RS_TEST_LANE=2`) a second containerd with the
//! cgroupfs driver. Upstream's `test/e2e_node/pods_container_manager_test.go`
//! and `node_container_manager_test.go` read the same files.
//!
//! One Guaranteed, one Burstable and one BestEffort static pod, then every
//! value of the QoS tiers, the pod cgroups and the containers, each written
//! out from upstream's formulas (cited where used) rather than from the
//! kubelet's code: node allocatable on `kubepods`, `cpu.weight`, `cpu.max`,
//! `memory.max`, `pids.max`, and `cgroup.subtree_control`. With the systemd
//! driver also what systemd holds: the slices are transient units the
//! kubelet started, with the same limits as properties. Then a kubelet
//! restart adopts the running pods untouched, and a removed pod takes its
//! cgroup (its slice) with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kubelet_rs_integration::{BUSYBOX, Node, is_running, lane};

/// `MinShares` (pkg/kubelet/cm/helpers_linux.go).
const MIN_SHARES: i64 = 2;
/// The CFS period the kubelet uses (`QuotaPeriod`, 100ms in µs).
const PERIOD: i64 = 100_000;

/// `MilliCPUToShares` (pkg/kubelet/cm/helpers_linux.go).
fn milli_cpu_to_shares(milli: i64) -> i64 {
    (milli * 1024 / 1000).max(MIN_SHARES)
}

/// `MilliCPUToQuota` (helpers_linux.go): at least `MinQuotaPeriod` (1000µs).
fn milli_cpu_to_quota(milli: i64) -> i64 {
    (milli * PERIOD / 1000).max(1000)
}

/// `getCPUWeight` (pkg/kubelet/cm/cgroup_manager_linux.go): shares [2, 262144]
/// to cgroup v2's weight [1, 10000].
fn cpu_weight(shares: i64) -> i64 {
    if shares >= 262_144 {
        return 10_000;
    }
    1 + ((shares - 2) * 9999) / 262_142
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn mem_total() -> i64 {
    let info = read(Path::new("/proc/meminfo"));
    let kb: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    kb * 1024
}

/// cAdvisor's `NumCores`: the processors `/proc/cpuinfo` lists.
fn num_cores() -> i64 {
    let n = read(Path::new("/proc/cpuinfo"))
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    i64::try_from(n).expect("cores")
}

/// A property of a systemd unit (`systemctl show -p`).
fn unit_property(unit: &str, property: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", "-p", property, "--value", unit])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn manifest(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"sleep 3600\"]\n{resources}"
    )
}

/// Where the driver puts each cgroup below `/sys/fs/cgroup`.
struct Layout {
    systemd: bool,
    /// `kubepods` (cgroupfs below the lane's cgroup root) or `kubepods.slice`.
    kubepods: PathBuf,
}

impl Layout {
    fn tier(&self, tier: &str) -> PathBuf {
        match (self.systemd, tier) {
            (_, "") => self.kubepods.clone(),
            (true, t) => self.kubepods.join(format!("kubepods-{t}.slice")),
            (false, t) => self.kubepods.join(t),
        }
    }

    /// The pod's cgroup and, for systemd, its slice unit.
    fn pod(&self, tier: &str, uid: &str) -> (PathBuf, String) {
        if self.systemd {
            let prefix = if tier.is_empty() {
                "kubepods".to_string()
            } else {
                format!("kubepods-{tier}")
            };
            let unit = format!("{prefix}-pod{}.slice", uid.replace('-', "_"));
            (self.tier(tier).join(&unit), unit)
        } else {
            (self.tier(tier).join(format!("pod{uid}")), String::new())
        }
    }

    /// The container's cgroup below its pod's (containerd's naming per driver).
    fn container(&self, pod: &Path, id: &str) -> PathBuf {
        if self.systemd {
            pod.join(format!("cri-containerd-{id}.scope"))
        } else {
            pod.join(id)
        }
    }
}

/// (name, QoS tier, shares, cpu.max, memory.max) as upstream computes them
/// for the three pods (`ResourceConfigForPod`, pkg/kubelet/cm/helpers_linux.go:
/// shares from the requests, the quota from the limits when every container
/// declares one, the memory limit likewise; BestEffort gets `MinShares` and
/// nothing else).
fn expected_pods() -> Vec<(&'static str, &'static str, i64, String, String)> {
    vec![
        (
            "guaranteed",
            "",
            milli_cpu_to_shares(200),
            format!("{} {PERIOD}", milli_cpu_to_quota(200)),
            (64i64 << 20).to_string(),
        ),
        (
            "burstable",
            "burstable",
            milli_cpu_to_shares(100),
            format!("{} {PERIOD}", milli_cpu_to_quota(300)),
            (128i64 << 20).to_string(),
        ),
        (
            "besteffort",
            "besteffort",
            MIN_SHARES,
            format!("max {PERIOD}"),
            "max".into(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn vm_v2_qos_and_pod_cgroups_match_upstreams_formulas() {
    let base = Path::new("/sys/fs/cgroup");
    assert!(
        base.join("cgroup.controllers").is_file(),
        "this test needs a cgroup v2 host: run it with hack/vm/run.sh <trixie|sid> cgroups"
    );
    let lane = lane::lane();
    let systemd = lane.number == 1;
    let driver = if systemd { "systemd" } else { "cgroupfs" };
    let mut node = Node::start(move |f| {
        f.cgroup_driver = Some(driver.into());
        f.kube_reserved = Some("memory=256Mi".into());
        f.system_reserved = Some("memory=128Mi".into());
        f.extra.push("pod-max-pids", "100").expect("--pod-max-pids");
    })
    .await;
    let layout = Layout {
        systemd,
        kubepods: if systemd {
            base.join("kubepods.slice")
        } else {
            lane::kubepods_under(base)
        },
    };

    // Node allocatable on kubepods (getNodeAllocatableAbsolute in
    // node_container_manager_linux.go: capacity - kube-reserved -
    // system-reserved; eviction thresholds are not subtracted for the
    // cgroup). The kernel keeps memory.max in whole pages.
    let allocatable = (mem_total() - (384 << 20)) / 4096 * 4096;
    let kp = &layout.kubepods;
    assert_eq!(read(&kp.join("memory.max")), allocatable.to_string());
    let node_shares = milli_cpu_to_shares(num_cores() * 1000);
    assert_eq!(
        read(&kp.join("cpu.weight")),
        cpu_weight(node_shares).to_string()
    );
    // Controllers delegated below kubepods (runc's fs2 CreateCgroupPath, or
    // systemd's accounting properties).
    let delegated = read(&kp.join("cgroup.subtree_control"));
    for c in ["cpu", "memory", "pids"] {
        assert!(
            delegated.split_whitespace().any(|d| d == c),
            "{c} not delegated below kubepods: {delegated}"
        );
    }
    // The BestEffort tier has MinShares (qos_container_manager_linux.go).
    assert_eq!(
        read(&layout.tier("besteffort").join("cpu.weight")),
        cpu_weight(MIN_SHARES).to_string()
    );
    if systemd {
        assert_eq!(unit_property("kubepods.slice", "Transient"), "yes");
        assert_eq!(
            unit_property("kubepods.slice", "MemoryMax"),
            allocatable.to_string()
        );
    }

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
    // A limit that is not whole percent of a CPU: systemd keeps the quota
    // in whole percent, so with its driver the file gets the rounded-up
    // quota too (opencontainers/cgroups `addCPUQuota`), with cgroupfs as is.
    node.write_manifest(
        "r.yaml",
        &manifest(
            "rounded",
            "    resources:\n      requests: {cpu: 100m}\n      limits: {cpu: 155m}\n",
        ),
    );
    for n in ["guaranteed", "burstable", "besteffort", "rounded"] {
        node.wait_status(n, Duration::from_secs(180), "running", |s| {
            is_running(s, "c")
        })
        .await
        .unwrap_or_else(|e| panic!("{n}: {e}"));
    }
    let mut ids = vec![];
    for (name, tier, shares, cpu_max, memory_max) in expected_pods() {
        let uid = node.uid_of(name).expect("uid");
        let (pod, unit) = layout.pod(tier, &uid);
        assert_eq!(
            read(&pod.join("cpu.weight")),
            cpu_weight(shares).to_string(),
            "{name} pod cpu.weight"
        );
        assert_eq!(read(&pod.join("cpu.max")), cpu_max, "{name} pod cpu.max");
        assert_eq!(
            read(&pod.join("memory.max")),
            memory_max,
            "{name} pod memory.max"
        );
        assert_eq!(read(&pod.join("pids.max")), "100", "{name} podPidsLimit");
        if systemd {
            assert_eq!(unit_property(&unit, "Transient"), "yes", "{unit}");
            let memory = if memory_max == "max" {
                "infinity".to_string()
            } else {
                memory_max.clone()
            };
            assert_eq!(unit_property(&unit, "MemoryMax"), memory, "{unit}");
            assert_eq!(
                unit_property(&unit, "CPUWeight"),
                cpu_weight(shares).to_string(),
                "{unit}"
            );
            assert_eq!(unit_property(&unit, "TasksMax"), "100", "{unit}");
        }
        // The container's own cgroup, written by the runtime from the CRI
        // resources the kubelet sends (generateLinuxContainerResources).
        let status = node.status(name).expect("status");
        let id = kubelet_rs_integration::container_id(&status, "c").expect("container id");
        let id = id.rsplit("://").next().expect("id").to_string();
        let ctr = layout.container(&pod, &id);
        assert_eq!(
            read(&ctr.join("memory.max")),
            memory_max,
            "{name} container memory.max"
        );
        assert_eq!(
            read(&ctr.join("cpu.max")),
            cpu_max,
            "{name} container cpu.max"
        );
        ids.push((name, id, pod));
    }
    let uid = node.uid_of("rounded").expect("uid");
    let (pod, unit) = layout.pod("burstable", &uid);
    let quota = milli_cpu_to_quota(155);
    let quota = if systemd {
        (quota * 1_000_000 / PERIOD + 9_999) / 10_000 * 10_000 * PERIOD / 1_000_000
    } else {
        quota
    };
    assert_eq!(read(&pod.join("cpu.max")), format!("{quota} {PERIOD}"));
    if systemd {
        assert_eq!(unit_property(&unit, "CPUQuotaPerSecUSec"), "160ms");
    }
    // The Burstable tier's weight is its pods' requests (100m + 100m), set
    // before the pod's cgroup (UpdateCgroups in qos_container_manager_linux.go).
    assert_eq!(
        read(&layout.tier("burstable").join("cpu.weight")),
        cpu_weight(milli_cpu_to_shares(200)).to_string()
    );

    // A restart adopts what runs: same containers, same cgroups and values.
    node.restart().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, id, pod) in &ids {
        node.wait_status(name, Duration::from_secs(120), "running again", |s| {
            is_running(s, "c")
        })
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let status = node.status(name).expect("status");
        let now = kubelet_rs_integration::container_id(&status, "c").expect("container id");
        assert!(
            now.ends_with(id.as_str()),
            "{name} restarted: {now} vs {id}"
        );
        assert!(
            layout.container(pod, id).is_dir(),
            "{name}: its cgroup moved"
        );
    }
    assert_eq!(read(&kp.join("memory.max")), allocatable.to_string());

    // A pod that is gone takes its cgroup (and its slice) with it.
    let be_uid = node.uid_of("besteffort").expect("uid");
    let (gone, unit) = layout.pod("besteffort", &be_uid);
    node.remove_manifest("be.yaml");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while gone.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod cgroup not removed: {}",
            gone.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if systemd {
        // Stopped (systemd unloads a stopped transient unit when nothing
        // references it any more, on its own schedule).
        let state = unit_property(&unit, "ActiveState");
        assert!(
            state == "inactive" || unit_property(&unit, "LoadState") == "not-found",
            "{unit} is {state}"
        );
    }
    node.cleanup().await;
}
