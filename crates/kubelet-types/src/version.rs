//! The Kubernetes version kubelet-rs reports (`docs/operating.md`, "The
//! version a node reports"): upstream's `version.Get().GitVersion`, which
//! `kubelet --version` prints and the Node's `status.nodeInfo.kubeletVersion`
//! carries.
//!
//! kubelet-rs implements the kubelet of [`KUBERNETES_VERSION`] and behaves
//! as the kubelet of each older control plane from 1.19 on. The version
//! skew policy forbids a kubelet newer than its apiserver, so by default
//! ([`ReportedVersion::Auto`]) the Node reports the control plane's version
//! when that is older, and kubelet-rs's own when the control plane is as new
//! or newer. `--version=vX.Y.Z` (upstream's verflag: "sets the reported
//! version") pins what the Node reports, for tooling that checks versions
//! exactly.

use std::fmt;

/// The newest Kubernetes release whose kubelet kubelet-rs implements.
pub const KUBERNETES_VERSION: &str = "v1.35.0";

/// The oldest control plane kubelet-rs serves.
pub const OLDEST_CONTROL_PLANE: (u32, u32) = (1, 19);

/// `v<major>.<minor>.<patch>` and whatever follows (`-rc.1`, `+k3s1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Semver {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Semver {
    /// Parses `v1.19.16`, `1.19.16`, `v1.30.2-eks-1234` or `v1.28.3+k3s1`:
    /// the three numbers; what follows the patch must start with `-` or `+`.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = s.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let rest = parts.next()?;
        let end = rest.find(['-', '+']).unwrap_or(rest.len());
        let patch = rest[..end].parse().ok()?;
        Some(Self {
            major,
            minor,
            patch,
        })
    }

    /// Major and minor.
    pub fn minor_version(self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// kubelet-rs's own version as [`Semver`].
pub fn own() -> Semver {
    Semver::parse(KUBERNETES_VERSION).unwrap_or(Semver {
        major: 1,
        minor: 35,
        patch: 0,
    })
}

/// What the Node reports as its kubelet's version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReportedVersion {
    /// The control plane's version when it is older than kubelet-rs's own,
    /// else kubelet-rs's own.
    #[default]
    Auto,
    /// Exactly this (`--version=vX.Y.Z`).
    Pinned(String),
}

/// A `--version=vX.Y.Z` kubelet-rs cannot report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not `vMAJOR.MINOR.PATCH[-pre][+build]`.
    #[error("--version={0}: not a version (want vMAJOR.MINOR.PATCH, e.g. v1.30.4)")]
    Syntax(String),
    /// Outside the control planes kubelet-rs serves.
    #[error("--version={0}: kubelet-rs reports versions from v1.19.0 to v1.35.x")]
    Range(String),
}

impl ReportedVersion {
    /// `--version=vX.Y.Z`: a version kubelet-rs can stand for, from 1.19 to
    /// its own minor release.
    pub fn pinned(v: &str) -> Result<Self, VersionError> {
        let s = Semver::parse(v)
            .filter(|_| v.starts_with('v'))
            .ok_or_else(|| VersionError::Syntax(v.to_string()))?;
        if s.minor_version() < OLDEST_CONTROL_PLANE || s.minor_version() > own().minor_version() {
            return Err(VersionError::Range(v.to_string()));
        }
        Ok(Self::Pinned(v.to_string()))
    }

    /// The version to report to an apiserver whose `/version` says
    /// `git_version` and `major`.`minor` (`None`: not read yet). A
    /// `gitVersion` that is not semver (a vendor's own form) counts as
    /// `v<major>.<minor>.0`.
    pub fn report(&self, server: Option<(&str, u32, u32)>) -> String {
        match self {
            Self::Pinned(v) => v.clone(),
            Self::Auto => {
                let server = server.map(|(git, major, minor)| {
                    Semver::parse(git)
                        .filter(|s| s.minor_version() == (major, minor))
                        .unwrap_or(Semver {
                            major,
                            minor,
                            patch: 0,
                        })
                });
                match server {
                    Some(s) if s.minor_version() < own().minor_version() => s.to_string(),
                    _ => KUBERNETES_VERSION.to_string(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_apiservers_and_operators_write() {
        let v = |s| Semver::parse(s).map(|v| v.to_string());
        assert_eq!(v("v1.19.16"), Some("v1.19.16".into()));
        assert_eq!(v("v1.30.2-eks-1234"), Some("v1.30.2".into()));
        assert_eq!(v("v1.28.3+k3s1"), Some("v1.28.3".into()));
        assert_eq!(v("1.35.0"), Some("v1.35.0".into()));
        assert_eq!(v("v1.35"), None);
        assert_eq!(v("v1.x.0"), None);
        assert_eq!(v("v1.35.0rc1"), None);
    }

    #[test]
    fn auto_reports_an_older_control_planes_version_and_its_own_otherwise() {
        let auto = ReportedVersion::Auto;
        assert_eq!(auto.report(None), KUBERNETES_VERSION);
        assert_eq!(auto.report(Some(("v1.19.16", 1, 19))), "v1.19.16");
        assert_eq!(auto.report(Some(("v1.34.2-gke.100", 1, 34))), "v1.34.2");
        assert_eq!(auto.report(Some(("v1.35.7", 1, 35))), KUBERNETES_VERSION);
        assert_eq!(auto.report(Some(("v1.36.0", 1, 36))), KUBERNETES_VERSION);
        // A vendor's own gitVersion: never newer than the apiserver.
        assert_eq!(auto.report(Some(("vendor-1.28", 1, 28))), "v1.28.0");
    }

    #[test]
    fn pinned_versions_within_the_served_range() {
        let p = ReportedVersion::pinned("v1.30.4").expect("valid");
        assert_eq!(p.report(Some(("v1.19.16", 1, 19))), "v1.30.4");
        assert!(matches!(
            ReportedVersion::pinned("v1.18.20"),
            Err(VersionError::Range(_))
        ));
        assert!(matches!(
            ReportedVersion::pinned("v1.36.0"),
            Err(VersionError::Range(_))
        ));
        assert!(matches!(
            ReportedVersion::pinned("1.30.4"),
            Err(VersionError::Syntax(_))
        ));
        assert!(ReportedVersion::pinned("v1.35.1+custom").is_ok());
    }
}
