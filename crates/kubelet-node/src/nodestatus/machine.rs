//! What the node is made of (the parts of cAdvisor's `MachineInfo` and
//! `VersionInfo` that node status reports), read from the host once.
//!
//! Reading the host is blocking file IO (`/proc`, `/sys`, `statvfs`): async
//! code calls [`MachineInfo::read`] and [`meminfo_bytes`], which do it on
//! tokio's blocking pool; the `_blocking` twins are for sync code.

use std::path::{Path, PathBuf};

use tracing::warn;

/// Where [`meminfo_bytes`] reads `MemTotal`.
const MEMINFO: &str = "/proc/meminfo";

/// Host facts for node status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineInfo {
    /// Logical CPUs.
    pub num_cores: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Size of the filesystem holding the kubelet root dir, in bytes.
    pub root_fs_bytes: u64,
    /// Hugepage sizes (in KiB) and the bytes preallocated for each.
    pub hugepages: Vec<(u64, u64)>,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// DMI product UUID.
    pub system_uuid: String,
    /// Boot ID.
    pub boot_id: String,
    /// `uname -r`.
    pub kernel_version: String,
    /// PRETTY_NAME from os-release.
    pub os_image: String,
    /// GOARCH-style architecture.
    pub architecture: String,
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The GOARCH name of the build target.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn os_image() -> String {
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".to_string())
}

/// Runs `read` on tokio's blocking pool; `T::default()` (the "unreadable"
/// value of every host fact here) if the pool drops it, as at shutdown.
async fn off_runtime<T, F>(what: &'static str, read: F) -> T
where
    T: Default + Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| {
        warn!(error = %e, "Cannot read {what}");
        T::default()
    })
}

/// `MemTotal` from `/proc/meminfo`, in bytes (0 if unreadable), read off the
/// async runtime.
pub async fn meminfo_bytes() -> u64 {
    meminfo_bytes_from(PathBuf::from(MEMINFO)).await
}

async fn meminfo_bytes_from(path: PathBuf) -> u64 {
    off_runtime("memory size", move || meminfo_bytes_at(&path)).await
}

/// [`meminfo_bytes`] for sync code: blocks on file IO.
pub fn meminfo_bytes_blocking() -> u64 {
    meminfo_bytes_at(Path::new(MEMINFO))
}

fn meminfo_bytes_at(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn hugepages() -> Vec<(u64, u64)> {
    let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") else {
        return vec![];
    };
    let mut out: Vec<(u64, u64)> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let nr: u64 = read_trim(&format!("/sys/kernel/mm/hugepages/{name}/nr_hugepages"))
                .parse()
                .unwrap_or(0);
            Some((kb, nr * kb * 1024))
        })
        .collect();
    out.sort_unstable();
    out
}

fn fs_bytes(path: &Path) -> u64 {
    let mut p = path.to_path_buf();
    // The root dir may not exist yet: measure the nearest existing parent.
    while !p.exists() {
        if !p.pop() {
            break;
        }
    }
    nix::sys::statvfs::statvfs(&p)
        .map(|s| s.blocks() * s.fragment_size())
        .unwrap_or(0)
}

impl MachineInfo {
    /// Reads the host off the async runtime; `root_dir` is the kubelet root
    /// dir whose filesystem is measured.
    pub async fn read(root_dir: &Path) -> Self {
        let root_dir = root_dir.to_path_buf();
        off_runtime("machine info", move || Self::read_blocking(&root_dir)).await
    }

    /// [`MachineInfo::read`] for sync code: blocks on file IO.
    pub fn read_blocking(root_dir: &Path) -> Self {
        let num_cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let kernel_version = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        Self {
            num_cores,
            memory_bytes: meminfo_bytes_blocking(),
            root_fs_bytes: fs_bytes(root_dir),
            hugepages: hugepages(),
            machine_id: read_trim("/etc/machine-id"),
            system_uuid: read_trim("/sys/class/dmi/id/product_uuid"),
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
            kernel_version,
            os_image: os_image(),
            architecture: go_arch().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_async_reads_agree_with_the_blocking_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("not/yet/created");
        let read = MachineInfo::read(&root).await;
        let blocking = MachineInfo::read_blocking(&root);
        assert_eq!(
            (read.num_cores, read.memory_bytes, read.root_fs_bytes),
            (
                blocking.num_cores,
                blocking.memory_bytes,
                blocking.root_fs_bytes
            )
        );
        assert_eq!(read.boot_id, blocking.boot_id);
        assert_eq!(meminfo_bytes().await, meminfo_bytes_blocking());
        assert_eq!(read.memory_bytes, meminfo_bytes_blocking());

        std::fs::write(
            dir.path().join("meminfo"),
            "MemTotal:        8148552 kB\nMemFree:  1 kB\n",
        )
        .expect("meminfo");
        assert_eq!(
            meminfo_bytes_from(dir.path().join("meminfo")).await,
            8148552 * 1024
        );
        assert_eq!(meminfo_bytes_from(dir.path().join("missing")).await, 0);
    }

    /// Issue 7 fix 4.8: a host read that blocks (here a FIFO with no writer
    /// as meminfo) does not stall the runtime `App::build` runs on.
    #[test]
    fn a_blocking_host_read_does_not_stall_the_runtime() {
        kubelet_test_util::blocking::assert_runtime_not_stalled_by("meminfo", |dir| {
            meminfo_bytes_from(dir.join("meminfo"))
        });
    }
}
