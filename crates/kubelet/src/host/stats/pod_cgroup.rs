//! Pod CPU and memory read from the pod cgroup (`kubepods[/<qos>]/pod<uid>`),
//! as upstream's cAdvisor-based stats provider reads them
//! (`cadvisorStatsProvider`, and `listPodStatsPartiallyFromCRI`, which takes
//! pod CPU and memory from cAdvisor's view of the pod cgroup). Used only for
//! a pod the runtime gave no stats for, neither its sandbox's nor any of its
//! containers'. Everything here blocks: call it from `spawn_blocking`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::node::parse_flat_keyed;

/// The pod cgroups on this node (upstream `PodContainerManager`
/// `GetAllPodsFromCgroups`).
pub trait PodCgroupDirs: Send + Sync {
    /// Pod UID → controller → the pod cgroup's directory. Blocking IO.
    fn pod_cgroup_dirs(&self) -> BTreeMap<String, BTreeMap<String, PathBuf>>;
}

impl PodCgroupDirs for kubelet_cm::ContainerManager {
    fn pod_cgroup_dirs(&self) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
        let cgroups = self.cgroup_manager();
        self.pod_cgroups()
            .all_pods_from_cgroups()
            .into_iter()
            .map(|(uid, name)| (uid, cgroups.paths(&name)))
            .collect()
    }
}

/// CPU and memory of one pod cgroup.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PodUsage {
    /// Cumulative CPU time, core-nanoseconds.
    pub cpu_core_ns: Option<u64>,
    /// Memory in use, including page cache.
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages.
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory.
    pub rss_bytes: Option<u64>,
    /// Minor page faults.
    pub page_faults: Option<u64>,
    /// Major page faults.
    pub major_page_faults: Option<u64>,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Reads the pod cgroup whose directory per controller is `dirs` (cgroup v1
/// or v2); `None` when neither CPU nor memory could be read.
pub(crate) fn pod_usage(dirs: &BTreeMap<String, PathBuf>) -> Option<PodUsage> {
    let cpu_dir = dirs.get("cpu").or_else(|| dirs.get("cpuacct"));
    let mem_dir = dirs.get("memory");
    let v2 = cpu_dir
        .or(mem_dir)
        .is_some_and(|d| d.join("cgroup.controllers").exists());
    let (cpu_core_ns, usage_bytes, stat_text) = if v2 {
        let cpu = cpu_dir
            .and_then(|d| std::fs::read_to_string(d.join("cpu.stat")).ok())
            .and_then(|t| parse_flat_keyed(&t).get("usage_usec").copied())
            .map(|usec| usec.saturating_mul(1000));
        let usage = mem_dir.and_then(|d| read_u64(&d.join("memory.current")));
        let stat = mem_dir.and_then(|d| std::fs::read_to_string(d.join("memory.stat")).ok());
        (cpu, usage, stat)
    } else {
        let cpu = dirs
            .get("cpuacct")
            .and_then(|d| read_u64(&d.join("cpuacct.usage")));
        let usage = mem_dir.and_then(|d| read_u64(&d.join("memory.usage_in_bytes")));
        let stat = mem_dir.and_then(|d| std::fs::read_to_string(d.join("memory.stat")).ok());
        (cpu, usage, stat)
    };
    if cpu_core_ns.is_none() && usage_bytes.is_none() {
        return None;
    }
    let stat_text = stat_text.unwrap_or_default();
    let stat = parse_flat_keyed(&stat_text);
    let key = |v2_key: &str, v1_key: &str| stat.get(if v2 { v2_key } else { v1_key }).copied();
    let inactive = key("inactive_file", "total_inactive_file").unwrap_or(0);
    Some(PodUsage {
        cpu_core_ns,
        usage_bytes,
        working_set_bytes: usage_bytes.map(|u| u.saturating_sub(inactive)),
        rss_bytes: key("anon", "total_rss"),
        page_faults: key("pgfault", "total_pgfault"),
        major_page_faults: key("pgmajfault", "total_pgmajfault"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).expect("test dir");
        std::fs::write(dir.join(name), text).expect("test file");
    }

    #[test]
    fn reads_a_v2_pod_cgroup() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pod = tmp.path().join("kubepods/burstable/podu1");
        write(&pod, "cgroup.controllers", "cpu memory\n");
        write(&pod, "cpu.stat", "usage_usec 2500\nuser_usec 2000\n");
        write(&pod, "memory.current", "10000\n");
        write(
            &pod,
            "memory.stat",
            "anon 6000\ninactive_file 3000\npgfault 7\n",
        );
        let dirs = BTreeMap::from([
            ("cpu".to_string(), pod.clone()),
            ("memory".to_string(), pod),
        ]);
        let u = pod_usage(&dirs).expect("usage");
        assert_eq!(u.cpu_core_ns, Some(2_500_000));
        assert_eq!(u.usage_bytes, Some(10000));
        assert_eq!(u.working_set_bytes, Some(7000));
        assert_eq!(u.rss_bytes, Some(6000));
        assert_eq!(u.page_faults, Some(7));
    }

    #[test]
    fn reads_a_v1_pod_cgroup() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cpu = tmp.path().join("cpuacct/kubepods/podu1");
        let mem = tmp.path().join("memory/kubepods/podu1");
        write(&cpu, "cpuacct.usage", "123456\n");
        write(&mem, "memory.usage_in_bytes", "9000\n");
        write(
            &mem,
            "memory.stat",
            "total_inactive_file 1000\ntotal_rss 5000\n",
        );
        let dirs = BTreeMap::from([("cpuacct".to_string(), cpu), ("memory".to_string(), mem)]);
        let u = pod_usage(&dirs).expect("usage");
        assert_eq!(u.cpu_core_ns, Some(123456));
        assert_eq!(u.working_set_bytes, Some(8000));
        assert_eq!(u.rss_bytes, Some(5000));
    }

    #[test]
    fn a_missing_pod_cgroup_reads_nothing() {
        let dirs = BTreeMap::from([("memory".to_string(), PathBuf::from("/nonexistent/podx"))]);
        assert_eq!(pod_usage(&dirs), None);
    }
}
