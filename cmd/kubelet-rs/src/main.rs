//! kubelet-rs entry point: parse flags, resolve configuration, take the
//! `--lock-file`, start the kubelet (or, as `kubelet-rs check`, run the
//! preflight instead), stop it on SIGTERM/SIGINT or, with
//! `--exit-on-lock-contention`, when another kubelet opens the lock file
//! (containers keep running, as upstream).

use std::process::ExitCode;
use std::time::Duration;

use kubelet::App;
use kubelet_config::lockfile::StartupLock;
use kubelet_config::logs as logging;
use kubelet_config::{Flags, KubeletConfig, KubeletConfiguration, flag_warnings};
use tracing::{error, info, warn};

/// EX_USAGE: bad flags or configuration.
const EX_USAGE: u8 = 64;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn resolve(flags: &Flags) -> anyhow::Result<(KubeletConfig, Vec<String>)> {
    let (file, ignored) = match &flags.config {
        Some(path) => {
            let (f, ignored) = KubeletConfiguration::load(path)?;
            (Some(f), ignored)
        }
        None => (None, vec![]),
    };
    Ok((
        KubeletConfig::resolve(flags, file.as_ref(), &hostname())?,
        ignored,
    ))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => info!("Received SIGTERM"),
                _ = int.recv() => info!("Received SIGINT"),
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Upstream `run`: the lock comes first, then the kubelet; it runs until a
/// signal, a dead sync loop, or lock contention (which exits 0 so that the
/// contending kubelet takes over).
async fn run(cfg: KubeletConfig) -> ExitCode {
    let lock = tokio::select! {
        lock = StartupLock::take(cfg.lock_file.as_deref(), cfg.exit_on_lock_contention) => lock,
        () = shutdown_signal() => return ExitCode::SUCCESS,
    };
    let mut lock = match lock {
        Ok(l) => l,
        Err(e) => {
            error!(error = %e, "Failed to start kubelet");
            return ExitCode::FAILURE;
        }
    };
    let app = match App::build(cfg).await {
        Ok(app) => app,
        Err(e) => {
            error!(error = %e, "Failed to start kubelet");
            return ExitCode::FAILURE;
        }
    };
    let mut running = app.spawn();
    let code = tokio::select! {
        () = shutdown_signal() => ExitCode::SUCCESS,
        () = running.sync_loop_exited() => {
            error!("Sync loop exited unexpectedly");
            ExitCode::FAILURE
        }
        event = lock.contended() => {
            info!(%event, "Another process opened the lock file; exiting");
            ExitCode::SUCCESS
        }
    };
    running.shutdown(Duration::from_secs(10)).await;
    drop(lock);
    code
}

/// `kubelet-rs check [-o text|json] [kubelet flags…]`: the preflight, which
/// starts nothing (see `kubelet_preflight`).
fn check(args: &[std::ffi::OsString]) -> ExitCode {
    if kubelet_preflight::wants_help(args) {
        print!("{}", kubelet_preflight::USAGE);
        return ExitCode::SUCCESS;
    }
    let args = match kubelet_preflight::parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kubelet-rs check: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    match kubelet_preflight::check(&args.flags) {
        Ok(mut report) => {
            report.ignore(&args.ignore);
            print!("{}", report.render(args.format));
            ExitCode::from(report.exit_code())
        }
        Err(e) => {
            eprintln!("kubelet-rs check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "check") {
        return check(&args[2..]);
    }
    let flags = Flags::parse_args(args).unwrap_or_else(|e| e.exit());
    if flags.version.prints() {
        // kubeadm matches `^Kubernetes v<semver>([-0-9a-zA-Z_.+]*)?$`: our own version rides as build metadata.
        println!(
            "Kubernetes {}+kubelet-rs.{}",
            kubelet_types::KUBERNETES_VERSION,
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    let (cfg, ignored) = match resolve(&flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kubelet-rs: invalid configuration: {e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    logging::init(cfg.verbosity, cfg.logging_format);
    for field in ignored {
        warn!(%field, "Unknown field in the config file; ignored");
    }
    for w in flag_warnings(&flags) {
        warn!(flag = w.flag, value = %w.value, "{w}");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    // File IO runs on the blocking pool. A pod start burst would otherwise
    // grow it by a thread (and its malloc arena) per concurrent read: 4 MiB
    // more RSS with 30 pods. Four threads keep reads short and memory flat.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubelet-rs: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(run(cfg));
    // A kubelet still waiting for the lock has a thread blocked in flock.
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}
