//! Health checks as upstream's `healthz` package serves them: `/healthz`
//! aggregates the checks, `/healthz/<name>` serves one, `?verbose` lists each
//! and `?exclude=` skips one.
//!
//! Two sets, as upstream installs them:
//! - [`Checks::ping_only`] on the healthz port (10248): upstream
//!   `cmd/kubelet/app/server.go` calls `healthz.InstallHandler(mux)` with no
//!   checks, which serves `ping` alone;
//! - [`Checks::new`] (`ping`, `log`, `syncloop`) for the node API on 10250,
//!   upstream `Server.InstallDefaultHandlers`.
//!
//! The container runtime and the PLEG are checked by neither, as upstream:
//! their outages make the node NotReady, while a failing `/healthz` would make
//! watchdogs restart the kubelet during a containerd outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::HostInterface;

/// How often the log check flushes the log writer (upstream: every minute).
pub const LOG_FLUSH_PERIOD: Duration = Duration::from_secs(60);
/// The log check fails when no flush completed for this long (upstream: 2 minutes).
pub const LOG_BLOCKED_AFTER: Duration = Duration::from_secs(120);
/// The syncloop check tolerates at least this much (upstream: 5 minutes).
pub const MIN_SYNC_LOOP_STALL: Duration = Duration::from_secs(300);

/// Upstream `healthz.LogHealthz`: logging is blocked when flushing stderr has
/// not completed for [`LOG_BLOCKED_AFTER`].
#[derive(Debug)]
pub struct LogCheck {
    origin: Instant,
    last_flush_ms: AtomicU64,
}

impl Default for LogCheck {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_flush_ms: AtomicU64::new(0),
        }
    }
}

impl LogCheck {
    fn mark(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_flush_ms.store(ms, Ordering::Relaxed);
    }

    fn check(&self) -> Result<(), String> {
        let last = Duration::from_millis(self.last_flush_ms.load(Ordering::Relaxed));
        if self.origin.elapsed().saturating_sub(last) < LOG_BLOCKED_AFTER {
            Ok(())
        } else {
            Err("logging blocked".into())
        }
    }

    /// Flushes stderr every [`LOG_FLUSH_PERIOD`] off the async runtime, until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(LOG_FLUSH_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let flushed = tokio::task::spawn_blocking(|| {
                std::io::Write::flush(&mut std::io::stderr()).is_ok()
            });
            if matches!(flushed.await, Ok(true)) {
                self.mark();
            }
        }
    }
}

/// The named checks behind `/healthz`.
pub struct Checks {
    /// `None`: `ping` alone (the healthz port).
    host: Option<(Arc<dyn HostInterface>, Arc<LogCheck>)>,
}

/// Check names of the full set, in upstream's order.
pub const CHECKS: [&str; 3] = ["ping", "log", "syncloop"];

impl Checks {
    /// `ping`, `log` and `syncloop` over `host`, with `log` kept fresh by
    /// [`LogCheck::run`] (the node API's `/healthz`).
    pub fn new(host: Arc<dyn HostInterface>, log: Arc<LogCheck>) -> Self {
        Self {
            host: Some((host, log)),
        }
    }

    /// `ping` alone, as upstream serves the healthz port (10248).
    pub fn ping_only() -> Self {
        Self { host: None }
    }

    fn names(&self) -> &'static [&'static str] {
        match self.host {
            Some(_) => &CHECKS,
            None => &CHECKS[..1],
        }
    }

    /// Upstream `syncLoopHealthCheck`: the loop must have gone round within
    /// twice the resync interval, and at least 5 minutes.
    fn sync_loop(host: &dyn HostInterface) -> Result<(), String> {
        let allowed = (host.resync_interval() * 2).max(MIN_SYNC_LOOP_STALL);
        match host.latest_loop_entry_time() {
            Some(t) if t.elapsed() > allowed => Err(format!(
                "sync Loop took longer than expected: last iteration {:?} ago",
                t.elapsed()
            )),
            _ => Ok(()),
        }
    }

    /// Runs the check `name`; `None` for an unknown name.
    pub fn run(&self, name: &str) -> Option<Result<(), String>> {
        match (name, &self.host) {
            ("ping", _) => Some(Ok(())),
            ("log", Some((_, log))) => Some(log.check()),
            ("syncloop", Some((host, _))) => Some(Self::sync_loop(host.as_ref())),
            _ => None,
        }
    }

    /// `(status, body)` of `/healthz`, as upstream's handler renders it: `ok`,
    /// or with `verbose` (or on failure) one `[+]`/`[-]` line per check.
    /// Failure reasons are logged, not served ("reason withheld").
    pub fn aggregate(&self, verbose: bool, exclude: &[String]) -> (StatusCode, String) {
        let mut body = String::new();
        let mut failed = false;
        for name in self.names() {
            if exclude.iter().any(|e| e == name) {
                body.push_str(&format!("[+]{name} excluded: ok\n"));
                continue;
            }
            match self.run(name) {
                Some(Err(e)) => {
                    failed = true;
                    warn!(check = name, error = %e, "healthz check failed");
                    body.push_str(&format!("[-]{name} failed: reason withheld\n"));
                }
                _ => body.push_str(&format!("[+]{name} ok\n")),
            }
        }
        if failed {
            body.push_str("healthz check failed\n");
            (StatusCode::INTERNAL_SERVER_ERROR, body)
        } else if verbose {
            body.push_str("healthz check passed\n");
            (StatusCode::OK, body)
        } else {
            (StatusCode::OK, "ok".into())
        }
    }
}

fn query(raw: Option<String>) -> (bool, Vec<String>) {
    let pairs: Vec<(String, String)> = raw
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let verbose = pairs.iter().any(|(k, _)| k == "verbose");
    let exclude = pairs
        .into_iter()
        .filter(|(k, _)| k == "exclude")
        .map(|(_, v)| v)
        .collect();
    (verbose, exclude)
}

async fn all(State(c): State<Arc<Checks>>, RawQuery(q): RawQuery) -> (StatusCode, String) {
    let (verbose, exclude) = query(q);
    c.aggregate(verbose, &exclude)
}

async fn one(State(c): State<Arc<Checks>>, Path(name): Path<String>) -> (StatusCode, String) {
    match c.run(&name) {
        Some(Ok(())) => (StatusCode::OK, "ok".into()),
        Some(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {e}\n"),
        ),
        None => (StatusCode::NOT_FOUND, "404 page not found\n".into()),
    }
}

/// The healthz routes over `checks`.
pub fn router(checks: Arc<Checks>) -> Router {
    Router::new()
        .route("/healthz", get(all))
        .route("/healthz/{name}", get(one))
        .with_state(checks)
}

/// Serves `/healthz` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, checks: Arc<Checks>, stop: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "Serving healthz");
    }
    if let Err(e) = axum::serve(listener, router(checks))
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        warn!(error = %e, "healthz server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    struct FakeHost {
        resync: Duration,
        entered: Mutex<Option<Instant>>,
    }

    impl HostInterface for FakeHost {
        fn resync_interval(&self) -> Duration {
            self.resync
        }
        fn latest_loop_entry_time(&self) -> Option<Instant> {
            *self.entered.lock()
        }
    }

    fn checks(resync: Duration) -> (Arc<FakeHost>, Arc<Checks>) {
        let host = Arc::new(FakeHost {
            resync,
            entered: Mutex::new(Some(Instant::now())),
        });
        let c = Arc::new(Checks::new(host.clone(), Arc::new(LogCheck::default())));
        (host, c)
    }

    #[tokio::test(start_paused = true)]
    async fn healthy_is_ok_and_verbose_lists_every_check() {
        let (_, c) = checks(Duration::from_secs(60));
        assert_eq!(c.aggregate(false, &[]), (StatusCode::OK, "ok".to_string()));
        let (code, body) = c.aggregate(true, &[]);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n"
        );
    }

    /// Upstream's healthz port serves `ping` alone.
    #[tokio::test(start_paused = true)]
    async fn the_healthz_port_serves_ping_alone() {
        let c = Arc::new(Checks::ping_only());
        assert_eq!(c.aggregate(false, &[]), (StatusCode::OK, "ok".to_string()));
        assert_eq!(
            c.aggregate(true, &[]).1,
            "[+]ping ok\nhealthz check passed\n"
        );
        assert_eq!(
            one(State(c.clone()), Path("ping".into())).await.0,
            StatusCode::OK
        );
        for name in ["log", "syncloop"] {
            assert_eq!(
                one(State(c.clone()), Path(name.into())).await.0,
                StatusCode::NOT_FOUND
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_sync_loop_fails_healthz() {
        let (_, c) = checks(Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(299)).await;
        assert_eq!(c.run("syncloop"), Some(Ok(())), "5 minutes at least");
        tokio::time::advance(Duration::from_secs(2)).await;
        let (code, body) = c.aggregate(false, &[]);
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            body.contains("[-]syncloop failed: reason withheld\n"),
            "{body}"
        );
        assert!(body.ends_with("healthz check failed\n"), "{body}");
        let (code, body) = one(State(c.clone()), Path("syncloop".into())).await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            body.starts_with("internal server error: sync Loop took longer than expected"),
            "{body}"
        );
        assert_eq!(
            one(State(c.clone()), Path("ping".into())).await.0,
            StatusCode::OK
        );
        assert_eq!(
            one(State(c), Path("nope".into())).await.0,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_stall_limit_is_twice_a_long_resync() {
        let (host, c) = checks(Duration::from_secs(400));
        tokio::time::advance(Duration::from_secs(790)).await;
        assert_eq!(c.run("syncloop"), Some(Ok(())));
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(matches!(c.run("syncloop"), Some(Err(_))));
        assert_eq!(
            c.aggregate(false, &["syncloop".into(), "log".into()]).0,
            StatusCode::OK,
            "excluded checks do not fail /healthz"
        );
        *host.entered.lock() = None;
        assert_eq!(
            c.run("syncloop"),
            Some(Ok(())),
            "no iteration yet is not a stall"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn logging_blocked_for_two_minutes_fails_the_log_check() {
        let log = Arc::new(LogCheck::default());
        assert_eq!(log.check(), Ok(()));
        tokio::time::advance(LOG_BLOCKED_AFTER + Duration::from_secs(1)).await;
        assert_eq!(log.check(), Err("logging blocked".into()));
        log.mark();
        assert_eq!(log.check(), Ok(()));
    }
}
