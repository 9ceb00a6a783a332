//! The registered CSI drivers of this node (upstream `csi_drivers_store.go`):
//! name to socket and the highest CSI version the driver supports.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

/// A CSI spec version `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u64, pub u64, pub u64);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    /// Parses `1`, `1.2`, `1.2.3` or `v1.2.3` (upstream `ParseGeneric`).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = s.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map(str::parse).transpose().ok()?.unwrap_or(0);
        let patch = parts.next().map(str::parse).transpose().ok()?.unwrap_or(0);
        if parts.next().is_some() {
            return None;
        }
        Some(Self(major, minor, patch))
    }
}

/// The highest version of `versions` this kubelet supports: CSI 1.x only
/// (0.x is gone since Kubernetes 1.17, 2.x need not be compatible).
pub fn highest_supported_version(versions: &[String]) -> Option<Version> {
    versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .filter(|v| v.0 == 1)
        .max()
}

/// One registered driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// The driver's CSI socket.
    pub endpoint: PathBuf,
    /// The highest CSI version both sides support.
    pub highest_supported_version: Version,
}

/// Registered drivers by name; shared by the registration handler and the
/// volume operations.
#[derive(Debug, Default)]
pub struct DriversStore {
    drivers: RwLock<HashMap<String, Driver>>,
}

impl DriversStore {
    /// The driver `name`, if registered.
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.drivers.read().get(name).cloned()
    }

    /// Registers (or replaces) `name`.
    pub fn set(&self, name: &str, driver: Driver) {
        self.drivers.write().insert(name.to_string(), driver);
    }

    /// Forgets `name`, but only while it is still served at `endpoint`
    /// (a newer registration may have replaced it). Returns whether it did.
    pub fn delete_if_endpoint(&self, name: &str, endpoint: &Path) -> bool {
        let mut drivers = self.drivers.write();
        match drivers.get(name) {
            Some(d) if d.endpoint == endpoint => {
                drivers.remove(name);
                true
            }
            _ => false,
        }
    }

    /// Forgets `name`.
    pub fn delete(&self, name: &str) {
        self.drivers.write().remove(name);
    }

    /// Names of all registered drivers.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.drivers.read().keys().cloned().collect();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_1x_versions_are_supported() {
        let v = |s: &[&str]| {
            highest_supported_version(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(v(&["1.0.0", "1.5.0", "0.3.0"]), Some(Version(1, 5, 0)));
        assert_eq!(v(&["v1.2"]), Some(Version(1, 2, 0)));
        assert_eq!(v(&["0.3.0", "2.0.0"]), None);
        assert_eq!(v(&["bogus"]), None);
    }

    #[test]
    fn delete_only_the_registered_endpoint() {
        let s = DriversStore::default();
        s.set(
            "d",
            Driver {
                endpoint: "/a".into(),
                highest_supported_version: Version(1, 0, 0),
            },
        );
        assert!(!s.delete_if_endpoint("d", Path::new("/b")));
        assert!(s.get("d").is_some());
        assert!(s.delete_if_endpoint("d", Path::new("/a")));
        assert!(s.get("d").is_none());
    }
}
