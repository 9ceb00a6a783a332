//! The host: the cgroup version against `failCgroupV1` ([`cgroups`]), swap against `failSwapOn` ([`swap`], upstream
//! `validateSwapConfiguration` in `pkg/kubelet/cm/container_manager_linux.go`,
//! kubeadm's `SwapCheck`) and the ports and sockets the kubelet listens on
//! ([`ports`], kubeadm's `PortOpenCheck`).

mod cgroups;
mod ports;
mod swap;

use std::path::Path;

use kubelet_config::{KubeletConfig, SettingValue};

use crate::report::Report;

/// Where the kernel lists active swap areas.
const PROC_SWAPS: &str = "/proc/swaps";

/// Reports swap and taken ports.
pub(crate) fn check(cfg: &KubeletConfig, report: &mut Report) {
    let policy = swap::Policy {
        fail_swap_on: match cfg.settings.get("failSwapOn") {
            Some(SettingValue::Bool(b)) => *b,
            _ => true,
        },
        swap_behavior: match cfg.settings.get("memorySwap.swapBehavior") {
            Some(SettingValue::String(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        },
    };
    let fail_cgroup_v1 = matches!(
        cfg.settings.get("failCgroupV1"),
        Some(SettingValue::Bool(true))
    );
    cgroups::check(Path::new("/sys/fs/cgroup"), fail_cgroup_v1, report);
    swap::check(Path::new(PROC_SWAPS), &policy, report);
    ports::check(cfg, report);
}
