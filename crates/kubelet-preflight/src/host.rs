//! The host: swap against `failSwapOn`, and the ports the kubelet listens on.

use kubelet_config::KubeletConfig;

use crate::report::Report;

/// Reports swap and taken ports.
pub(crate) fn check(_cfg: &KubeletConfig, _report: &mut Report) {}
