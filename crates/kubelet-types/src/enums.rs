//! Small closed sets the API and the kubelet spell as strings, as enums:
//! pod phases (upstream `v1.PodPhase`), cgroup drivers (`cgroupDriver` in
//! `KubeletConfiguration`, `pkg/kubelet/cm`) and probe results
//! (`pkg/kubelet/prober/results`).

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A pod's phase (upstream `v1.PodPhase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodPhase {
    /// Accepted, but not every container has been started.
    Pending,
    /// Bound, every container created, at least one running or restarting.
    Running,
    /// Every container terminated successfully and none will restart.
    Succeeded,
    /// Every container terminated, at least one in failure, and none will restart.
    Failed,
    /// The state cannot be obtained.
    Unknown,
}

impl PodPhase {
    /// The API name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Unknown => "Unknown",
        }
    }

    /// True for `Succeeded` and `Failed`: the pod will never run again
    /// (upstream `podutil.IsPodPhaseTerminal`).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

impl FromStr for PodPhase {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "Pending" => Ok(Self::Pending),
            "Running" => Ok(Self::Running),
            "Succeeded" => Ok(Self::Succeeded),
            "Failed" => Ok(Self::Failed),
            "Unknown" => Ok(Self::Unknown),
            _ => Err(Error::Unknown {
                kind: "pod phase",
                value: s.to_string(),
            }),
        }
    }
}

/// How pod cgroups are named and managed (`--cgroup-driver`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CgroupDriver {
    /// Directories under the cgroup mount, written by the kubelet and runtime.
    #[default]
    Cgroupfs,
    /// Slices that systemd owns (`kubepods-burstable-pod<uid>.slice`).
    Systemd,
}

impl CgroupDriver {
    /// The flag and config-file name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }
}

impl FromStr for CgroupDriver {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            _ => Err(Error::CgroupDriver(s.to_string())),
        }
    }
}

impl TryFrom<String> for CgroupDriver {
    type Error = Error;

    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

/// The outcome of one probe (upstream `results.Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// Not probed yet, or the probe could not run.
    Unknown,
    /// The probe passed.
    Success,
    /// The probe failed.
    Failure,
}

impl ProbeResult {
    /// Upstream's `String()`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "UNKNOWN",
            Self::Success => "Success",
            Self::Failure => "Failure",
        }
    }

    /// Upstream `ToPrometheusType`: 0 success, 1 failure, -1 unknown.
    pub fn to_prometheus(self) -> f64 {
        match self {
            Self::Success => 0.0,
            Self::Failure => 1.0,
            Self::Unknown => -1.0,
        }
    }
}

impl FromStr for ProbeResult {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "UNKNOWN" => Ok(Self::Unknown),
            "Success" => Ok(Self::Success),
            "Failure" => Ok(Self::Failure),
            _ => Err(Error::Unknown {
                kind: "probe result",
                value: s.to_string(),
            }),
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}

display_as_str!(PodPhase, CgroupDriver, ProbeResult);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for p in [
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
            PodPhase::Unknown,
        ] {
            assert_eq!(p.to_string().parse::<PodPhase>(), Ok(p));
        }
        assert!(PodPhase::Failed.is_terminal() && !PodPhase::Running.is_terminal());
        assert!("running".parse::<PodPhase>().is_err());
        for d in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
            assert_eq!(d.to_string().parse::<CgroupDriver>(), Ok(d));
        }
        assert_eq!(CgroupDriver::default(), CgroupDriver::Cgroupfs);
        assert_eq!(
            "cgroupfs2".parse::<CgroupDriver>(),
            Err(Error::CgroupDriver("cgroupfs2".into()))
        );
        assert_eq!(
            CgroupDriver::try_from("systemd".to_string()),
            Ok(CgroupDriver::Systemd)
        );
        for r in [
            ProbeResult::Unknown,
            ProbeResult::Success,
            ProbeResult::Failure,
        ] {
            assert_eq!(r.to_string().parse::<ProbeResult>(), Ok(r));
        }
        assert_eq!(ProbeResult::Unknown.as_str(), "UNKNOWN");
        assert!(ProbeResult::Unknown.to_prometheus() < 0.0);
    }
}
