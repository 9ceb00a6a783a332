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

mod config;
mod finding;
mod host;
mod kubeconfig;
mod manifests;
mod report;
mod runtime;

use std::ffi::OsString;
use std::time::Duration;

pub use finding::{Finding, Kind, Severity};
pub use report::{OutputFormat, Report};

/// What stops `kubelet-rs check` itself (not a finding about the node).
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// `-o` was given something other than `text` or `json`.
    #[error("unknown output format {0:?}: want text or json")]
    OutputFormat(String),
    /// `-o` was the last argument.
    #[error("flag needs an argument: -o")]
    MissingOutputFormat,
    /// The runtime for the CRI check could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// What `kubelet-rs check --help` prints.
pub const USAGE: &str = "\
Usage: kubelet-rs check [-o text|json] [kubelet flags...]

Checks offline what a kubelet start with these flags would use: the flags,
the --config file, static pod manifests, the CRI endpoint and its cgroup
driver, swap, kubeconfigs and certificates, and the ports it would bind.
Prints one finding per line (or one JSON document with -o json) and exits 1
when any finding is an error, 0 otherwise. Starts and changes nothing.
";

/// Whether `check`'s arguments ask for [`USAGE`] (`-h`, `--help`).
pub fn wants_help(args: &[OsString]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

/// How long the CRI endpoint may take to answer (kubeadm's `CRICheck` waits
/// as long as crictl's default timeout).
pub const RUNTIME_DEADLINE: Duration = Duration::from_secs(10);

/// Splits `check`'s own `-o`/`--output` from the kubelet flags. `args` are
/// what follows `check` on the command line.
pub fn split_args(args: &[OsString]) -> Result<(OutputFormat, Vec<OsString>), PreflightError> {
    let mut format = OutputFormat::Text;
    let mut rest = Vec::with_capacity(args.len());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        let value = match s.as_ref() {
            "-o" | "--output" => Some(
                it.next()
                    .ok_or(PreflightError::MissingOutputFormat)?
                    .to_string_lossy()
                    .into_owned(),
            ),
            _ => s
                .strip_prefix("-o=")
                .or_else(|| s.strip_prefix("--output="))
                .map(str::to_owned),
        };
        match value.as_deref() {
            None => rest.push(a.clone()),
            Some("text") => format = OutputFormat::Text,
            Some("json") => format = OutputFormat::Json,
            Some(other) => return Err(PreflightError::OutputFormat(other.to_owned())),
        }
    }
    Ok((format, rest))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn output_flag_in_every_spelling_is_taken_out_of_the_kubelet_flags() {
        for args in [
            &["-o", "json", "--max-pods=3"][..],
            &["--max-pods=3", "--output=json"][..],
            &["-o=json", "--max-pods=3"][..],
        ] {
            let (f, rest) = split_args(&os(args)).expect("parse");
            assert_eq!(f, OutputFormat::Json);
            assert_eq!(rest, os(&["--max-pods=3"]));
        }
        assert!(matches!(
            split_args(&os(&["-o", "yaml"])),
            Err(PreflightError::OutputFormat(_))
        ));
        assert!(wants_help(&os(&["--max-pods=3", "--help"])));
        assert!(!wants_help(&os(&["--max-pods=3"])));
        assert!(matches!(
            split_args(&os(&["-o"])),
            Err(PreflightError::MissingOutputFormat)
        ));
    }
}
