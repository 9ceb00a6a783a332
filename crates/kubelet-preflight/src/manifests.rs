//! Static pod manifests under `staticPodPath`, validated as the file source would.

use kubelet_config::KubeletConfig;

use crate::report::Report;

/// Reports every manifest the file source would reject.
pub(crate) fn check(_cfg: &KubeletConfig, _report: &mut Report) {}
