//! Flags and the `--config` file (owned by the config/manifest checks).

use std::ffi::OsString;

use kubelet_config::KubeletConfig;

use crate::report::Report;

/// Parses the flags and the config file; reports what is wrong and returns
/// the resolved configuration when a start would get that far.
pub(crate) fn check(_flags: &[OsString], _report: &mut Report) -> Option<KubeletConfig> {
    None
}
