//! Host-side stats (what upstream reads through cAdvisor for the root
//! container): node CPU and memory from the root cgroup (v1 or v2), swap and
//! capacity from `/proc/meminfo`, boot time from `/proc/stat`, interfaces from
//! `/proc/net/dev`, filesystems from `statvfs`, and a container's log usage
//! by walking its log directory. Everything here blocks: call it from
//! `spawn_blocking`.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use kubelet_server::stats::StatsError;
use kubelet_server::stats::summary::{FsStats, InterfaceStats};

/// Node CPU and memory, as read from the root cgroup.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct NodeUsage {
    /// Cumulative CPU time, core-nanoseconds.
    pub cpu_core_ns: u64,
    /// Memory in use, including page cache.
    pub usage_bytes: u64,
    /// Usage minus inactive file pages.
    pub working_set_bytes: u64,
    /// Anonymous memory.
    pub rss_bytes: Option<u64>,
    /// Minor page faults.
    pub page_faults: Option<u64>,
    /// Major page faults.
    pub major_page_faults: Option<u64>,
    /// Memory capacity (`MemTotal`).
    pub capacity_bytes: u64,
    /// Swap in use and left, when the node has swap.
    pub swap: Option<(u64, u64)>,
}

fn host_err(what: &Path) -> impl FnOnce(io::Error) -> StatsError + '_ {
    move |source| StatsError::Host {
        what: what.display().to_string(),
        source,
    }
}

fn read(path: &Path) -> Result<String, StatsError> {
    std::fs::read_to_string(path).map_err(host_err(path))
}

fn read_u64(path: &Path) -> Result<u64, StatsError> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| StatsError::Host {
        what: path.display().to_string(),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a number: {text:?}"),
        ),
    })
}

/// `key value` lines (cgroup `memory.stat`, `cpu.stat`).
pub(crate) fn parse_flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// `/proc/meminfo` in bytes.
pub(crate) fn parse_meminfo(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let mut parts = v.split_whitespace();
            let n: u64 = parts.next()?.parse().ok()?;
            let scale = if parts.next() == Some("kB") { 1024 } else { 1 };
            Some((k, n * scale))
        })
        .collect()
}

/// Reads node CPU and memory under `cgroup_root` (`/sys/fs/cgroup`) and
/// `proc_root` (`/proc`).
pub(crate) fn node_usage(cgroup_root: &Path, proc_root: &Path) -> Result<NodeUsage, StatsError> {
    let meminfo_text = read(&proc_root.join("meminfo"))?;
    let meminfo = parse_meminfo(&meminfo_text);
    let capacity = meminfo.get("MemTotal").copied().unwrap_or(0);
    let swap = match (meminfo.get("SwapTotal"), meminfo.get("SwapFree")) {
        (Some(&total), Some(&free)) if total > 0 => Some((total.saturating_sub(free), free)),
        _ => None,
    };
    let mut usage = if cgroup_root.join("cgroup.controllers").exists() {
        // cgroup v2: the root has cpu.stat and memory.stat but no memory.current.
        let cpu_path = cgroup_root.join("cpu.stat");
        let cpu_text = read(&cpu_path)?;
        let cpu = parse_flat_keyed(&cpu_text);
        let usage_usec = cpu.get("usage_usec").copied().unwrap_or(0);
        let stat_text =
            std::fs::read_to_string(cgroup_root.join("memory.stat")).unwrap_or_default();
        let stat = parse_flat_keyed(&stat_text);
        let usage_bytes = match read_u64(&cgroup_root.join("memory.current")) {
            Ok(v) => v,
            Err(_) => capacity.saturating_sub(meminfo.get("MemFree").copied().unwrap_or(0)),
        };
        let inactive = stat
            .get("inactive_file")
            .or_else(|| meminfo.get("Inactive(file)"))
            .copied()
            .unwrap_or(0);
        NodeUsage {
            cpu_core_ns: usage_usec.saturating_mul(1000),
            usage_bytes,
            working_set_bytes: usage_bytes.saturating_sub(inactive),
            rss_bytes: stat.get("anon").copied(),
            page_faults: stat.get("pgfault").copied(),
            major_page_faults: stat.get("pgmajfault").copied(),
            ..Default::default()
        }
    } else {
        let cpu_core_ns = read_u64(&cgroup_root.join("cpuacct/cpuacct.usage"))?;
        let usage_bytes = read_u64(&cgroup_root.join("memory/memory.usage_in_bytes"))?;
        let stat_text = read(&cgroup_root.join("memory/memory.stat"))?;
        let stat = parse_flat_keyed(&stat_text);
        let inactive = stat.get("total_inactive_file").copied().unwrap_or(0);
        NodeUsage {
            cpu_core_ns,
            usage_bytes,
            working_set_bytes: usage_bytes.saturating_sub(inactive),
            rss_bytes: stat.get("total_rss").copied(),
            page_faults: stat.get("total_pgfault").copied(),
            major_page_faults: stat.get("total_pgmajfault").copied(),
            ..Default::default()
        }
    };
    usage.capacity_bytes = capacity;
    usage.swap = swap;
    Ok(usage)
}

/// Boot time in seconds since the epoch (`btime` of `/proc/stat`).
pub(crate) fn boot_time(proc_root: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(proc_root.join("stat")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `kernel.pid_max` and the number of processes (`/proc/loadavg`).
pub(crate) fn rlimit(proc_root: &Path) -> (Option<i64>, Option<i64>) {
    let max = std::fs::read_to_string(proc_root.join("sys/kernel/pid_max"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let cur = std::fs::read_to_string(proc_root.join("loadavg"))
        .ok()
        .and_then(|t| {
            let field = t.split_whitespace().nth(3)?;
            field.split_once('/')?.1.parse().ok()
        });
    (max, cur)
}

/// Interfaces of `/proc/net/dev`, loopback excluded.
pub(crate) fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            if f.len() < 11 {
                return None;
            }
            Some(InterfaceStats {
                name: name.to_string(),
                rx_bytes: Some(f[0]),
                rx_errors: Some(f[2]),
                tx_bytes: Some(f[8]),
                tx_errors: Some(f[10]),
            })
        })
        .collect()
}

/// The node's interfaces.
pub(crate) fn net_dev(proc_root: &Path) -> Vec<InterfaceStats> {
    std::fs::read_to_string(proc_root.join("net/dev"))
        .map(|t| parse_net_dev(&t))
        .unwrap_or_default()
}

/// Capacity, availability and inodes of the filesystem holding `path`.
pub(crate) fn statvfs(path: &Path) -> Result<FsStats, StatsError> {
    let s = nix::sys::statvfs::statvfs(path).map_err(|e| StatsError::Host {
        what: path.display().to_string(),
        source: io::Error::from(e),
    })?;
    let frsize = s.fragment_size() as u64;
    let blocks = s.blocks() as u64;
    let files = s.files() as u64;
    let ffree = s.files_free() as u64;
    Ok(FsStats {
        available_bytes: Some(s.blocks_available() as u64 * frsize),
        capacity_bytes: Some(blocks * frsize),
        used_bytes: Some(blocks.saturating_sub(s.blocks_free() as u64) * frsize),
        inodes_free: Some(ffree),
        inodes: Some(files),
        inodes_used: Some(files.saturating_sub(ffree)),
        ..Default::default()
    })
}

/// Bytes (as allocated on disk) and inodes under `dir`; zero when it does
/// not exist.
pub(crate) fn dir_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        bytes += meta.blocks() * 512;
        inodes += 1;
        if !meta.is_dir() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            stack.push(e.path());
        }
    }
    (bytes, inodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cgroup_v1_root() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(cg.join("cpuacct")).unwrap();
        std::fs::create_dir_all(cg.join("memory")).unwrap();
        std::fs::create_dir_all(&proc).unwrap();
        std::fs::write(cg.join("cpuacct/cpuacct.usage"), "123456789\n").unwrap();
        std::fs::write(cg.join("memory/memory.usage_in_bytes"), "10000\n").unwrap();
        std::fs::write(
            cg.join("memory/memory.stat"),
            "inactive_file 1\ntotal_rss 700\ntotal_inactive_file 3000\ntotal_pgfault 5\ntotal_pgmajfault 2\n",
        )
        .unwrap();
        std::fs::write(
            proc.join("meminfo"),
            "MemTotal:       16 kB\nMemFree:  1 kB\nSwapTotal: 4 kB\nSwapFree: 1 kB\n",
        )
        .unwrap();
        let u = node_usage(&cg, &proc).unwrap();
        assert_eq!(u.cpu_core_ns, 123_456_789);
        assert_eq!(u.usage_bytes, 10_000);
        assert_eq!(u.working_set_bytes, 7_000);
        assert_eq!(u.rss_bytes, Some(700));
        assert_eq!(u.page_faults, Some(5));
        assert_eq!(u.major_page_faults, Some(2));
        assert_eq!(u.capacity_bytes, 16 * 1024);
        assert_eq!(u.swap, Some((3 * 1024, 1024)));
    }

    #[test]
    fn reads_cgroup_v2_root() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::create_dir_all(&proc).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "cpu memory\n").unwrap();
        std::fs::write(cg.join("cpu.stat"), "usage_usec 42\nuser_usec 40\n").unwrap();
        std::fs::write(cg.join("memory.stat"), "anon 100\ninactive_file 1024\n").unwrap();
        std::fs::write(proc.join("meminfo"), "MemTotal: 8 kB\nMemFree: 2 kB\n").unwrap();
        let u = node_usage(&cg, &proc).unwrap();
        assert_eq!(u.cpu_core_ns, 42_000);
        // No memory.current at the root: MemTotal - MemFree.
        assert_eq!(u.usage_bytes, 6 * 1024);
        assert_eq!(u.working_set_bytes, 5 * 1024);
        assert_eq!(u.rss_bytes, Some(100));
        assert_eq!(u.swap, None);
    }

    #[test]
    fn parses_net_dev_without_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
            lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
            eth0: 5000 10 3 0 0 0 0 0 7000 20 4 0 0 0 0 0\n";
        let ifs = parse_net_dev(text);
        assert_eq!(ifs.len(), 1);
        assert_eq!(ifs[0].name, "eth0");
        assert_eq!(
            (
                ifs[0].rx_bytes,
                ifs[0].rx_errors,
                ifs[0].tx_bytes,
                ifs[0].tx_errors
            ),
            (Some(5000), Some(3), Some(7000), Some(4))
        );
    }

    #[test]
    fn counts_a_directory_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("c")).unwrap();
        std::fs::write(dir.path().join("c/0.log"), vec![b'x'; 10_000]).unwrap();
        let (bytes, inodes) = dir_usage(&dir.path().join("c"));
        assert_eq!(inodes, 2);
        assert!(bytes >= 10_000, "{bytes}");
        assert_eq!(dir_usage(&dir.path().join("missing")), (0, 0));
    }
}
