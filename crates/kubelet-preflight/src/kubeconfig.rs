//! The kubeconfigs and the certificates they and the node API name.

use kubelet_config::KubeletConfig;

use crate::report::Report;

/// Reports unreadable kubeconfigs and invalid or expiring certificates.
pub(crate) fn check(_cfg: &KubeletConfig, _report: &mut Report) {}
