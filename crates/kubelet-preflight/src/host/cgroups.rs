//! The cgroup hierarchy: which version the host runs (runc's
//! `IsCgroup2UnifiedMode`: `/sys/fs/cgroup` is the unified hierarchy), and
//! a cgroup v1 host against `failCgroupV1` (upstream
//! `validateKubeletOSConfiguration`; true by default with a config file
//! since 1.35, false with flags alone).

use std::path::Path;

use crate::finding::{Finding, Kind};
use crate::report::Report;

/// The version the host runs, from its cgroup mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    /// The unified hierarchy at the mount.
    V2,
    /// Per-controller hierarchies (or the hybrid layout).
    V1,
}

/// The version of the hierarchy mounted at `mount` (`/sys/fs/cgroup`):
/// only the unified hierarchy has `cgroup.controllers` at its root.
pub(crate) fn version(mount: &Path) -> Version {
    if mount.join("cgroup.controllers").is_file() {
        Version::V2
    } else {
        Version::V1
    }
}

/// Reports the version, and refuses v1 when `fail_cgroup_v1`.
pub(crate) fn check(mount: &Path, fail_cgroup_v1: bool, report: &mut Report) {
    let field = "failCgroupV1";
    match version(mount) {
        Version::V2 => report.push(Finding::info(
            Kind::Cgroups,
            format!("cgroup v2 (the unified hierarchy at {})", mount.display()),
        )),
        Version::V1 if fail_cgroup_v1 => report.push(
            Finding::error(
                Kind::Cgroups,
                "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is unsupported and will be removed in a future release (set failCgroupV1: false in the kubelet config file, or --fail-cgroupv1=false, to run on this host)",
            )
            .field(field),
        ),
        Version::V1 => report.push(
            Finding::warning(
                Kind::Cgroups,
                "cgroup v1: in maintenance upstream; a 1.35 kubelet with a config file refuses it unless failCgroupV1 is false",
            )
            .field(field),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Severity;

    #[test]
    fn v1_is_refused_only_when_fail_cgroup_v1() {
        let v1 = tempfile::tempdir().expect("tempdir");
        let v2 = tempfile::tempdir().expect("tempdir");
        std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory\n").expect("write");
        assert_eq!(version(v1.path()), Version::V1);
        assert_eq!(version(v2.path()), Version::V2);
        let severities = |mount: &Path, fail: bool| {
            let mut r = Report::default();
            check(mount, fail, &mut r);
            r.findings
                .iter()
                .map(|f| (f.kind, f.severity))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            severities(v1.path(), true),
            [(Kind::Cgroups, Severity::Error)]
        );
        assert_eq!(
            severities(v1.path(), false),
            [(Kind::Cgroups, Severity::Warning)]
        );
        assert_eq!(
            severities(v2.path(), true),
            [(Kind::Cgroups, Severity::Info)]
        );
    }
}
