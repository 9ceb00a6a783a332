//! Swap against `failSwapOn`, as upstream's `validateSwapConfiguration`
//! (`pkg/kubelet/cm/container_manager_linux.go`): `/proc/swaps` with any line
//! past its header means swap is on, and with `failSwapOn` (the default) the
//! kubelet refuses to start. A missing `/proc/swaps` means no swap.
//!
//! With `failSwapOn: false` upstream starts and, by `memorySwap.swapBehavior`
//! (`NoSwap` by default since 1.30), keeps pods off swap (`memory.swap.max`
//! 0) or lets burstable pods use some (`LimitedSwap`). kubelet-rs sets no
//! swap limit on containers, so either way pods may swap: a warning.

use std::io::ErrorKind;
use std::path::Path;

use crate::finding::{Finding, Kind};
use crate::report::Report;

/// The settings that decide what swap means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    /// `failSwapOn` (`--fail-swap-on`), true by default.
    pub(crate) fail_swap_on: bool,
    /// `memorySwap.swapBehavior`, when set.
    pub(crate) swap_behavior: Option<String>,
}

/// The active swap areas in `/proc/swaps` text: every non-empty line after
/// the header.
fn swap_lines(text: &str) -> Vec<&str> {
    text.lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

/// Reads `proc_swaps` and reports swap against `policy`.
pub(crate) fn check(proc_swaps: &Path, policy: &Policy, report: &mut Report) {
    let text = match std::fs::read_to_string(proc_swaps) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            report.push(
                Finding::info(
                    Kind::Swap,
                    format!(
                        "{} does not exist, assuming that swap is disabled",
                        proc_swaps.display()
                    ),
                )
                .in_file(proc_swaps),
            );
            return;
        }
        Err(e) => {
            report.push(
                Finding::warning(
                    Kind::Swap,
                    format!("cannot read {}: {e}", proc_swaps.display()),
                )
                .in_file(proc_swaps),
            );
            return;
        }
    };
    let lines = swap_lines(&text);
    let field = "failSwapOn";
    if lines.is_empty() {
        report.push(Finding::info(Kind::Swap, "swap is off").field(field));
        return;
    }
    if policy.fail_swap_on {
        report.push(
            Finding::error(
                Kind::Swap,
                format!(
                    "running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false. {} contained: {lines:?}",
                    proc_swaps.display()
                ),
            )
            .in_file(proc_swaps)
            .field(field),
        );
        return;
    }
    let message = match policy.swap_behavior.as_deref() {
        Some("LimitedSwap") => format!(
            "swap is on ({} areas) and failSwapOn is false: memorySwap.swapBehavior LimitedSwap is not implemented by kubelet-rs, which sets no swap limit on containers, so every pod may use swap",
            lines.len()
        ),
        behavior => format!(
            "swap is on ({} areas) and failSwapOn is false: the kubelet starts, but kubelet-rs sets no swap limit on containers, so pods may use swap (upstream's {} keeps them off it)",
            lines.len(),
            behavior.unwrap_or("default NoSwap")
        ),
    };
    report.push(
        Finding::warning(Kind::Swap, message)
            .in_file(proc_swaps)
            .field("memorySwap.swapBehavior"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Severity;

    const HEADER: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
    const ON: &str = "/dev/dm-1                               partition       16760828        0               -2\n";

    fn run(contents: Option<&str>, fail_swap_on: bool, behavior: Option<&str>) -> Report {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("swaps");
        if let Some(c) = contents {
            std::fs::write(&path, c).expect("write");
        }
        let mut r = Report::default();
        let policy = Policy {
            fail_swap_on,
            swap_behavior: behavior.map(str::to_owned),
        };
        check(&path, &policy, &mut r);
        r
    }

    #[test]
    fn swap_on_with_fail_swap_on_is_upstreams_error() {
        let r = run(Some(&format!("{HEADER}{ON}")), true, None);
        assert_eq!(r.findings.len(), 1);
        let f = &r.findings[0];
        assert_eq!((f.kind, f.severity), (Kind::Swap, Severity::Error));
        assert!(
            f.message.starts_with(
                "running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false."
            ),
            "{}",
            f.message
        );
        assert!(f.message.contains("/dev/dm-1"), "{}", f.message);
        assert_eq!(f.field.as_deref(), Some("failSwapOn"));
    }

    #[test]
    fn a_header_alone_or_no_file_is_no_swap_for_either_setting() {
        for fail in [true, false] {
            for contents in [Some(HEADER), Some(""), None] {
                let r = run(contents, fail, None);
                assert_eq!(r.count(Severity::Error), 0, "{contents:?} {fail}");
                assert_eq!(r.count(Severity::Warning), 0, "{contents:?} {fail}");
                assert_eq!(r.findings.len(), 1);
            }
        }
    }

    #[test]
    fn swap_on_without_fail_swap_on_is_a_warning_naming_the_behavior() {
        let r = run(Some(&format!("{HEADER}{ON}")), false, None);
        assert_eq!(r.count(Severity::Error), 0);
        assert_eq!(r.count(Severity::Warning), 1);
        assert!(
            r.findings[0].message.contains("default NoSwap"),
            "{}",
            r.findings[0].message
        );
        let r = run(Some(&format!("{HEADER}{ON}")), false, Some("LimitedSwap"));
        assert!(
            r.findings[0]
                .message
                .contains("LimitedSwap is not implemented"),
            "{}",
            r.findings[0].message
        );
    }
}
