//! `kubelet-rs check`: what a kubelet start would use, checked offline before
//! an operator swaps kubelets, in the manner of kubeadm's preflight checks
//! (`cmd/kubeadm/app/preflight`: `SwapCheck`, `PortOpenCheck`,
//! `CRICheck`, `KubeletVersionCheck`) and of the kubelet's own start-up
//! validation (`cmd/kubelet/app/options`, `pkg/kubelet/apis/config/validation`,
//! the file source's `ValidatePodCreate` on static pods).
//!
//! `kubelet-rs check [-o text|json] [kubelet flags…]` takes the same flags as
//! a start, reports one finding per line (or one JSON document), and exits 1
//! when any finding is an error. It starts nothing and changes nothing.

mod args;
mod config;
mod finding;
mod host;
mod kubeconfig;
mod manifests;
mod report;
mod runtime;

use std::ffi::OsString;
use std::time::Duration;

pub use args::{CheckArgs, parse_args};
pub use finding::{Finding, Kind, Severity};
pub use report::{OutputFormat, Report};

/// What stops `kubelet-rs check` itself (not a finding about the node).
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// `-o` was given something other than `text` or `json`.
    #[error("unknown output format {0:?}: want text or json")]
    OutputFormat(String),
    /// An option was the last argument.
    #[error("flag needs an argument: {0}")]
    MissingValue(&'static str),
    /// `--ignore-preflight-errors` named no known kind.
    #[error("unknown finding kind {0:?} in --ignore-preflight-errors")]
    UnknownKind(String),
    /// The runtime for the CRI check could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// What `kubelet-rs check --help` prints.
pub const USAGE: &str = "\
Usage: kubelet-rs check [-o text|json] [--ignore-preflight-errors=KIND,...] [kubelet flags...]

Checks offline what a kubelet start with these flags would use: the flags,
the --config file, static pod manifests, the cgroup version, the CRI endpoint and its cgroup
driver, swap, kubeconfigs and certificates, and the ports it would bind.
Prints one finding per line (or one JSON document with -o json) and exits 1
when any finding is an error, 0 otherwise. Starts and changes nothing.

--ignore-preflight-errors turns the errors of the named kinds into warnings
(as kubeadm's flag of that name), e.g. =port while the kubelet being replaced
still holds its ports; kinds: flag, config, manifest, runtime, cgroup-driver, cgroups,
swap, kubeconfig, certificate, port, or all.
";

/// Whether `check`'s arguments ask for [`USAGE`] (`-h`, `--help`).
pub fn wants_help(args: &[OsString]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

/// How long the CRI endpoint may take to answer (kubeadm's `CRICheck` waits
/// as long as crictl's default timeout).
pub const RUNTIME_DEADLINE: Duration = Duration::from_secs(10);

/// Runs every check on the kubelet flags `flags` (without the program name).
/// The file checks run first on this thread; the CRI check runs on a
/// current-thread runtime with [`RUNTIME_DEADLINE`].
pub fn check(flags: &[OsString]) -> Result<Report, PreflightError> {
    let mut report = Report::default();
    let Some(cfg) = config::check(flags, &mut report) else {
        return Ok(report);
    };
    manifests::check(&cfg, &mut report);
    kubeconfig::check(&cfg, &mut report);
    host::check(&cfg, &mut report);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(runtime::check(&cfg, &mut report));
    Ok(report)
}
