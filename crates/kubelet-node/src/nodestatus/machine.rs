//! What the node is made of (the parts of cAdvisor's `MachineInfo` and
//! `VersionInfo` that node status reports), read from the host once.

use std::path::Path;

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

/// `MemTotal` from `/proc/meminfo`, in bytes (0 if unreadable).
pub fn meminfo_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
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
    /// Reads the host.
    pub fn read(root_dir: &Path) -> Self {
        let num_cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let kernel_version = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        Self {
            num_cores,
            memory_bytes: meminfo_bytes(),
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
