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
    /// Parses a semantic version as upstream's `version.ParseSemantic` does:
    /// `v1.19.16`, `1.19.16`, `v1.30.2-eks-1234`, `v1.28.3+k3s1`: three
    /// numbers of ASCII digits without leading zeros, then an optional
    /// `-pre.release` and `+build.metadata` of dot-separated non-empty
    /// identifiers of `[0-9A-Za-z-]`. Anything else (`v1.+30.4`,
    /// `v1.30.04`, `v1.30.4-`, a space) is not a version.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let end = s.find(['-', '+']).unwrap_or(s.len());
        let (core, rest) = s.split_at(end);
        let mut parts = core.split('.');
        let major = number(parts.next()?)?;
        let minor = number(parts.next()?)?;
        let patch = number(parts.next()?)?;
        if parts.next().is_some() {
            return None;
        }
        let (pre, build) = match rest.split_once('+') {
            Some((pre, build)) => (pre, Some(build)),
            None => (rest, None),
        };
        if let Some(pre) = pre.strip_prefix('-') {
            identifiers(pre)?;
        } else if !pre.is_empty() {
            return None;
        }
        if let Some(build) = build {
            identifiers(build)?;
        }
        Some(Self {
            major,
            minor,
            patch,
        })
    }

    /// Whether `s` (a version [`Semver::parse`] accepts) is a pre-release,
    /// which orders before the release of the same numbers.
    fn is_prerelease(s: &str) -> bool {
        let s = s.strip_prefix('v').unwrap_or(s);
        s.split('+').next().is_some_and(|core| core.contains('-'))
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

/// A version number: ASCII digits, no leading zero.
fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

/// Dot-separated non-empty identifiers of `[0-9A-Za-z-]`.
fn identifiers(s: &str) -> Option<()> {
    s.split('.')
        .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .then_some(())
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
    /// `git_version` and `major`.`minor` (`None`: not read yet): its
    /// `gitVersion` as it is (a vendor's suffix kept, so never newer than
    /// the apiserver) when that is a semantic version of the same minor
    /// release, else `v<major>.<minor>.0`.
    pub fn report(&self, server: Option<(&str, u32, u32)>) -> String {
        match self {
            Self::Pinned(v) => v.clone(),
            Self::Auto => match server {
                Some((_, major, minor)) if (major, minor) >= own().minor_version() => {
                    KUBERNETES_VERSION.to_string()
                }
                Some((git, major, minor)) => match Semver::parse(git) {
                    Some(s) if s.minor_version() == (major, minor) => git.to_string(),
                    _ => Semver {
                        major,
                        minor,
                        patch: 0,
                    }
                    .to_string(),
                },
                None => KUBERNETES_VERSION.to_string(),
            },
        }
    }
}

/// The version a kubelet process reports in [`ReportedVersion::Auto`]: the
/// lowest it has been given, so it never rises while the process runs.
/// Behind a load balancer, apiservers of two releases answer in turn while
/// a control plane is upgraded; an upstream kubelet's version changes only
/// when it is restarted (upgraded), and so does kubelet-rs's: a control
/// plane upgraded past the reported version is followed at the next start.
#[derive(Debug, Default)]
pub struct LowestReported(parking_lot::Mutex<Option<String>>);

impl LowestReported {
    /// Keeps `candidate` if it is lower than what was reported so far (or
    /// nothing was), and returns what to report now.
    pub fn settle(&self, candidate: String) -> String {
        let mut held = self.0.lock();
        let lower = match held.as_deref() {
            None => true,
            Some(prev) => order(&candidate) < order(prev),
        };
        if lower {
            *held = Some(candidate);
        }
        held.clone().unwrap_or_default()
    }
}

/// Orders reported versions: the numbers, then a pre-release before its
/// release. One that does not parse sorts last (never replaces another).
fn order(v: &str) -> (u32, u32, u32, bool) {
    Semver::parse(v).map_or((u32::MAX, u32::MAX, u32::MAX, true), |s| {
        (s.major, s.minor, s.patch, !Semver::is_prerelease(v))
    })
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
        // Go's ParseSemantic refuses these too.
        assert_eq!(v("v1.+30.4"), None);
        assert_eq!(v("v1.30.04"), None);
        assert_eq!(v("v1.30.4-"), None);
        assert_eq!(v("v1.30.4+"), None);
        assert_eq!(v("v1.30.4-a b"), None);
        assert_eq!(v("v1.30.4-rc..1"), None);
        assert_eq!(v("v1.30.4.1"), None);
        assert_eq!(v("v1.30.4-rc.1+build.7"), Some("v1.30.4".into()));
    }

    #[test]
    fn auto_reports_an_older_control_planes_version_and_its_own_otherwise() {
        let auto = ReportedVersion::Auto;
        assert_eq!(auto.report(None), KUBERNETES_VERSION);
        assert_eq!(auto.report(Some(("v1.19.16", 1, 19))), "v1.19.16");
        assert_eq!(
            auto.report(Some(("v1.34.2-gke.100", 1, 34))),
            "v1.34.2-gke.100",
            "a vendor's version as it is: v1.34.2 would be newer"
        );
        assert_eq!(auto.report(Some(("v1.28.3+k3s1", 1, 28))), "v1.28.3+k3s1");
        assert_eq!(auto.report(Some(("v1.31.0-rc.1", 1, 31))), "v1.31.0-rc.1");
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
        for bad in ["v1.+30.4", "v1.30.04", "v1.30.4-", "v1.30.4-a b"] {
            assert!(
                matches!(ReportedVersion::pinned(bad), Err(VersionError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_reported_version_never_rises_within_a_process() {
        let l = LowestReported::default();
        assert_eq!(l.settle(KUBERNETES_VERSION.into()), KUBERNETES_VERSION);
        // The first read of an older control plane lowers it.
        assert_eq!(l.settle("v1.30.2".into()), "v1.30.2");
        // Apiservers of an upgrade in progress answer in turn: no flip.
        assert_eq!(l.settle("v1.31.0".into()), "v1.30.2");
        assert_eq!(l.settle("v1.30.2".into()), "v1.30.2");
        assert_eq!(l.settle("v1.30.2-eks-1".into()), "v1.30.2-eks-1");
        assert_eq!(l.settle("v1.30.2".into()), "v1.30.2-eks-1");
        assert_eq!(l.settle("v1.29.9".into()), "v1.29.9");
    }
}
