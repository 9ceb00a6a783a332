//! Creating, updating and removing cgroups through cgroupfs (upstream
//! `cm/cgroup_manager_linux.go`, `cgroup_v1_manager_linux.go`,
//! `cgroup_v2_manager_linux.go` and the runc `fs`/`fs2` writers they call).
//!
//! Every call is blocking IO: callers run it off the async runtime. With
//! the systemd driver the names and paths are systemd's (see
//! [`CgroupName::to_systemd`]) and each cgroup is a slice unit: created,
//! changed and stopped through [`SystemdUnits`] first, then its files are
//! written as with cgroupfs (what runc's systemd managers do after systemd).

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kubelet_types::CgroupDriver;
use tracing::debug;

use crate::CgroupError;
use crate::cgroup_name::CgroupName;
use crate::helpers::{cpu_shares_to_weight, hugepage_unit_size};
use crate::systemd_unit::{SystemdUnits, apply_properties, resource_properties, systemd_cpu_quota};

/// Controllers whose directories must exist for a cgroup to exist on v1
/// (upstream `cgroupV1impl.Validate`'s allow list; `hugetlb` when mounted).
const V1_REQUIRED: &[&str] = &["cpu", "cpuacct", "cpuset", "memory", "systemd", "pids"];

/// cgroup v1 controllers (the rest of a mount's options are flags).
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// The mounted cgroup hierarchies (upstream `CgroupSubsystems`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupSubsystems {
    /// Controller -> mount point (`cpu` -> `/sys/fs/cgroup/cpu`); on v2 every
    /// controller maps to the one unified mount.
    pub mount_points: BTreeMap<String, PathBuf>,
    /// The unified (v2) mount when the host runs cgroup v2 only.
    pub unified: Option<PathBuf>,
}

impl CgroupSubsystems {
    /// The hierarchies of `/proc/self/mountinfo`'s text: v1 `cgroup` mounts
    /// by controller (the shortest mount point wins, as upstream), or the
    /// v2 mount at `/sys/fs/cgroup` with the controllers of its
    /// `cgroup.controllers` (`v2_controllers`).
    pub fn from_mountinfo(text: &str, v2_controllers: &str) -> Self {
        let mut out = Self::default();
        for line in text.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = pre.split_whitespace().nth(4) else {
                continue;
            };
            let mut post = post.split_whitespace();
            let (fstype, _src, opts) = (post.next(), post.next(), post.next().unwrap_or(""));
            match fstype {
                Some("cgroup2") if mount_point == "/sys/fs/cgroup" => {
                    out.unified = Some(PathBuf::from(mount_point));
                }
                Some("cgroup") => {
                    for o in opts.split(',') {
                        let ctl = match o.strip_prefix("name=") {
                            Some(n) => n,
                            None if V1_CONTROLLERS.contains(&o) => o,
                            None => continue,
                        };
                        let prev = out.mount_points.get(ctl);
                        if prev.is_none_or(|p| mount_point.len() < p.as_os_str().len()) {
                            out.mount_points
                                .insert(ctl.to_string(), PathBuf::from(mount_point));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(root) = out.unified.clone() {
            out.mount_points = v2_controllers
                .split_whitespace()
                .map(|c| (c.to_string(), root.clone()))
                .collect();
        }
        out
    }

    /// Reads this host's hierarchies.
    pub fn detect() -> Result<Self, CgroupError> {
        let info =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Io {
                path: "/proc/self/mountinfo".into(),
                source,
            })?;
        let controllers =
            std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
        let s = Self::from_mountinfo(&info, &controllers);
        if s.mount_points.is_empty() {
            return Err(CgroupError::NoMounts);
        }
        Ok(s)
    }

    /// A v1 layout: one hierarchy per controller below `root`.
    pub fn v1(root: &Path, controllers: &[&str]) -> Self {
        Self {
            mount_points: controllers
                .iter()
                .map(|c| (c.to_string(), root.join(c)))
                .collect(),
            unified: None,
        }
    }

    /// A v2 layout: every controller in the one hierarchy at `root`.
    pub fn v2(root: &Path, controllers: &[&str]) -> Self {
        Self {
            mount_points: controllers
                .iter()
                .map(|c| (c.to_string(), root.to_path_buf()))
                .collect(),
            unified: Some(root.to_path_buf()),
        }
    }

    /// Whether the host runs the unified (v2) hierarchy only.
    pub fn is_v2(&self) -> bool {
        self.unified.is_some()
    }
}

/// Resource settings of one cgroup (upstream `ResourceConfig`); `None`
/// leaves the kernel's value alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// Memory limit in bytes (`-1` unlimited).
    pub memory: Option<i64>,
    /// cpu.shares (v2: converted to cpu.weight).
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs (`-1` unlimited).
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// pids.max (`-1` unlimited).
    pub pids_limit: Option<i64>,
    /// Huge page size in bytes -> limit in bytes. When set, sizes the host
    /// has but this map omits are limited to 0, as upstream.
    pub hugepage_limit: BTreeMap<i64, i64>,
}

/// Creates, updates and removes cgroups (upstream `CgroupManager`).
#[derive(Clone, Debug)]
pub struct CgroupManager {
    subsystems: CgroupSubsystems,
    driver: CgroupDriver,
    /// The host's huge page sizes (`2MB`, `1GB`).
    hugepage_sizes: Vec<String>,
    /// systemd's unit manager (systemd driver only).
    units: Option<Arc<dyn SystemdUnits>>,
}

impl CgroupManager {
    /// A manager over `subsystems` naming cgroups as `driver` does.
    pub fn new(
        subsystems: CgroupSubsystems,
        driver: CgroupDriver,
        hugepage_sizes: Vec<String>,
    ) -> Self {
        Self {
            subsystems,
            driver,
            hugepage_sizes,
            units: None,
        }
    }

    /// The same manager creating its cgroups as systemd slices through
    /// `units` (the systemd driver).
    pub fn with_systemd(mut self, units: Arc<dyn SystemdUnits>) -> Self {
        self.units = Some(units);
        self
    }

    /// Whether cgroups are created as systemd slices.
    pub fn uses_systemd_units(&self) -> bool {
        self.units.is_some() && self.driver == CgroupDriver::Systemd
    }

    /// systemd's units, for a cgroup other than the root (which is systemd's own).
    fn units_for(&self, name: &CgroupName) -> Option<&Arc<dyn SystemdUnits>> {
        self.units
            .as_ref()
            .filter(|_| self.driver == CgroupDriver::Systemd && !name.is_root())
    }

    /// The driver.
    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// The host's huge page sizes (`2MB`).
    pub fn hugepage_sizes(&self) -> &[String] {
        &self.hugepage_sizes
    }

    /// The hierarchies.
    pub fn subsystems(&self) -> &CgroupSubsystems {
        &self.subsystems
    }

    /// The literal path below a mount point (upstream `Name`).
    pub fn name(&self, name: &CgroupName) -> String {
        name.to_driver(self.driver)
    }

    /// The name of a literal path below a mount point (upstream `CgroupName`).
    pub fn cgroup_name(&self, literal: &str) -> CgroupName {
        CgroupName::parse_driver(literal, self.driver)
    }

    /// The cgroup's directory in each hierarchy, by controller.
    pub fn paths(&self, name: &CgroupName) -> BTreeMap<String, PathBuf> {
        let rel = self.name(name);
        let rel = rel.trim_start_matches('/');
        self.subsystems
            .mount_points
            .iter()
            .map(|(c, m)| (c.clone(), m.join(rel)))
            .collect()
    }

    /// The distinct directories of the cgroup (v2: one).
    fn dirs(&self, name: &CgroupName) -> BTreeSet<PathBuf> {
        self.paths(name).into_values().collect()
    }

    /// Checks that the cgroup exists in every hierarchy the kubelet manages
    /// (upstream `Validate`).
    pub fn validate(&self, name: &CgroupName) -> Result<(), CgroupError> {
        let paths = self.paths(name);
        let missing: Vec<String> = if self.subsystems.is_v2() {
            // v2: one directory; upstream also checks the controllers it needs are enabled.
            paths
                .values()
                .take(1)
                .filter(|p| !p.is_dir())
                .map(|p| p.display().to_string())
                .collect()
        } else {
            paths
                .iter()
                .filter(|(c, _)| V1_REQUIRED.contains(&c.as_str()) || c.as_str() == "hugetlb")
                .filter(|(_, p)| !p.is_dir())
                .map(|(_, p)| p.display().to_string())
                .collect()
        };
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CgroupError::Missing {
                name: name.to_cgroupfs(),
                paths: missing.join(", "),
            })
        }
    }

    /// Whether the cgroup exists (upstream `Exists`).
    pub fn exists(&self, name: &CgroupName) -> bool {
        self.validate(name).is_ok()
    }

    /// Creates the cgroup in every hierarchy and applies `rc` (upstream
    /// `Create`: runc's `Apply(-1)` then `Set`). A failed `Set` is logged,
    /// as upstream does, not returned.
    pub fn create(&self, name: &CgroupName, rc: &ResourceConfig) -> Result<(), CgroupError> {
        let rounded;
        let rc = match self.units_for(name) {
            Some(units) => {
                let props = apply_properties(name, rc, self.subsystems.is_v2());
                units.start_slice(&name.to_systemd_slice(), &props)?;
                rounded = systemd_rounded(rc);
                &rounded
            }
            None => rc,
        };
        for (ctl, dir) in self.paths(name) {
            create_dir(&dir)?;
            if ctl == "cpuset" && !self.subsystems.is_v2() {
                init_cpuset(&self.subsystems.mount_points[&ctl], &dir);
            }
        }
        if let Some(root) = &self.subsystems.unified {
            enable_controllers(root, &self.name(name));
        }
        if let Err(e) = self.update(name, rc) {
            tracing::warn!(cgroup = %name, error = %e, "cgroup manager.Set failed");
        }
        Ok(())
    }

    /// Writes `rc` into the cgroup's files (upstream `Update`).
    pub fn update(&self, name: &CgroupName, rc: &ResourceConfig) -> Result<(), CgroupError> {
        let rounded;
        let rc = match self.units_for(name) {
            Some(units) => {
                let props = resource_properties(rc, self.subsystems.is_v2());
                units.set_properties(&name.to_systemd_slice(), &props)?;
                rounded = systemd_rounded(rc);
                &rounded
            }
            None => rc,
        };
        let paths = self.paths(name);
        if self.subsystems.is_v2() {
            let Some(dir) = paths.values().next() else {
                return Err(CgroupError::NoMounts);
            };
            self.set_v2(dir, rc)
        } else {
            self.set_v1(&paths, rc)
        }
    }

    fn set_v1(
        &self,
        paths: &BTreeMap<String, PathBuf>,
        rc: &ResourceConfig,
    ) -> Result<(), CgroupError> {
        if let Some(cpu) = paths.get("cpu") {
            if let Some(s) = rc.cpu_shares {
                write(cpu, "cpu.shares", &s.to_string())?;
            }
            if let Some(p) = rc.cpu_period.filter(|p| *p != 0) {
                write(cpu, "cpu.cfs_period_us", &p.to_string())?;
            }
            if let Some(q) = rc.cpu_quota.filter(|q| *q != 0) {
                write(cpu, "cpu.cfs_quota_us", &q.to_string())?;
            }
        }
        if let (Some(dir), Some(m)) = (paths.get("memory"), rc.memory.filter(|m| *m != 0)) {
            write(dir, "memory.limit_in_bytes", &m.to_string())?;
        }
        if let (Some(dir), Some(p)) = (paths.get("pids"), rc.pids_limit.filter(|p| *p != 0)) {
            write(dir, "pids.max", &limit_text(p))?;
        }
        if let Some(dir) = paths.get("hugetlb") {
            for (size, limit) in self.hugetlb_limits(rc) {
                write(
                    dir,
                    &format!("hugetlb.{size}.limit_in_bytes"),
                    &limit.to_string(),
                )?;
            }
        }
        Ok(())
    }

    fn set_v2(&self, dir: &Path, rc: &ResourceConfig) -> Result<(), CgroupError> {
        let has = |c: &str| self.subsystems.mount_points.contains_key(c);
        if has("cpu") {
            if let Some(s) = rc.cpu_shares {
                write(dir, "cpu.weight", &cpu_shares_to_weight(s).to_string())?;
            }
            let (q, p) = (rc.cpu_quota.unwrap_or(0), rc.cpu_period.unwrap_or(0));
            if q != 0 || p != 0 {
                let mut max = if q > 0 { q.to_string() } else { "max".into() };
                if p != 0 {
                    max.push_str(&format!(" {p}"));
                }
                write(dir, "cpu.max", &max)?;
            }
        }
        if let (true, Some(m)) = (has("memory"), rc.memory.filter(|m| *m != 0)) {
            write(dir, "memory.max", &limit_text(m))?;
        }
        if let (true, Some(p)) = (has("pids"), rc.pids_limit.filter(|p| *p != 0)) {
            write(dir, "pids.max", &limit_text(p))?;
        }
        if has("hugetlb") {
            for (size, limit) in self.hugetlb_limits(rc) {
                write(dir, &format!("hugetlb.{size}.max"), &limit.to_string())?;
            }
        }
        Ok(())
    }

    /// Upstream `maybeSetHugetlb`: the configured sizes, then 0 for every
    /// other size the host has. Nothing when no size is configured.
    fn hugetlb_limits(&self, rc: &ResourceConfig) -> Vec<(String, i64)> {
        if rc.hugepage_limit.is_empty() {
            return vec![];
        }
        let mut out: Vec<(String, i64)> = rc
            .hugepage_limit
            .iter()
            .filter_map(|(size, limit)| hugepage_unit_size(*size).map(|s| (s, *limit)))
            .collect();
        for s in &self.hugepage_sizes {
            if !out.iter().any(|(have, _)| have == s) {
                out.push((s.clone(), 0));
            }
        }
        out
    }

    /// Processes in the cgroup or any cgroup below it (upstream `Pids`).
    pub fn pids(&self, name: &CgroupName) -> Vec<i32> {
        let mut out = BTreeSet::new();
        for dir in self.dirs(name) {
            collect_pids(&dir, &mut out);
        }
        out.into_iter().collect()
    }

    /// Removes the cgroup, and any left below it, from every hierarchy
    /// (upstream `Destroy`). Missing directories are fine.
    pub fn destroy(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if let Some(units) = self.units_for(name) {
            units.stop_slice(&name.to_systemd_slice())?;
        }
        for dir in self.dirs(name) {
            remove_tree(&dir)?;
        }
        Ok(())
    }
}

/// `rc` with the CPU quota systemd keeps (see [`systemd_cpu_quota`]).
fn systemd_rounded(rc: &ResourceConfig) -> ResourceConfig {
    let mut out = rc.clone();
    if let Some(q) = rc.cpu_quota {
        out.cpu_quota = Some(systemd_cpu_quota(q, rc.cpu_period.unwrap_or(0)));
    }
    out
}

fn limit_text(v: i64) -> String {
    if v < 0 { "max".into() } else { v.to_string() }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    debug!(path = %path.display(), value, "Writing cgroup file");
    std::fs::write(&path, value).map_err(|source| CgroupError::Io { path, source })
}

fn create_dir(dir: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(dir).map_err(|source| CgroupError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

/// A v1 cpuset cgroup takes no task until `cpuset.cpus` and `cpuset.mems`
/// are set: copy them down from the first ancestor that has them (runc's
/// `cpusetCopyIfNeeded`).
fn init_cpuset(mount: &Path, dir: &Path) {
    let mut chain: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| a.starts_with(mount))
        .collect();
    chain.reverse();
    for w in chain.windows(2) {
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let mine = std::fs::read_to_string(w[1].join(f)).unwrap_or_default();
            if !mine.trim().is_empty() {
                continue;
            }
            if let Ok(parent) = std::fs::read_to_string(w[0].join(f))
                && !parent.trim().is_empty()
                && let Err(e) = std::fs::write(w[1].join(f), parent.trim())
            {
                debug!(dir = %w[1].display(), error = %e, "Cannot initialise cpuset");
            }
        }
    }
}

/// v2: controllers reach a cgroup only when every ancestor lists them in
/// `cgroup.subtree_control` (runc's `CreateCgroupPath`).
fn enable_controllers(root: &Path, rel: &str) {
    let mut dir = root.to_path_buf();
    for part in rel.trim_matches('/').split('/').filter(|p| !p.is_empty()) {
        let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        let wanted: Vec<String> = available
            .split_whitespace()
            .filter(|c| matches!(*c, "cpu" | "cpuset" | "memory" | "pids" | "hugetlb" | "io"))
            .map(|c| format!("+{c}"))
            .collect();
        if !wanted.is_empty()
            && let Err(e) = std::fs::write(dir.join("cgroup.subtree_control"), wanted.join(" "))
        {
            debug!(dir = %dir.display(), error = %e, "Cannot enable controllers");
        }
        dir.push(part);
    }
}

fn collect_pids(dir: &Path, out: &mut BTreeSet<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out);
            }
        }
    }
}

/// Removes a cgroup directory and its children, deepest first (cgroupfs
/// directories go with `rmdir`, their control files with them).
fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Io {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        // A plain directory standing in for cgroupfs (tests): files and all.
        Err(e) if e.kind() == ErrorKind::DirectoryNotEmpty && !is_cgroupfs(dir) => {
            std::fs::remove_dir_all(dir).map_err(|source| CgroupError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
        Err(source) => Err(CgroupError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Whether `dir` is on a cgroup filesystem (its control files are not removable).
fn is_cgroupfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir).is_ok_and(|s| {
        let t = s.filesystem_type();
        t == nix::sys::statfs::CGROUP_SUPER_MAGIC || t == nix::sys::statfs::CGROUP2_SUPER_MAGIC
    })
}

#[cfg(test)]
mod tests;
