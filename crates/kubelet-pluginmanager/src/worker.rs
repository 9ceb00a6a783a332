//! One task per registration socket (upstream `reconciler.reconcile` with
//! `nestedpendingoperations`, and `pluginwatcher`'s connection monitor):
//! the task owns the socket's registration, so calls for one socket are
//! serialized and a slow or silent plugin never holds up another. It
//! unregisters before registering again when the socket was replaced, and
//! retries a failed attempt with upstream's exponential backoff (500 ms
//! doubling to 2 min 2 s). While registered, the plugin is asked `GetInfo`
//! every check interval; after `max_failures` failures in a row it is
//! unregistered, and registered again once it answers (a plugin that hung
//! and recovered on the same socket produces no inotify event).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::actual::ActualStateOfWorld;
use crate::client::{CallTimeouts, PluginClient};
use crate::operation::{self, Handlers, RegisterContext, Registration};
use crate::scan::SocketIdentity;

/// First wait after a failed registration (upstream
/// `initialDurationBeforeRetry`).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between attempts (upstream `maxDurationBeforeRetry`).
pub const MAX_BACKOFF: Duration = Duration::from_secs(122);

/// The connection monitor's settings (upstream `connectionCheckInterval`,
/// `maxFailures`).
#[derive(Debug, Clone, Copy)]
pub struct MonitorConfig {
    /// Time between two `GetInfo` checks of a registered plugin; zero turns
    /// the monitor off.
    pub interval: Duration,
    /// Failed checks in a row after which the plugin is unregistered.
    pub max_failures: u32,
}

/// What every socket task shares.
pub struct Shared {
    /// Handlers by plugin type.
    pub handlers: Handlers,
    /// Deadlines of the registration calls.
    pub timeouts: CallTimeouts,
    /// Deadline handed to the handlers' `register_plugin`.
    pub register_timeout: Duration,
    /// The connection monitor.
    pub monitor: MonitorConfig,
    /// Registered plugins.
    pub actual: ActualStateOfWorld,
}

/// The wanted state of one socket: `Some` while the socket exists, with the
/// identity of the file now at the path.
pub type Desired = Option<SocketIdentity>;

/// Where one socket stands.
enum State {
    /// Not registered; the next attempt is due at `retry_at` (now if none).
    Unregistered { retry_at: Option<Instant> },
    /// Registered with its handler (or refused by it, which upstream does
    /// not retry either), checked every monitor interval.
    Registered {
        id: SocketIdentity,
        registration: Registration,
        failures: u32,
    },
    /// Unregistered by the monitor: registered again once a check passes.
    Dead,
}

/// Runs until the socket is gone and unregistered, the manager stops
/// (`desired` closed) or `cancel` fires. The manager starts a new task for
/// the path when this one has ended.
pub async fn run(
    socket: PathBuf,
    mut desired: watch::Receiver<Desired>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let mut state = State::Unregistered { retry_at: None };
    let mut backoff = INITIAL_BACKOFF;
    let mut check_at: Option<Instant> = None;
    let mut seen = *desired.borrow();
    loop {
        let want = *desired.borrow_and_update();
        if want != seen {
            // A new socket at the path (or none) starts over.
            seen = want;
            backoff = INITIAL_BACKOFF;
            if let State::Registered { id, .. } = &state
                && want != Some(*id)
            {
                if want.is_some() {
                    info!(
                        "An updated version of plugin has been found, unregistering the plugin first before reregistering"
                    );
                }
                unregister(&mut state, &shared.actual).await;
            }
            state = match state {
                registered @ State::Registered { .. } => registered,
                _ => State::Unregistered { retry_at: None },
            };
        }
        let Some(id) = want else {
            return;
        };
        if let State::Unregistered { retry_at } = &state
            && retry_at.is_none_or(|at| at <= Instant::now())
        {
            let cx = RegisterContext {
                handlers: &shared.handlers,
                timeouts: shared.timeouts,
                register_timeout: shared.register_timeout,
                actual: &shared.actual,
            };
            let attempt = tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                attempt = operation::register(&socket, &cx) => attempt,
            };
            state = match attempt.registration {
                Some(registration) => {
                    if let Some(e) = attempt.error {
                        error!(error = %e, "operationExecutor.RegisterPlugin failed");
                    }
                    backoff = INITIAL_BACKOFF;
                    check_at = next_check(&shared.monitor);
                    State::Registered {
                        id,
                        registration,
                        failures: 0,
                    }
                }
                None => {
                    if let Some(e) = attempt.error {
                        error!(error = %e, retry_in = ?backoff, "operationExecutor.RegisterPlugin failed");
                    }
                    let retry_at = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    State::Unregistered {
                        retry_at: Some(retry_at),
                    }
                }
            };
            // The socket may have changed while the calls ran.
            continue;
        }
        let retry_at = match &state {
            State::Unregistered { retry_at } => *retry_at,
            _ => None,
        };
        let checking = match &state {
            State::Unregistered { .. } => None,
            _ => check_at,
        };
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            changed = desired.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = sleep_until(retry_at) => debug!("Retrying plugin registration"),
            () = sleep_until(checking) => {
                let answered = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    r = PluginClient::check(&socket, shared.timeouts) => r,
                };
                check_at = next_check(&shared.monitor);
                monitor(&mut state, answered, &shared).await;
            }
        }
    }
}

/// Applies one connection check's result.
async fn monitor(state: &mut State, answered: Result<(), crate::Error>, shared: &Shared) {
    match (answered, &mut *state) {
        (Ok(()), State::Registered { failures, .. }) => *failures = 0,
        (Ok(()), State::Dead) => {
            info!("Plugin answers again; registering it");
            *state = State::Unregistered { retry_at: None };
        }
        (Err(error), State::Registered { failures, .. }) => {
            *failures += 1;
            warn!(%error, failures = *failures, "Plugin connection check failed");
            if *failures >= shared.monitor.max_failures {
                error!(%error, max_failures = shared.monitor.max_failures, "Failure threshold reached, unregistering the plugin");
                unregister(state, &shared.actual).await;
                *state = State::Dead;
            }
        }
        (Err(error), _) => debug!(%error, "Plugin still does not answer"),
        (Ok(()), State::Unregistered { .. }) => {}
    }
}

async fn unregister(state: &mut State, actual: &ActualStateOfWorld) {
    let previous = std::mem::replace(state, State::Unregistered { retry_at: None });
    if let State::Registered { registration, .. } = previous {
        operation::unregister(registration, actual).await;
    }
}

fn next_check(monitor: &MonitorConfig) -> Option<Instant> {
    (!monitor.interval.is_zero()).then(|| Instant::now() + monitor.interval)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
