//! Evictions for local ephemeral storage limits (upstream
//! `localStorageEviction`, `emptyDirLimitEviction`,
//! `podEphemeralStorageLimitEviction`,
//! `containerEphemeralStorageLimitEviction`): a pod whose emptyDir is over
//! its `sizeLimit`, whose total usage is over the sum of its containers'
//! `ephemeral-storage` limits, or with a container over its own limit.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kubelet_types::pod;
use kubelet_types::quantity::Quantity;

use crate::manager::{IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS, Manager, used};
use crate::message::{container_ephemeral_message, empty_dir_message, pod_ephemeral_message};
use crate::rank::StatsByUid;
use crate::seams::Eviction;
use crate::stats::PodStats;

/// `kubelet_evictions` label of emptyDir evictions.
pub const SIGNAL_EMPTY_DIR_FS_LIMIT: &str = "emptydirfs.limit";
/// `kubelet_evictions` label of pod limit evictions.
pub const SIGNAL_EPHEMERAL_POD_FS_LIMIT: &str = "ephemeralpodfs.limit";
/// `kubelet_evictions` label of container limit evictions.
pub const SIGNAL_EPHEMERAL_CONTAINER_FS_LIMIT: &str = "ephemeralcontainerfs.limit";

/// Why a pod is over a local storage limit: (message, metric label).
pub fn violation(p: &Pod, s: &PodStats, dedicated_imagefs: bool) -> Option<(String, &'static str)> {
    let spec = p.spec.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v
            .empty_dir
            .as_ref()
            .and_then(|e| e.size_limit.as_ref())
            .and_then(|q| Quantity::from_api(q).ok())
        else {
            continue;
        };
        let Some((_, u)) = s.volumes.iter().find(|(n, _)| *n == v.name) else {
            continue;
        };
        if limit.signum() > 0 && u.used_bytes.is_some() && used(u.used_bytes) > limit.value() {
            return Some((
                empty_dir_message(&v.name, &limit),
                SIGNAL_EMPTY_DIR_FS_LIMIT,
            ));
        }
    }
    let limits = kubelet_cm::helpers::pod_limits(p, |_| {});
    if let Some(limit) = limits.get("ephemeral-storage")
        && used(s.ephemeral_used_bytes) > limit.value()
    {
        return Some((pod_ephemeral_message(limit), SIGNAL_EPHEMERAL_POD_FS_LIMIT));
    }
    for cs in &s.containers {
        let Some(limit) = spec
            .containers
            .iter()
            .find(|c| c.name == cs.name)
            .and_then(|c| {
                c.resources
                    .as_ref()?
                    .limits
                    .as_ref()?
                    .get("ephemeral-storage")
            })
            .and_then(|q| Quantity::from_api(q).ok())
            .filter(|q| q.value() != 0)
        else {
            continue;
        };
        let mut usage = used(cs.logs.used_bytes);
        if !dedicated_imagefs {
            usage = usage.saturating_add(used(cs.rootfs.used_bytes));
        }
        if usage > limit.value() {
            return Some((
                container_ephemeral_message(&cs.name, &limit),
                SIGNAL_EPHEMERAL_CONTAINER_FS_LIMIT,
            ));
        }
    }
    None
}

/// Evicts the first pod over a limit; upstream goes on through every pod,
/// but each kill waits for the pod, so one per pass keeps the loop short.
pub(crate) async fn evict(
    m: &Manager,
    pods: &[Arc<Pod>],
    stats: &StatsByUid<'_>,
    dedicated_imagefs: bool,
) -> Option<Arc<Pod>> {
    for p in pods {
        let Some(s) = stats.get(pod::uid(p)) else {
            continue;
        };
        let Some((message, label)) = violation(p, s, dedicated_imagefs) else {
            continue;
        };
        let e = Eviction {
            message,
            grace_period_seconds: IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS,
            disruption_target: false,
            annotations: Default::default(),
        };
        if m.evict_pod(p, e).await {
            m.metrics().evicted(label);
            return Some(p.clone());
        }
    }
    None
}
