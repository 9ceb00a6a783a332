//! The systemd cgroup driver's slices (upstream `cm/cgroup_manager_linux.go`
//! with the systemd driver, which calls runc's `libcontainer/cgroups/systemd`
//! managers: `Apply` starts a transient slice unit, `Set` changes its
//! properties, `Destroy` stops it; the cgroup files are then written as with
//! cgroupfs, as runc's `fs`/`fs2` managers do after systemd).
//!
//! This module holds the seam ([`SystemdUnits`]) and the unit properties
//! runc's managers send for a resource config (`genV1ResourcesProperties`,
//! `genV2ResourcesProperties`, `addCpuQuota`); [`crate::systemd_dbus`]
//! speaks them to systemd over D-Bus.

use std::fmt::Debug;

use crate::CgroupError;
use crate::cgroup_manager::ResourceConfig;
use crate::cgroup_name::CgroupName;
use crate::helpers::cpu_shares_to_weight;

/// systemd's `USEC_INFINITY` / `CGROUP_LIMIT_MAX`: no limit.
pub const INFINITY: u64 = u64::MAX;
/// The CFS period runc assumes when a quota comes without one (µs).
const DEFAULT_CPU_QUOTA_PERIOD: u64 = 100_000;

/// A property value, in the D-Bus type systemd expects for its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PropertyValue {
    /// `s`.
    Str(String),
    /// `b`.
    Bool(bool),
    /// `t`.
    U64(u64),
    /// `as`.
    Strs(Vec<String>),
}

/// One `(name, value)` of `StartTransientUnit`/`SetUnitProperties`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitProperty {
    /// systemd's property name (`MemoryMax`).
    pub name: &'static str,
    /// Its value.
    pub value: PropertyValue,
}

fn prop(name: &'static str, value: PropertyValue) -> UnitProperty {
    UnitProperty { name, value }
}

/// systemd's unit manager, as far as the kubelet's slices need it. Calls
/// block (they run on the blocking pool, as all cgroup IO does) and each
/// has a deadline.
pub trait SystemdUnits: Send + Sync + Debug {
    /// Starts the transient slice `unit` with `properties` and waits for its
    /// start job; a slice that already exists gets the properties instead
    /// (runc's `startUnit` with `ignoreExist`, then `Set`).
    fn start_slice(&self, unit: &str, properties: &[UnitProperty]) -> Result<(), CgroupError>;
    /// Changes the running slice's properties (`SetUnitProperties`, runtime).
    fn set_properties(&self, unit: &str, properties: &[UnitProperty]) -> Result<(), CgroupError>;
    /// Stops the slice and waits for it to go (a missing unit is fine), then
    /// resets its failed state (runc's `stopUnit` and `resetFailedUnit`).
    fn stop_slice(&self, unit: &str) -> Result<(), CgroupError>;
}

/// The slice unit of `name` and the slice it belongs to (upstream
/// `libctrCgroupConfig` for systemd: `Name` is the last element of the
/// expanded path, `Parent` the one before it, `-.slice` at the top).
pub fn unit_and_parent(name: &CgroupName) -> (String, String) {
    (name.to_systemd_slice(), name.parent().to_systemd_slice())
}

/// What runc's systemd managers send when they create a slice (`Apply`):
/// description, `Wants=` the parent slice, no default dependencies, the
/// accounting switches of the hierarchy, then the resource properties.
pub fn apply_properties(name: &CgroupName, rc: &ResourceConfig, v2: bool) -> Vec<UnitProperty> {
    let (unit, parent) = unit_and_parent(name);
    let mut out = vec![
        prop(
            "Description",
            PropertyValue::Str(format!("libcontainer container {unit}")),
        ),
        prop("Wants", PropertyValue::Strs(vec![parent])),
        prop("DefaultDependencies", PropertyValue::Bool(false)),
        prop("MemoryAccounting", PropertyValue::Bool(true)),
        prop("CPUAccounting", PropertyValue::Bool(true)),
        prop(
            if v2 {
                "IOAccounting"
            } else {
                "BlockIOAccounting"
            },
            PropertyValue::Bool(true),
        ),
        prop("TasksAccounting", PropertyValue::Bool(true)),
    ];
    out.extend(resource_properties(rc, v2));
    out
}

/// The resource properties of `rc` (runc's `genV2ResourcesProperties` and
/// `genV1ResourcesProperties`): on v2 `CPUWeight` (from the shares, as the
/// kubelet converts them), `MemoryMax`; on v1 `CPUShares`, `MemoryLimit`;
/// on both the CPU quota and period, and `TasksMax`. Huge page limits have
/// no systemd property: they are written to the files only.
pub fn resource_properties(rc: &ResourceConfig, v2: bool) -> Vec<UnitProperty> {
    let mut out = vec![];
    if let Some(m) = rc.memory.filter(|m| *m != 0) {
        out.push(prop(
            if v2 { "MemoryMax" } else { "MemoryLimit" },
            PropertyValue::U64(limit(m)),
        ));
    }
    if let Some(s) = rc.cpu_shares.filter(|s| *s != 0) {
        out.push(if v2 {
            prop("CPUWeight", PropertyValue::U64(cpu_shares_to_weight(s)))
        } else {
            prop("CPUShares", PropertyValue::U64(s))
        });
    }
    out.extend(cpu_quota_properties(
        rc.cpu_quota.unwrap_or(0),
        rc.cpu_period.unwrap_or(0),
    ));
    if let Some(p) = rc.pids_limit.filter(|p| *p > 0 || *p == -1) {
        out.push(prop("TasksMax", PropertyValue::U64(limit(p))));
    }
    out
}

/// runc's `addCpuQuota`: the period as is (systemd 242 and later), and the
/// quota as µs per CPU second, rounded up to whole percent because systemd
/// keeps it as a percentage (so the child's `cpu.max` still fits).
fn cpu_quota_properties(quota: i64, period: u64) -> Vec<UnitProperty> {
    let mut out = vec![];
    if period != 0 {
        out.push(prop("CPUQuotaPeriodUSec", PropertyValue::U64(period)));
    }
    if quota != 0 || period != 0 {
        let mut per_sec = INFINITY;
        if let Ok(q) = u64::try_from(quota)
            && q > 0
        {
            let period = if period == 0 {
                DEFAULT_CPU_QUOTA_PERIOD
            } else {
                period
            };
            per_sec = q.saturating_mul(1_000_000) / period;
            if !per_sec.is_multiple_of(10_000) {
                per_sec = (per_sec / 10_000 + 1) * 10_000;
            }
        }
        out.push(prop("CPUQuotaPerSecUSec", PropertyValue::U64(per_sec)));
    }
    out
}

/// The CFS quota as systemd keeps it (whole percent of a CPU, rounded up),
/// in µs per `period`: what the cgroup files get too, so that systemd
/// rewriting them (a `daemon-reload`) changes nothing (current
/// opencontainers/cgroups `addCPUQuota` does the same). Unlimited and zero
/// quotas are as given.
pub fn systemd_cpu_quota(quota: i64, period: u64) -> i64 {
    let Ok(q) = u64::try_from(quota) else {
        return quota;
    };
    if q == 0 {
        return quota;
    }
    let period = if period == 0 {
        DEFAULT_CPU_QUOTA_PERIOD
    } else {
        period
    };
    let per_sec = q.saturating_mul(1_000_000) / period;
    if per_sec.is_multiple_of(10_000) {
        return quota;
    }
    let per_sec = (per_sec / 10_000 + 1) * 10_000;
    i64::try_from(per_sec.saturating_mul(period) / 1_000_000).unwrap_or(quota)
}

/// `-1` (and any negative) is no limit.
fn limit(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(props: &[UnitProperty]) -> Vec<&str> {
        props.iter().map(|p| p.name).collect()
    }

    fn value<'a>(props: &'a [UnitProperty], name: &str) -> Option<&'a PropertyValue> {
        props.iter().find(|p| p.name == name).map(|p| &p.value)
    }

    #[test]
    fn units_and_parents_follow_the_expanded_slices() {
        let kubepods = CgroupName::root().child("kubepods");
        assert_eq!(
            unit_and_parent(&kubepods),
            ("kubepods.slice".into(), "-.slice".into())
        );
        let pod = kubepods.child("burstable").child("pod1234-ab");
        assert_eq!(
            unit_and_parent(&pod),
            (
                "kubepods-burstable-pod1234_ab.slice".into(),
                "kubepods-burstable.slice".into()
            )
        );
    }

    #[test]
    fn v2_burstable_pod_properties_are_runcs() {
        // A Burstable pod: 250m request, 500m limit over the 100ms period,
        // 64Mi limit, pids 1024.
        let rc = ResourceConfig {
            memory: Some(64 << 20),
            cpu_shares: Some(256),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            pids_limit: Some(1024),
            ..Default::default()
        };
        let name = CgroupName::root()
            .child("kubepods")
            .child("burstable")
            .child("poda");
        let p = apply_properties(&name, &rc, true);
        assert_eq!(
            names(&p),
            [
                "Description",
                "Wants",
                "DefaultDependencies",
                "MemoryAccounting",
                "CPUAccounting",
                "IOAccounting",
                "TasksAccounting",
                "MemoryMax",
                "CPUWeight",
                "CPUQuotaPeriodUSec",
                "CPUQuotaPerSecUSec",
                "TasksMax"
            ]
        );
        assert_eq!(
            value(&p, "Wants"),
            Some(&PropertyValue::Strs(vec![
                "kubepods-burstable.slice".into()
            ]))
        );
        assert_eq!(value(&p, "MemoryMax"), Some(&PropertyValue::U64(64 << 20)));
        // 1 + (256 - 2) * 9999 / 262142 = 10 (the kubelet's conversion).
        assert_eq!(value(&p, "CPUWeight"), Some(&PropertyValue::U64(10)));
        assert_eq!(
            value(&p, "CPUQuotaPerSecUSec"),
            Some(&PropertyValue::U64(500_000))
        );
        assert_eq!(value(&p, "TasksMax"), Some(&PropertyValue::U64(1024)));
    }

    #[test]
    fn quota_rounds_up_to_whole_percent_and_unlimited_is_infinity() {
        // 1m CPU: quota 1000µs of 100000 -> 10000µs per second (runc's minimum step).
        let p = cpu_quota_properties(1000, 100_000);
        assert_eq!(
            value(&p, "CPUQuotaPerSecUSec"),
            Some(&PropertyValue::U64(10_000))
        );
        // 1234m: 123400 per 100000 -> 1234000 -> rounded up to 1240000.
        let p = cpu_quota_properties(123_400, 100_000);
        assert_eq!(
            value(&p, "CPUQuotaPerSecUSec"),
            Some(&PropertyValue::U64(1_240_000))
        );
        // No limit with a period: infinity.
        let p = cpu_quota_properties(-1, 100_000);
        assert_eq!(
            value(&p, "CPUQuotaPerSecUSec"),
            Some(&PropertyValue::U64(INFINITY))
        );
        assert!(cpu_quota_properties(0, 0).is_empty());
        // 155m: 15500 µs per 100 ms is 15.5%, kept as 16%: the file gets 16000.
        assert_eq!(systemd_cpu_quota(15_500, 100_000), 16_000);
        assert_eq!(systemd_cpu_quota(20_000, 100_000), 20_000);
        assert_eq!(systemd_cpu_quota(-1, 100_000), -1);
        assert_eq!(systemd_cpu_quota(1000, 100_000), 1000);
        let rc = ResourceConfig {
            memory: Some(-1),
            pids_limit: Some(-1),
            ..Default::default()
        };
        let p = resource_properties(&rc, true);
        assert_eq!(value(&p, "MemoryMax"), Some(&PropertyValue::U64(INFINITY)));
        assert_eq!(value(&p, "TasksMax"), Some(&PropertyValue::U64(INFINITY)));
    }

    #[test]
    fn v1_uses_v1_property_names() {
        let rc = ResourceConfig {
            memory: Some(1 << 30),
            cpu_shares: Some(2),
            pids_limit: Some(0),
            ..Default::default()
        };
        let p = apply_properties(&CgroupName::root().child("kubepods"), &rc, false);
        assert_eq!(value(&p, "MemoryLimit"), Some(&PropertyValue::U64(1 << 30)));
        assert_eq!(value(&p, "CPUShares"), Some(&PropertyValue::U64(2)));
        assert_eq!(
            value(&p, "BlockIOAccounting"),
            Some(&PropertyValue::Bool(true))
        );
        assert!(value(&p, "TasksMax").is_none(), "pids 0 leaves it alone");
        assert!(value(&p, "CPUWeight").is_none());
    }
}
