//! Node allocatable on the pods' cgroup (upstream
//! `cm/node_container_manager_linux.go`): `kubepods` gets cpu.shares of
//! the allocatable CPU, memory.limit of the allocatable memory and
//! pids.max of the allocatable PIDs, where allocatable is capacity minus
//! `kubeReserved` and `systemReserved` when `enforceNodeAllocatable` has
//! `pods`, and the whole capacity otherwise. As upstream, hard eviction
//! thresholds are not subtracted here: they are reserved from scheduling
//! (node status `allocatable`) and enforced by eviction, not by the cgroup.
//! (`system-reserved`/`kube-reserved` cgroup enforcement is not done.)

use std::collections::BTreeMap;

use kubelet_types::quantity::Quantity;

use crate::cgroup_manager::ResourceConfig;
use crate::helpers::{hugepage_limits, milli_cpu_to_shares};

/// The pods' top cgroup below `cgroupRoot` (upstream `defaultNodeAllocatableCgroupName`).
pub const NODE_ALLOCATABLE_CGROUP: &str = "kubepods";
/// `enforceNodeAllocatable` key for the pods' cgroup.
pub const ENFORCE_PODS: &str = "pods";
/// Resource name of process IDs in reservations (upstream `pidlimit.PIDs`).
pub const PIDS: &str = "pid";

/// Capacity minus reservations, never below zero (upstream
/// `getNodeAllocatableAbsoluteImpl`).
pub fn allocatable_absolute(
    capacity: &BTreeMap<String, Quantity>,
    system_reserved: &BTreeMap<String, Quantity>,
    kube_reserved: &BTreeMap<String, Quantity>,
) -> BTreeMap<String, Quantity> {
    capacity
        .iter()
        .map(|(k, v)| {
            let mut value = *v;
            for r in [system_reserved.get(k), kube_reserved.get(k)]
                .into_iter()
                .flatten()
            {
                value = value.saturating_sub(*r);
            }
            if value.signum() < 0 {
                value = Quantity::default();
            }
            (k.clone(), value)
        })
        .collect()
}

/// Cgroup settings for a resource list (upstream `getCgroupConfig`).
pub fn cgroup_config(rl: &BTreeMap<String, Quantity>) -> ResourceConfig {
    ResourceConfig {
        memory: rl.get("memory").map(Quantity::value),
        cpu_shares: rl.get("cpu").map(|q| milli_cpu_to_shares(q.milli_value())),
        pids_limit: rl.get(PIDS).map(Quantity::value),
        hugepage_limit: hugepage_limits(rl),
        ..Default::default()
    }
}

/// What `kubepods` gets (upstream `enforceNodeAllocatableCgroups`):
/// allocatable when `pods` is enforced with `cgroupsPerQOS`, else capacity.
pub fn node_allocatable_config(
    internal_capacity: &BTreeMap<String, Quantity>,
    system_reserved: &BTreeMap<String, Quantity>,
    kube_reserved: &BTreeMap<String, Quantity>,
    enforce: &[String],
    cgroups_per_qos: bool,
) -> ResourceConfig {
    if cgroups_per_qos && enforce.iter().any(|e| e == ENFORCE_PODS) {
        cgroup_config(&allocatable_absolute(
            internal_capacity,
            system_reserved,
            kube_reserved,
        ))
    } else {
        cgroup_config(internal_capacity)
    }
}

/// The host's PID limit: the smaller of `pid_max` and `threads-max`
/// (upstream `pidlimit.Stats`' `MaxPID`). Blocking IO.
pub fn host_max_pids(proc_sys_kernel: &std::path::Path) -> Option<i64> {
    let read = |f: &str| -> Option<i64> {
        std::fs::read_to_string(proc_sys_kernel.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    match (read("pid_max"), read("threads-max")) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).expect("quantity")))
            .collect()
    }

    /// Upstream `TestNodeAllocatableForEnforcement`: reservations come off,
    /// the hard eviction threshold does not.
    #[test]
    fn allocatable_is_capacity_minus_reservations() {
        let cap = list(&[("cpu", "10"), ("memory", "10Gi"), ("pid", "4194304")]);
        let kube = list(&[("cpu", "100m"), ("memory", "100Mi"), ("pid", "1000")]);
        let sys = list(&[("cpu", "50m"), ("memory", "50Mi")]);
        let rc = node_allocatable_config(&cap, &sys, &kube, &["pods".into()], true);
        assert_eq!(rc.memory, Some((10 << 30) - (150 << 20)), "10090Mi");
        assert_eq!(rc.cpu_shares, Some(milli_cpu_to_shares(9850)));
        assert_eq!(rc.pids_limit, Some(4_193_304));
        let whole = node_allocatable_config(&cap, &sys, &kube, &[], true);
        assert_eq!(whole.memory, Some(10 << 30), "not enforced: the capacity");
        let over = list(&[("memory", "20Gi")]);
        let rc = node_allocatable_config(&cap, &over, &kube, &["pods".into()], true);
        assert_eq!(rc.memory, Some(0), "never negative");
    }

    #[test]
    fn host_pid_limit_is_the_smaller_kernel_limit() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("pid_max"), "4194304\n").expect("write");
        assert_eq!(host_max_pids(d.path()), Some(4_194_304));
        std::fs::write(d.path().join("threads-max"), "63000\n").expect("write");
        assert_eq!(host_max_pids(d.path()), Some(63_000));
    }
}
