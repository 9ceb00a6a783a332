//! One task per registration socket (upstream `reconciler.reconcile` with
//! `nestedpendingoperations`): the task owns the socket's registration, so
//! calls for one socket are serialized and a slow or silent plugin never
//! holds up another. It unregisters before registering again when the
//! socket was replaced, and retries a failed attempt with upstream's
//! exponential backoff (500 ms doubling to 2 min 2 s).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use crate::actual::ActualStateOfWorld;
use crate::client::CallTimeouts;
use crate::operation::{self, Handlers, RegisterContext, Registration};
use crate::scan::SocketIdentity;

/// First wait after a failed registration (upstream
/// `initialDurationBeforeRetry`).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between attempts (upstream `maxDurationBeforeRetry`).
pub const MAX_BACKOFF: Duration = Duration::from_secs(122);

/// What every socket task shares.
pub struct Shared {
    /// Handlers by plugin type.
    pub handlers: Handlers,
    /// Deadlines of the registration calls.
    pub timeouts: CallTimeouts,
    /// Deadline handed to the handlers' `register_plugin`.
    pub register_timeout: Duration,
    /// Registered plugins.
    pub actual: ActualStateOfWorld,
}

/// The wanted state of one socket: `Some` while the socket exists, with the
/// identity of the file now at the path.
pub type Desired = Option<SocketIdentity>;

/// Runs until the socket is gone and unregistered, the manager stops
/// (`desired` closed) or `cancel` fires. The manager starts a new task for
/// the path when this one has ended.
pub async fn run(
    socket: PathBuf,
    mut desired: watch::Receiver<Desired>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let mut current: Option<(SocketIdentity, Registration)> = None;
    // The identity last tried and failed, and when to try it again.
    let mut backoff = INITIAL_BACKOFF;
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let want = *desired.borrow_and_update();
        if let Some((id, _)) = &current
            && want != Some(*id)
            && let Some((_, registration)) = current.take()
        {
            if want.is_some() {
                info!(
                    "An updated version of plugin has been found, unregistering the plugin first before reregistering"
                );
            }
            operation::unregister(registration, &shared.actual).await;
        }
        let Some(id) = want else {
            return;
        };
        let due = retry_at.is_none_or(|at| at <= tokio::time::Instant::now());
        if current.is_none() && due {
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
            match attempt.registration {
                Some(registration) => {
                    current = Some((id, registration));
                    backoff = INITIAL_BACKOFF;
                    retry_at = None;
                    if let Some(e) = attempt.error {
                        error!(error = %e, "operationExecutor.RegisterPlugin failed");
                    }
                }
                None => {
                    if let Some(e) = attempt.error {
                        error!(error = %e, retry_in = ?backoff, "operationExecutor.RegisterPlugin failed");
                    }
                    retry_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
            // The socket may have changed while the calls ran.
            continue;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            changed = desired.changed() => {
                if changed.is_err() {
                    return;
                }
                if *desired.borrow() != Some(id) {
                    // A new socket at the path starts over.
                    backoff = INITIAL_BACKOFF;
                    retry_at = None;
                }
            }
            () = sleep_until(retry_at) => debug!("Retrying plugin registration"),
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
