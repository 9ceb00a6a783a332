//! Graceful termination (upstream `kuberuntime_container.go`
//! `killContainer`, `executePreStopHook`, `setTerminationGracePeriod`,
//! `killContainersWithSyncResult` and `terminationOrdering`): the `Killing`
//! event, the preStop hook within the grace period, sidecars stopped after
//! the app containers and in reverse order, then CRI `StopContainer` with
//! what is left of the grace period (the runtime sends SIGTERM, then SIGKILL).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_types::events::{EventType, pod_ref, reason};
use kubelet_types::pod::{self, MIN_GRACE_PERIOD, is_restartable_init_container};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{KubeRuntimeManager, status_ref};
use crate::Result;
use crate::actions::KillReason;
use crate::pod_status::PodStatus;

/// The grace period for stopping `c` of `p` (upstream
/// `setTerminationGracePeriod`): the deletion grace period when the pod is
/// being deleted, else a failed probe's own `terminationGracePeriodSeconds`
/// when the kill is for that probe, else the pod's
/// `terminationGracePeriodSeconds` (30 s when unset, as the apiserver
/// defaults it). Not floored: the floor applies after the preStop hook.
pub fn termination_grace_period(p: &Pod, c: Option<&Container>, why: KillReason) -> Duration {
    let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
    if let Some(d) = p.metadata.deletion_grace_period_seconds {
        return secs(d);
    }
    let probe = match why {
        KillReason::LivenessProbe => c.and_then(|c| c.liveness_probe.as_ref()),
        KillReason::StartupProbe => c.and_then(|c| c.startup_probe.as_ref()),
        _ => None,
    };
    if let Some(g) = probe.and_then(|p| p.termination_grace_period_seconds) {
        return secs(g);
    }
    secs(
        p.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(pod::DEFAULT_GRACE_PERIOD_SECONDS),
    )
}

/// Upstream `terminationOrdering`: each sidecar waits for every app container
/// and every later sidecar that is running to stop first.
pub(super) struct TerminationOrdering {
    prereqs: HashMap<String, Vec<String>>,
    terminated: watch::Sender<HashSet<String>>,
}

impl TerminationOrdering {
    /// The ordering for `p`'s containers, `running` being those still up.
    pub(super) fn new(p: &Pod, running: &[&str]) -> Self {
        let is_running = |n: &str| running.contains(&n);
        let mut done: HashSet<String> = HashSet::new();
        let mains: Vec<String> = pod::containers(p).iter().map(|c| c.name.clone()).collect();
        for m in &mains {
            if !is_running(m) {
                done.insert(m.clone());
            }
        }
        let mut prereqs = HashMap::new();
        let mut later_sidecar: Option<String> = None;
        for ic in pod::init_containers(p).iter().rev() {
            if !is_running(&ic.name) {
                done.insert(ic.name.clone());
            }
            if is_restartable_init_container(ic) {
                let mut waits = mains.clone();
                waits.extend(later_sidecar.clone());
                prereqs.insert(ic.name.clone(), waits);
                later_sidecar = Some(ic.name.clone());
            }
        }
        Self {
            prereqs,
            terminated: watch::Sender::new(done),
        }
    }

    /// Waits, at most `limit`, until every container `name` waits for has
    /// stopped; returns how long it waited.
    pub(super) async fn wait_for_turn(&self, name: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        let Some(waits) = self.prereqs.get(name) else {
            return Duration::ZERO;
        };
        let mut rx = self.terminated.subscribe();
        let all_done = rx.wait_for(|done| waits.iter().all(|w| done.contains(w)));
        if tokio::time::timeout(limit, all_done).await.is_err() {
            debug!(
                container = name,
                ?limit,
                "Sidecar stops without waiting longer"
            );
        }
        start.elapsed()
    }

    /// Marks `name` stopped.
    pub(super) fn container_terminated(&self, name: &str) {
        self.terminated.send_modify(|d| {
            d.insert(name.to_string());
        });
    }
}

/// One container to stop.
pub(super) struct Kill<'a> {
    /// The pod, when known: its spec gives the grace period and the preStop hook.
    pub pod: Option<&'a Pod>,
    /// Runtime ID.
    pub id: &'a str,
    /// Container name.
    pub name: &'a str,
    /// The `Killing` event message; `Stopping container <name>` when empty.
    pub message: String,
    /// Why, for the grace period.
    pub reason: KillReason,
    /// The grace period to start from; `None` takes it from the pod
    /// ([`termination_grace_period`]), or 2 s without one.
    pub grace: Option<Duration>,
    /// A grace period that wins over every other (upstream `gracePeriodOverride`).
    pub grace_override: Option<Duration>,
}

fn container_spec<'a>(p: &'a Pod, name: &str) -> Option<&'a Container> {
    pod::containers(p)
        .iter()
        .chain(pod::init_containers(p))
        .find(|c| c.name == name)
}

impl KubeRuntimeManager {
    /// Upstream `killContainer`: records `Killing`, runs the preStop hook
    /// within the grace period and subtracts its time, waits for its turn
    /// (sidecars), and stops the container with what is left (at least 2 s;
    /// an override wins).
    pub(super) async fn kill_container(
        &self,
        k: Kill<'_>,
        status: &PodStatus,
        ordering: Option<&TerminationOrdering>,
    ) -> Result<()> {
        let spec = k.pod.and_then(|p| container_spec(p, k.name));
        let mut grace = k
            .grace
            .or_else(|| k.pod.map(|p| termination_grace_period(p, spec, k.reason)))
            .unwrap_or(MIN_GRACE_PERIOD);
        let message = if k.message.is_empty() {
            format!("Stopping container {}", k.name)
        } else {
            k.message
        };
        let obj = match k.pod {
            Some(p) => pod_ref(p, Some(k.name)),
            None => status_ref(status, Some(k.name)),
        };
        self.recorder
            .event(&obj, EventType::Normal, reason::KILLING, message);
        if let (Some(p), Some(c)) = (k.pod, spec)
            && let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && !grace.is_zero()
        {
            let start = Instant::now();
            debug!(container = k.name, ?grace, "Running preStop hook");
            let run = self.runner.run(k.id, p, c, hook, &status.ips, grace).await;
            if let Ok(fallback) = run {
                self.record_http_fallback(&pod_ref(p, None), fallback);
            } else if let Err(e) = run {
                warn!(container = k.name, error = %e, "PreStop hook failed");
                // No message in the event: it could leak secrets (as upstream).
                self.recorder.event(
                    &obj,
                    EventType::Warning,
                    reason::FAILED_PRE_STOP_HOOK,
                    "PreStopHook failed".into(),
                );
            }
            // Whole seconds, as upstream.
            grace = grace.saturating_sub(Duration::from_secs(start.elapsed().as_secs()));
        }
        if let Some(o) = ordering
            && !grace.is_zero()
        {
            let waited = o.wait_for_turn(k.name, grace).await;
            grace = grace.saturating_sub(Duration::from_secs(waited.as_secs()));
        }
        grace = grace.max(MIN_GRACE_PERIOD);
        if let Some(g) = k.grace_override {
            grace = g;
        }
        info!(
            container = k.name,
            container.id = k.id,
            ?grace,
            "Killing container with a grace period"
        );
        self.stop_container(k.id, grace).await?;
        if let Some(o) = ordering {
            o.container_terminated(k.name);
        }
        Ok(())
    }

    /// Records upstream's `LifecycleHTTPFallback` warning on the pod when an
    /// HTTPS hook succeeded only over HTTP.
    pub(super) fn record_http_fallback(
        &self,
        obj: &k8s_openapi::api::core::v1::ObjectReference,
        fallback: crate::lifecycle_handler::HookOutcome,
    ) {
        if let Some(message) = fallback {
            self.recorder.event(
                obj,
                EventType::Warning,
                reason::LIFECYCLE_HTTP_FALLBACK,
                message,
            );
        }
    }

    /// Upstream `killContainersWithSyncResult`: stops every live container of
    /// the pod in parallel, sidecars after the app containers.
    pub(super) async fn kill_containers(
        &self,
        p: Option<&Pod>,
        status: &PodStatus,
        grace: Option<Duration>,
        grace_override: Option<Duration>,
    ) -> Result<()> {
        let live: Vec<_> = status.live_containers().collect();
        let names: Vec<&str> = live.iter().map(|c| c.name.as_str()).collect();
        let ordering = p
            .filter(|p| pod::has_restartable_init_container(p))
            .map(|p| TerminationOrdering::new(p, &names));
        let kills = live.iter().map(|c| {
            self.kill_container(
                Kill {
                    pod: p,
                    id: &c.id,
                    name: &c.name,
                    message: String::new(),
                    reason: KillReason::Unknown,
                    grace,
                    grace_override,
                },
                status,
                ordering.as_ref(),
            )
        });
        let mut first = Ok(());
        for r in join_all(kills).await {
            if let Err(e) = r
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}
