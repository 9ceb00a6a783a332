//! Driver-neutral cgroup names (upstream `cm/cgroup_manager_linux.go`
//! `CgroupName`, `ToCgroupfs`, `ToSystemd`, `ParseSystemdToCgroupName`,
//! `ParseCgroupfsToCgroupName`, and systemd's `ExpandSlice`).
//!
//! A name is a list of components (`["kubepods", "burstable", "pod<uid>"]`).
//! The cgroupfs driver spells it as a path (`/kubepods/burstable/pod<uid>`);
//! the systemd driver as nested slices, with `-` inside a component escaped
//! to `_` (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`).

use kubelet_types::CgroupDriver;

const SYSTEMD_SUFFIX: &str = ".slice";

/// A cgroup's name, independent of the driver.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    /// The root cgroup.
    pub fn root() -> Self {
        Self(vec![])
    }

    /// `base` with `components` appended (upstream `NewCgroupName`). A
    /// component holds no `/`; upstream also forbids `_` (it would not
    /// survive the systemd round trip) and so does this, by dropping them.
    pub fn child(&self, component: &str) -> Self {
        let mut parts = self.0.clone();
        parts.push(component.replace(['/', '_'], ""));
        Self(parts)
    }

    /// The components.
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// The cgroup this one is in (the root's parent is the root).
    pub fn parent(&self) -> Self {
        let mut parts = self.0.clone();
        parts.pop();
        Self(parts)
    }

    /// The last component ("" for the root).
    pub fn base(&self) -> &str {
        self.0.last().map_or("", String::as_str)
    }

    /// Whether this is the root cgroup.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// `/a/b/c` (upstream `ToCgroupfs`).
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The expanded systemd form `/a.slice/a-b.slice/a-b-c.slice` (upstream `ToSystemd`).
    pub fn to_systemd(&self) -> String {
        if self.0.is_empty() || (self.0.len() == 1 && self.0[0].is_empty()) {
            return "/".into();
        }
        let escaped: Vec<String> = self.0.iter().map(|p| p.replace('-', "_")).collect();
        let mut out = String::new();
        for i in 0..escaped.len() {
            out.push('/');
            out.push_str(&escaped[..=i].join("-"));
            out.push_str(SYSTEMD_SUFFIX);
        }
        out
    }

    /// The unit name of the innermost slice (`a-b-c.slice`), what a
    /// container runtime takes as a systemd cgroup parent.
    pub fn to_systemd_slice(&self) -> String {
        let expanded = self.to_systemd();
        match expanded.rsplit('/').next() {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => "-.slice".into(),
        }
    }

    /// The literal path of this cgroup below a hierarchy's mount point, in
    /// the driver's form (upstream `cgroupCommon.Name`).
    pub fn to_driver(&self, driver: CgroupDriver) -> String {
        match driver {
            CgroupDriver::Cgroupfs => self.to_cgroupfs(),
            CgroupDriver::Systemd => self.to_systemd(),
        }
    }

    /// Parses `/a/b/c` (upstream `ParseCgroupfsToCgroupName`).
    pub fn parse_cgroupfs(name: &str) -> Self {
        Self(
            name.trim_start_matches('/')
                .split('/')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect(),
        )
    }

    /// Parses a systemd slice path by its last element: `a-b-c.slice` gives
    /// `[a, b, c]`, with `_` turned back into `-` (upstream `ParseSystemdToCgroupName`).
    pub fn parse_systemd(name: &str) -> Self {
        let base = name.rsplit('/').next().unwrap_or(name);
        let base = base.strip_suffix(SYSTEMD_SUFFIX).unwrap_or(base);
        if base.is_empty() || base == "-" {
            return Self::root();
        }
        Self(base.split('-').map(|p| p.replace('_', "-")).collect())
    }

    /// Parses a literal path in the driver's form (upstream `cgroupCommon.CgroupName`).
    pub fn parse_driver(name: &str, driver: CgroupDriver) -> Self {
        match driver {
            CgroupDriver::Cgroupfs => Self::parse_cgroupfs(name),
            CgroupDriver::Systemd => Self::parse_systemd(name),
        }
    }
}

impl std::fmt::Display for CgroupName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_cgroupfs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        parts.iter().fold(CgroupName::root(), |n, p| n.child(p))
    }

    #[test]
    fn cgroupfs_form_round_trips() {
        let n = name(&["kubepods", "burstable", "pod1234-abcd"]);
        assert_eq!(n.to_cgroupfs(), "/kubepods/burstable/pod1234-abcd");
        assert_eq!(
            CgroupName::parse_cgroupfs("/kubepods/burstable/pod1234-abcd"),
            n
        );
        assert_eq!(CgroupName::root().to_cgroupfs(), "/");
        assert!(CgroupName::parse_cgroupfs("/").is_root());
    }

    #[test]
    fn systemd_form_escapes_dashes_and_nests_slices() {
        // Upstream's own example in ToSystemd's doc comment.
        let n = name(&["kubepods", "burstable", "pod1234-abcd-5678-efgh"]);
        assert_eq!(
            n.to_systemd(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice"
        );
        assert_eq!(
            n.to_systemd_slice(),
            "kubepods-burstable-pod1234_abcd_5678_efgh.slice"
        );
        assert_eq!(
            CgroupName::parse_systemd(&n.to_systemd()),
            n,
            "the systemd form parses back"
        );
        let g = name(&["kubepods", "pod1-2"]);
        assert_eq!(g.to_systemd(), "/kubepods.slice/kubepods-pod1_2.slice");
        assert_eq!(CgroupName::root().to_systemd(), "/");
        assert_eq!(CgroupName::root().to_systemd_slice(), "-.slice");
        assert_eq!(n.to_driver(CgroupDriver::Cgroupfs), n.to_cgroupfs());
    }

    #[test]
    fn components_lose_separators_they_cannot_hold() {
        assert_eq!(CgroupName::root().child("a/b_c").base(), "abc");
    }
}
