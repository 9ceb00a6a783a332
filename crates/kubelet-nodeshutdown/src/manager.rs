//! The node shutdown manager (upstream `managerImpl`): the start sequence
//! (logind's inhibit delay, raised through the drop-in when shorter than
//! the grace period; the delay lock; the `PrepareForShutdown` watch), the
//! watch loop, and the shutdown itself: pods killed group by group within
//! each group's share, then the lock released.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::error_chain;
use crate::groups::{self, PriorityGrace};
use crate::logind::{Connect, InhibitLock, Logind, Node, ShutdownEvents};

/// How long after a lost watch the manager connects again (upstream
/// `dbusReconnectPeriod`).
pub const DBUS_RECONNECT_PERIOD: Duration = Duration::from_secs(1);

/// The node shutdown manager.
pub struct Manager {
    ranges: Vec<PriorityGrace>,
    node: Arc<dyn Node>,
}

/// A started watch: the connection, the lock (none while a processed
/// shutdown goes on) and the signals.
struct Session {
    logind: Arc<dyn Logind>,
    lock: Option<InhibitLock>,
    events: ShutdownEvents,
}

impl Manager {
    /// A manager for `ranges` (see [`groups::effective`]); `None` when they
    /// are empty: graceful shutdown is off, as upstream's stub manager.
    pub fn new(ranges: Vec<PriorityGrace>, node: Arc<dyn Node>) -> Option<Self> {
        if ranges.is_empty() {
            info!("No graceful configuration specified, node shutdown will be immediate");
            return None;
        }
        let mut ranges = ranges;
        ranges.sort_by_key(|g| g.priority);
        info!(
            shutdown_grace_period_by_pod_priority = ?ranges,
            period_requested = ?groups::period_requested(&ranges),
            "Creating node shutdown manager"
        );
        Some(Self { ranges, node })
    }

    /// Upstream `Start` and its reconnect loop, until `stop`. A first start
    /// that fails is logged once and the kubelet goes on without graceful
    /// shutdown; a watch lost later is set up again every
    /// [`DBUS_RECONNECT_PERIOD`], its failures logged once until it works.
    pub async fn run(self, connect: Arc<dyn Connect>, stop: CancellationToken) {
        let first = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            r = self.start(connect.as_ref()) => r,
        };
        let mut session = match first {
            Ok(s) => s,
            Err(e) => {
                error!(error = %error_chain(&e), "Failed to start node shutdown manager");
                return;
            }
        };
        loop {
            if !self.watch(&mut session, &stop).await {
                return;
            }
            // The old lock stays until a new one is taken (upstream takes
            // the new lock, then releases the old).
            let old_lock = session.lock.take();
            drop(session);
            let mut logged = false;
            session = loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(DBUS_RECONNECT_PERIOD) => {}
                }
                info!("Restarting watch for node shutdown events");
                let r = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    r = self.start(connect.as_ref()) => r,
                };
                match r {
                    Ok(s) => break s,
                    Err(e) if !logged => {
                        error!(error = %error_chain(&e), "Unable to watch the node for shutdown events");
                        logged = true;
                    }
                    Err(_) => {}
                }
            };
            drop(old_lock);
        }
    }

    /// Upstream `start`: connects, makes sure logind waits long enough,
    /// takes the lock and watches the signal.
    async fn start(&self, connect: &dyn Connect) -> Result<Session, crate::Error> {
        let logind = connect.connect().await?;
        let current = logind.current_inhibit_delay().await?;
        let requested = groups::period_requested(&self.ranges);
        if requested > current {
            logind.override_inhibit_delay(requested).await?;
            logind.reload_logind_conf().await?;
            let updated = logind.current_inhibit_delay().await?;
            if requested > updated {
                // Upstream gives up here; logind still honours the lock for
                // as long as it allows, which is better than no grace at all.
                error!(
                    requested = ?requested,
                    current = ?updated,
                    "Node shutdown manager was unable to update logind InhibitDelayMaxSec to {requested:?} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({updated:?}) is less than requested ShutdownGracePeriod; pods get at most what logind allows"
                );
            } else {
                info!(inhibit_delay_max = ?updated, "Raised logind's InhibitDelayMaxSec");
            }
        }
        // Watch first, so that a signal sent while the lock is being taken
        // is not missed.
        let events = logind.monitor_shutdown().await?;
        let lock = logind.inhibit_shutdown().await?;
        info!(inhibit_delay_max = ?current.max(requested), "Node shutdown manager holds a delay inhibitor lock");
        Ok(Session {
            logind,
            lock: Some(lock),
            events,
        })
    }

    /// The watch loop; `false` once `stop` is cancelled, `true` when the
    /// signals end (the bus went away).
    async fn watch(&self, s: &mut Session, stop: &CancellationToken) -> bool {
        loop {
            let event = tokio::select! {
                biased;
                () = stop.cancelled() => return false,
                e = s.events.next() => e,
            };
            let Some(shutting_down) = event else {
                error!("Ended to watching the node for shutdown events");
                return true;
            };
            info!(
                event = if shutting_down {
                    "shutdown"
                } else {
                    "cancelled"
                },
                "Shutdown manager detected new shutdown event"
            );
            self.node.record_event(if shutting_down {
                crate::EVENT_SHUTDOWN
            } else {
                crate::EVENT_CANCELLED
            });
            self.node.set_shutting_down(shutting_down);
            if shutting_down {
                if !self.process_shutdown_event(stop).await {
                    return false;
                }
                s.lock = None;
                info!(
                    "Shutdown manager completed processing shutdown event, node will shutdown shortly"
                );
            } else {
                let taken = tokio::select! {
                    biased;
                    () = stop.cancelled() => return false,
                    r = s.logind.inhibit_shutdown() => r,
                };
                match taken {
                    // The new lock first, then the old one goes (if any).
                    Ok(lock) => s.lock = Some(lock),
                    Err(e) => {
                        warn!(error = %error_chain(&e), "Cannot take the inhibitor lock again")
                    }
                }
            }
        }
    }

    /// Upstream `processShutdownEvent`: each group of pods, lowest priority
    /// first, killed concurrently with the smaller of the pod's and the
    /// group's grace period, waited for at most the group's. `false` when
    /// `stop` cut it.
    async fn process_shutdown_event(&self, stop: &CancellationToken) -> bool {
        let pods = self.node.active_pods();
        info!(
            pods = pods.len(),
            "Shutdown manager processing shutdown event"
        );
        for group in groups::group_by_priority(&self.ranges, pods) {
            if group.pods.is_empty() {
                continue;
            }
            let share = group.range.grace_period_seconds.max(0);
            // Each kill is its own task: issued whatever the group's share
            // (even 0s), and going on in the background once the share is
            // over, as upstream's goroutines do.
            let mut kills = JoinSet::new();
            for p in group.pods {
                let node = self.node.clone();
                kills.spawn(async move {
                    let grace = p
                        .termination_grace_period_seconds
                        .filter(|g| *g <= share)
                        .unwrap_or(share)
                        .max(0);
                    info!(pod = %p.name, grace_period = grace, "Shutdown manager killing pod with gracePeriod");
                    match node.kill_pod(&p, grace).await {
                        Ok(()) => info!(pod = %p.name, "Shutdown manager finished killing pod"),
                        Err(e) => warn!(pod = %p.name, error = %error_chain(&e), "Shutdown manager failed killing pod"),
                    }
                });
            }
            let limit = Duration::from_secs(u64::try_from(share).unwrap_or(0));
            let all_done = async { while kills.join_next().await.is_some() {} };
            let stopped = tokio::select! {
                biased;
                () = stop.cancelled() => true,
                r = tokio::time::timeout(limit, all_done) => {
                    if r.is_err() {
                        warn!(grace_period = share, priority = group.range.priority, "Shutdown manager pod killing time out");
                    }
                    false
                }
            };
            // Kills still going on are left to finish.
            kills.detach_all();
            if stopped {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
