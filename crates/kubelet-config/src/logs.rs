//! Logging setup: klog-style `--v` levels mapped onto tracing filters.

use tracing_subscriber::EnvFilter;

/// The tracing filter for a klog verbosity: 0-2 info, 3-4 debug, 5+ trace.
/// `RUST_LOG`, when set, wins.
pub fn filter_for(verbosity: u8) -> EnvFilter {
    if let Ok(f) = EnvFilter::try_from_default_env() {
        return f;
    }
    let level = match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    // Dependencies stay at warn unless asked for trace.
    let deps = if verbosity >= 6 { "debug" } else { "warn" };
    EnvFilter::new(format!(
        "{deps},kubelet={level},kubelet_runtime={level},kubelet_config={level},kubelet_client={level},kubelet_node={level},kubelet_server={level},cri={level},kubelet_types={level},kubelet_rs={level}"
    ))
}

/// Installs the global subscriber (once per process; later calls are no-ops).
pub fn init(verbosity: u8) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter_for(verbosity))
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
