//! Logging setup: klog-style `--v` levels mapped onto tracing filters, and
//! the run-time verbosity change behind `/debug/flags/v` (upstream
//! `logs.GlogSetter`).

use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;

/// The tracing filter for a klog verbosity: 0-2 info, 3-4 debug, 5+ trace.
/// `RUST_LOG`, when set, wins.
pub fn filter_for(verbosity: u8) -> EnvFilter {
    if let Ok(f) = EnvFilter::try_from_default_env() {
        return f;
    }
    level_filter(verbosity)
}

fn level_filter(verbosity: u8) -> EnvFilter {
    let level = match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    // Dependencies stay at warn unless asked for trace.
    let deps = if verbosity >= 6 { "debug" } else { "warn" };
    EnvFilter::new(format!(
        "{deps},kubelet={level},kubelet_runtime={level},kubelet_config={level},kubelet_client={level},kubelet_node={level},kubelet_server={level},kubelet_podconfig={level},kubelet_metrics={level},cri={level},kubelet_types={level},kubelet_rs={level}"
    ))
}

type Handle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

static RELOAD: OnceLock<Handle> = OnceLock::new();

/// Installs the global subscriber (once per process; later calls are no-ops).
pub fn init(verbosity: u8) {
    let (filter, handle) = reload::Layer::new(filter_for(verbosity));
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init()
        .is_ok()
    {
        let _ = RELOAD.set(handle);
    }
}

/// Why a verbosity change was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerbosityError {
    /// Above klog's useful range.
    #[error("verbosity {0} is out of range 0 to 10")]
    OutOfRange(u8),
    /// [`init`] did not install the subscriber (tests, embedders).
    #[error("the log subscriber was not installed by kubelet-rs")]
    NotInstalled,
    /// The filter could not be swapped.
    #[error("reloading the log filter: {0}")]
    Reload(#[from] reload::Error),
}

/// Changes the verbosity of the subscriber [`init`] installed, as klog's `-v`.
pub fn set_verbosity(verbosity: u8) -> Result<(), VerbosityError> {
    if verbosity > 10 {
        return Err(VerbosityError::OutOfRange(verbosity));
    }
    let handle = RELOAD.get().ok_or(VerbosityError::NotInstalled)?;
    handle.reload(level_filter(verbosity))?;
    tracing::info!(verbosity, "Log verbosity changed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_as_klog_does() {
        assert!(level_filter(0).to_string().contains("kubelet=info"));
        assert!(level_filter(4).to_string().contains("kubelet=debug"));
        assert!(level_filter(6).to_string().contains("kubelet=trace"));
        assert!(matches!(
            set_verbosity(11),
            Err(VerbosityError::OutOfRange(11))
        ));
    }
}
