//! Ordering pods for eviction (upstream `rankMemoryPressure`,
//! `rankPIDPressure`, `rankDiskPressureFunc` and their comparators): first
//! the pods whose usage exceeds their requests, then the lowest priority,
//! then the largest usage above requests. Pods without stats come first.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_types::pod;

use crate::api::{Resource, Signal};
use crate::stats::{FsUsage, PodStats};

/// Pod stats by UID (upstream `statsFunc`).
pub type StatsByUid<'a> = HashMap<&'a str, &'a PodStats>;

/// Which of a pod's filesystem usages count (upstream `fsStatsType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsMeasure {
    /// Writable layers.
    pub root: bool,
    /// Logs.
    pub logs: bool,
    /// Local volumes (emptyDir on disk, configMap, gitRepo, hostPath).
    pub local_volumes: bool,
}

impl FsMeasure {
    /// Everything (one filesystem for the node and images).
    pub const ALL: Self = Self {
        root: true,
        logs: true,
        local_volumes: true,
    };

    /// What a disk signal measures (upstream `buildSignalToRankFunc`).
    pub fn for_signal(signal: Signal, dedicated_imagefs: bool) -> Self {
        if !dedicated_imagefs {
            return Self::ALL;
        }
        match signal {
            Signal::ImageFsAvailable | Signal::ImageFsInodesFree => Self {
                root: true,
                logs: false,
                local_volumes: false,
            },
            _ => Self {
                root: false,
                logs: true,
                local_volumes: true,
            },
        }
    }
}

/// Upstream `PodPriority`.
pub fn priority(p: &Pod) -> i32 {
    p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pod's request of `resource` in its units (upstream
/// `GetResourceRequestQuantity`).
pub fn request(p: &Pod, resource: &str) -> i64 {
    kubelet_cm::helpers::pod_requests(p)
        .get(resource)
        .map_or(0, kubelet_types::quantity::Quantity::value)
}

/// Upstream `IsLocalEphemeralVolume` plus hostPath (`localVolumeNames`).
fn is_local(v: &Volume) -> bool {
    v.host_path.is_some()
        || v.git_repo.is_some()
        || v.config_map.is_some()
        || v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref().unwrap_or("").is_empty())
}

fn add(total: &mut (i64, i64), u: &FsUsage) {
    let to_i = |v: Option<u64>| i64::try_from(v.unwrap_or(0)).unwrap_or(i64::MAX);
    total.0 = total.0.saturating_add(to_i(u.used_bytes));
    total.1 = total.1.saturating_add(to_i(u.inodes_used));
}

/// Upstream `podDiskUsage`: (bytes, inodes).
pub fn disk_usage(p: &Pod, s: &PodStats, m: FsMeasure) -> (i64, i64) {
    let mut total = (0, 0);
    for c in &s.containers {
        if m.root {
            add(&mut total, &c.rootfs);
        }
        if m.logs {
            add(&mut total, &c.logs);
        }
    }
    if m.local_volumes {
        let volumes = p.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for v in volumes.into_iter().flatten().filter(|v| is_local(v)) {
            if let Some((_, u)) = s.volumes.iter().find(|(n, _)| *n == v.name) {
                add(&mut total, u);
            }
        }
    }
    total
}

fn memory_used(s: &PodStats) -> i64 {
    i64::try_from(s.memory_working_set.unwrap_or(0)).unwrap_or(i64::MAX)
}

/// (usage, request) of a pod.
type UsageFn = dyn Fn(&Pod, &PodStats) -> (i64, i64);

/// Orders `pods` for eviction under `signal`; the first is evicted first.
pub fn rank(
    signal: Signal,
    pods: &mut [Arc<Pod>],
    stats: &StatsByUid<'_>,
    dedicated_imagefs: bool,
) {
    let get = |p: &Pod| stats.get(pod::uid(p)).copied();
    // `usage(p, s)` is (usage, request) of the resource ranked on.
    let usage: Box<UsageFn> = match signal.resource() {
        Resource::Memory => Box::new(|p, s| (memory_used(s), request(p, "memory"))),
        Resource::Pids => Box::new(|_, s| {
            let n = i64::try_from(s.process_count.unwrap_or(0)).unwrap_or(i64::MAX);
            (n, 0)
        }),
        r @ (Resource::EphemeralStorage | Resource::Inodes) => {
            let m = FsMeasure::for_signal(signal, dedicated_imagefs);
            Box::new(move |p, s| {
                let (bytes, inodes) = disk_usage(p, s, m);
                let used = if r == Resource::Inodes { inodes } else { bytes };
                // Upstream compares inodes against the (absent) inodes
                // request and subtracts the ephemeral-storage request.
                let req = request(p, "ephemeral-storage");
                (used, req)
            })
        }
    };
    let exceeds = |p: &Pod, s: &PodStats| {
        let (u, r) = usage(p, s);
        if signal.resource() == Resource::Inodes {
            u > 0
        } else {
            u > r
        }
    };
    let above = |p: &Pod, s: &PodStats| {
        let (u, r) = usage(p, s);
        u.saturating_sub(r)
    };
    let pids = signal.resource() == Resource::Pids;
    pods.sort_by(|a, b| {
        let (sa, sb) = (get(a), get(b));
        let (sa, sb) = match (sa, sb) {
            (Some(x), Some(y)) => (x, y),
            // Without stats first.
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (None, None) => return priority(a).cmp(&priority(b)),
        };
        let by_exceeds = if pids {
            Ordering::Equal
        } else {
            exceeds(b, sb).cmp(&exceeds(a, sa))
        };
        by_exceeds
            .then_with(|| priority(a).cmp(&priority(b)))
            .then_with(|| above(b, sb).cmp(&above(a, sa)))
    });
}
