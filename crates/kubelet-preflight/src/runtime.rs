//! The CRI endpoint: reachable, its version, and its cgroup driver.

use kubelet_config::KubeletConfig;

use crate::report::Report;

/// Reports an unreachable runtime, its version, and a cgroup driver mismatch.
pub(crate) async fn check(_cfg: &KubeletConfig, _report: &mut Report) {}
