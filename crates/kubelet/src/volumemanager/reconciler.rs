//! The reconciler (upstream `volumemanager/reconciler`): every 100 ms, or
//! when woken, starts a set-up for each desired volume that is not set up
//! (or must be rewritten) and whose backoff has passed, and a tear-down for
//! each volume no longer desired; one operation per volume at a time
//! (upstream `nestedpendingoperations`). A tear-down first cleans the
//! volume's subPath mounts (upstream `CleanSubPaths` in `UnmountVolume`);
//! when that fails, the volume stays in the actual state and is retried
//! with backoff. Also the reconstruction of volumes (and subPath mounts)
//! found on disk after a restart (upstream `reconstruct`), and, every 2 s in
//! a task of its own (one pass at a time, never holding up the reconciler),
//! the removal of directories of pods nobody knows (upstream housekeeping's
//! `cleanupOrphanedPodDirs`). A directory that cannot be removed is a
//! warning once, then debug until the reason changes or it goes.
//!
//! When a pass finds the world settled (every pod wanted, every volume it
//! wants set up and nothing to rewrite, tear down or retry) the reconciler
//! sleeps until woken instead of every 100 ms: every change of the desired
//! state and every operation's end wakes it, so an idle node pays nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kubelet_types::events::reason::FAILED_MOUNT;
use kubelet_types::events::{EventType, pod_ref};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::ops::{OPERATION_TIMEOUT, SUBPATHS_ONLY};
use super::{INITIAL_BACKOFF, Inner, MAX_BACKOFF, PodEntry, VolumeState};

/// Upstream `reconcilerLoopSleepPeriod`.
const LOOP_PERIOD: Duration = Duration::from_millis(100);
/// Upstream `housekeepingPeriod`: how often orphaned pod directories are
/// looked for.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// A deadline on listing the pod directories.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// Adds the volume directories found on disk to the actual state, as
/// volumes of pods nobody wants yet.
pub(super) async fn reconstruct(inner: &Arc<Inner>) {
    let found = inner.ops.reconstruct(&inner.pods_dir).await;
    if found.is_empty() {
        return;
    }
    info!(volumes = found.len(), "Reconstructed volumes found on disk");
    let mut st = inner.state.lock();
    for d in found {
        let entry = st.pods.entry(d.uid.clone()).or_insert_with(|| PodEntry {
            pod: None,
            desired: false,
            terminated: false,
            remove_dir: false,
            removing: false,
            volumes: BTreeMap::new(),
            errors: BTreeMap::new(),
        });
        // A volume's own directory says more than its subPath mounts:
        // those are cleaned with its tear-down either way.
        if d.plugin == SUBPATHS_ONLY && entry.volumes.contains_key(&d.name) {
            continue;
        }
        let v = entry
            .volumes
            .entry(d.name)
            .or_insert_with(|| VolumeState::new(None, d.plugin));
        v.on_disk = Some(d.dir);
    }
}

/// Runs until shutdown.
pub(super) async fn run(inner: Arc<Inner>) {
    let housekeeping = inner.clone();
    inner
        .tracker
        .spawn(housekeeping_loop(housekeeping).instrument(info_span!("housekeeping")));
    loop {
        if reconcile(&inner) {
            // Settled: only a change (which always wakes) makes work.
            tokio::select! {
                () = inner.wake.notified() => {}
                () = inner.shutdown.cancelled() => return,
            }
        } else {
            tokio::select! {
                () = inner.wake.notified() => {}
                () = tokio::time::sleep(LOOP_PERIOD) => {}
                () = inner.shutdown.cancelled() => return,
            }
        }
    }
}

/// [`cleanup_orphaned_pod_dirs`] every [`HOUSEKEEPING_PERIOD`], one pass at
/// a time, until shutdown (which also cuts a pass short).
async fn housekeeping_loop(inner: Arc<Inner>) {
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = housekeeping.tick() => {}
            () = inner.shutdown.cancelled() => return,
        }
        tokio::select! {
            () = cleanup_orphaned_pod_dirs(&inner) => {}
            () = inner.shutdown.cancelled() => return,
        }
    }
}

/// Upstream `cleanupOrphanedPodDirs`: the directory of a pod the volume
/// manager does not know, that no source wants and whose containers are
/// gone, is removed (as far as [`crate::kubelet_volumes`] allows; a refusal
/// is retried at the next period). Pods with volumes still known are left
/// to their tear-down.
async fn cleanup_orphaned_pod_dirs(inner: &Arc<Inner>) {
    let uids =
        match tokio::time::timeout(LIST_TIMEOUT, inner.ops.list_pod_dirs(&inner.pods_dir)).await {
            Ok(Ok(uids)) => uids,
            Ok(Err(e)) => {
                warn!(error = %e, "Cannot list pod directories");
                return;
            }
            Err(_) => {
                warn!(timeout = ?LIST_TIMEOUT, "Listing pod directories timed out");
                return;
            }
        };
    let mut ops = Vec::new();
    {
        let mut st = inner.state.lock();
        st.refused_dirs.retain(|u, _| uids.contains(u));
        for uid in uids {
            if st.pods.contains_key(&uid) || !(inner.may_clean_orphan)(&uid) {
                continue;
            }
            debug!(pod.uid = %uid, "Orphaned pod found, removing its directory");
            // Marked while it runs: a pod back with this UID waits for it.
            st.pods.insert(
                uid.clone(),
                PodEntry {
                    pod: None,
                    desired: false,
                    terminated: false,
                    remove_dir: true,
                    removing: true,
                    volumes: BTreeMap::new(),
                    errors: BTreeMap::new(),
                },
            );
            ops.push(Op::RemoveDir(uid));
        }
    }
    for op in ops {
        spawn(inner, op);
    }
}

enum Op {
    SetUp(String, String),
    TearDown(String, String),
    RemoveDir(String),
}

/// Whether `e` needs nothing until the desired state changes or an
/// operation ends: wanted, and each volume set up as wanted (or, with no
/// spec, not mounted), none running, none to rewrite.
fn settled(e: &PodEntry) -> bool {
    !e.removing
        && e.desired
        && e.pod.is_some()
        && e.volumes.values().all(|v| {
            !v.in_flight
                && match v.spec {
                    Some(_) => v.mounted.is_some() && !v.remount,
                    None => v.mounted.is_none(),
                }
        })
}

/// One pass: decides the operations under the lock, starts them outside
/// it. True when the pass found everything [`settled`] (and so started
/// nothing): the next pass can wait for a wake-up.
fn reconcile(inner: &Arc<Inner>) -> bool {
    inner
        .passes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = Instant::now();
    let mut ops = Vec::new();
    let removed;
    {
        let mut st = inner.state.lock();
        if st.pods.values().all(settled) {
            return true;
        }
        let mut done = Vec::new();
        for (uid, e) in &mut st.pods {
            if e.removing {
                // Nothing starts under a directory being removed.
                continue;
            }
            let wanted = e.desired && e.pod.is_some();
            if !wanted && e.pod.is_none() && !e.remove_dir && (inner.may_clean_orphan)(uid) {
                e.remove_dir = true;
            }
            let tear_all = !wanted && (e.pod.is_some() || e.terminated || e.remove_dir);
            for (name, v) in &mut e.volumes {
                if v.in_flight {
                    continue;
                }
                let due = v.next_try.is_none_or(|t| t <= now);
                if wanted && v.spec.is_some() {
                    if (v.mounted.is_none() || v.remount) && due {
                        v.in_flight = true;
                        v.started = v.generation;
                        ops.push(Op::SetUp(uid.clone(), name.clone()));
                    }
                } else if (tear_all || (wanted && v.spec.is_none() && v.mounted.is_some()))
                    && (v.mounted.is_some() || v.on_disk.is_some())
                    && due
                {
                    v.in_flight = true;
                    v.tearing_down = true;
                    ops.push(Op::TearDown(uid.clone(), name.clone()));
                }
            }
            if tear_all {
                e.volumes
                    .retain(|_, v| v.in_flight || v.mounted.is_some() || v.on_disk.is_some());
                if e.volumes.is_empty() {
                    done.push((uid.clone(), e.remove_dir));
                }
            }
        }
        removed = !done.is_empty();
        for (uid, remove_dir) in done {
            if remove_dir {
                // Kept, marked, until the directory is gone (a pod with the
                // same UID waits for that).
                if let Some(e) = st.pods.get_mut(&uid) {
                    e.removing = true;
                }
                ops.push(Op::RemoveDir(uid));
            } else {
                st.pods.remove(&uid);
            }
        }
    }
    if removed {
        // Waiters for an unmount learn of it here, not from an operation.
        inner.changed.notify_waiters();
    }
    for op in ops {
        spawn(inner, op);
    }
    false
}

fn spawn(inner: &Arc<Inner>, op: Op) {
    let inner2 = inner.clone();
    let span = match &op {
        Op::SetUp(uid, name) | Op::TearDown(uid, name) => {
            info_span!("volume", pod.uid = %uid, volume = %name)
        }
        Op::RemoveDir(uid) => info_span!("volume", pod.uid = %uid),
    };
    inner.tracker.spawn(
        async move {
            let inner = inner2;
            tokio::select! {
                () = run_op(&inner, op) => {}
                () = inner.shutdown.cancelled() => return,
            }
            inner.changed.notify_waiters();
            inner.wake.notify_one();
        }
        .instrument(span),
    );
}

async fn run_op(inner: &Arc<Inner>, op: Op) {
    match op {
        Op::SetUp(uid, name) => set_up(inner, &uid, &name).await,
        Op::TearDown(uid, name) => tear_down(inner, &uid, &name).await,
        Op::RemoveDir(uid) => {
            let dir = inner.pods_dir.join(&uid);
            let result = inner.ops.remove_pod_dir(&dir).await;
            let mut st = inner.state.lock();
            match result {
                Ok(()) => {
                    st.refused_dirs.remove(&uid);
                    info!(dir = %dir.display(), "Removed the directory of a pod gone for good")
                }
                Err(e) => {
                    let e = e.to_string();
                    if st.refused_dirs.get(&uid) == Some(&e) {
                        debug!(error = %e, "Cannot remove pod directory; will retry at the next orphaned pod check");
                    } else {
                        warn!(error = %e, "Cannot remove pod directory; will retry at the next orphaned pod check");
                        st.refused_dirs.insert(uid.clone(), e);
                    }
                }
            }
            match st.pods.get_mut(&uid) {
                // The UID came back meanwhile: its volumes are set up anew.
                Some(e) if e.desired => {
                    e.removing = false;
                    e.remove_dir = false;
                }
                Some(_) => {
                    st.pods.remove(&uid);
                }
                None => {}
            }
        }
    }
}

async fn set_up(inner: &Arc<Inner>, uid: &str, name: &str) {
    let (pod, volume) = {
        let st = inner.state.lock();
        let Some(e) = st.pods.get(uid) else { return };
        let v = e.volumes.get(name).and_then(|v| v.spec.clone());
        match (e.pod.clone(), v) {
            (Some(p), Some(v)) if e.desired => (p, v),
            _ => {
                drop(st);
                finish(inner, uid, name, |v| v.in_flight = false);
                return;
            }
        }
    };
    let deadline = inner.ops.set_up_timeout(&volume);
    let result =
        tokio::time::timeout(deadline, inner.ops.set_up(&pod, &volume, &inner.pods_dir)).await;
    match result {
        Ok(Ok(mounted)) => {
            debug!(path = %mounted.host_path.display(), "MountVolume.SetUp succeeded");
            let dir = super::csi::volume_dir(&mounted);
            // A directory found on disk under another name (a local PV's is
            // named after the PV) is this volume's: it is not torn down.
            {
                let mut st = inner.state.lock();
                if let Some(e) = st.pods.get_mut(uid) {
                    e.volumes.retain(|n, v| {
                        n == name || v.spec.is_some() || v.on_disk.as_ref() != Some(&dir)
                    });
                }
            }
            finish(inner, uid, name, move |v| {
                v.on_disk = Some(dir);
                v.mounted = Some(mounted);
                // A change that came while this ran is written next.
                v.remount = v.generation != v.started;
                v.backoff = Duration::ZERO;
                v.next_try = None;
            });
        }
        // A CSI error is upstream's whole event text already.
        Ok(Err(kubelet_volume::Error::Plugin(e))) => {
            failed(inner, &pod, uid, name, Failure::Phased(e.to_string()))
        }
        Ok(Err(kubelet_volume::Error::Phased(message))) => {
            failed(inner, &pod, uid, name, Failure::Phased(message))
        }
        Ok(Err(e)) => failed(inner, &pod, uid, name, Failure::SetUp(e.to_string())),
        Err(_) => failed(
            inner,
            &pod,
            uid,
            name,
            Failure::SetUp(format!("timed out after {deadline:?}")),
        ),
    }
}

/// Why a set-up failed.
enum Failure {
    /// The plugin's error, to follow `MountVolume.SetUp failed for volume`.
    SetUp(String),
    /// The whole event text (a CSI phase names its own step and volume).
    Phased(String),
}

fn failed(
    inner: &Arc<Inner>,
    pod: &k8s_openapi::api::core::v1::Pod,
    uid: &str,
    name: &str,
    err: Failure,
) {
    let message = match err {
        Failure::SetUp(err) => format!("MountVolume.SetUp failed for volume {name:?} : {err}"),
        Failure::Phased(message) => message,
    };
    warn!(error = %message, "MountVolume failed");
    // What the failed set-up may have left (a staged device) is undone by
    // the volume's tear-down once the pod goes.
    let dir = inner.ops.set_up_dir(uid, name);
    inner.recorder.event(
        &pod_ref(pod, None),
        EventType::Warning,
        FAILED_MOUNT,
        message,
    );
    finish(inner, uid, name, |v| {
        if v.on_disk.is_none() {
            v.on_disk = dir;
        }
        v.backoff = if v.backoff.is_zero() {
            INITIAL_BACKOFF
        } else {
            (v.backoff * 2).min(MAX_BACKOFF)
        };
        v.next_try = Some(Instant::now() + v.backoff);
    });
}

async fn tear_down(inner: &Arc<Inner>, uid: &str, name: &str) {
    let (plugin, dir) = {
        let st = inner.state.lock();
        let Some(e) = st.pods.get(uid) else { return };
        let Some(v) = e.volumes.get(name) else {
            return;
        };
        let dir = v
            .on_disk
            .clone()
            .or_else(|| v.mounted.as_ref().map(super::csi::volume_dir));
        // A claim's plugin is known once it is set up (its bound PV's).
        (v.mounted.as_ref().map_or(v.plugin, |m| m.plugin), dir)
    };
    let timed_out = |deadline: Duration| {
        move |_| {
            Err(kubelet_volume::Error::Invalid(format!(
                "timed out after {deadline:?}"
            )))
        }
    };
    // Upstream `UnmountVolume`: the volume's subPath mounts go first; while
    // they cannot, the volume is not torn down (its directory, or the pod's,
    // removed under a bind mount would take the host's files with it).
    let cleaned = tokio::time::timeout(
        OPERATION_TIMEOUT,
        inner.ops.clean_subpaths(&inner.pods_dir, uid, name),
    )
    .await
    .unwrap_or_else(timed_out(OPERATION_TIMEOUT))
    .map_err(|e| {
        kubelet_volume::Error::Invalid(format!(
            "error cleaning subPath mounts for volume {name:?} pod {uid:?}: {e}"
        ))
    });
    let own_dirs = [
        inner.pods_dir.join(uid).join("volumes"),
        // Raw block volumes: the pod's device links.
        inner.pods_dir.join(uid).join("volumeDevices"),
    ];
    let result = match (cleaned, &dir) {
        (Err(e), _) => Err(e),
        // hostPath volumes (and subPath mounts found alone) have no
        // directory of their own to tear down; nothing outside the pod's
        // `volumes` (and `volumeDevices`) directory ever is.
        (Ok(()), Some(d))
            if plugin != kubelet_volume::plugin::names::HOST_PATH
                && plugin != SUBPATHS_ONLY
                && own_dirs.iter().any(|own| d.starts_with(own)) =>
        {
            let deadline = inner.ops.tear_down_timeout(plugin, d);
            tokio::time::timeout(deadline, inner.ops.tear_down(plugin, d))
                .await
                .unwrap_or_else(timed_out(deadline))
        }
        (Ok(()), _) => Ok(()),
    };
    match result {
        Ok(()) => {
            debug!("UnmountVolume.TearDown succeeded");
            let mut st = inner.state.lock();
            if let Some(e) = st.pods.get_mut(uid) {
                let again = e.desired && e.volumes.get(name).is_some_and(|v| v.spec.is_some());
                match e.volumes.get_mut(name) {
                    // The pod (same UID) came back while this ran: set it up anew.
                    Some(v) if again => {
                        v.mounted = None;
                        v.on_disk = None;
                        v.in_flight = false;
                        v.tearing_down = false;
                        v.next_try = None;
                    }
                    _ => {
                        e.volumes.remove(name);
                    }
                }
            }
        }
        Err(e) => {
            warn!(error = %e, "UnmountVolume.TearDown failed");
            finish(inner, uid, name, |v| {
                v.backoff = if v.backoff.is_zero() {
                    INITIAL_BACKOFF
                } else {
                    (v.backoff * 2).min(MAX_BACKOFF)
                };
                v.next_try = Some(Instant::now() + v.backoff);
            });
        }
    }
}

/// Updates the volume's state and clears its in-flight mark.
fn finish(inner: &Arc<Inner>, uid: &str, name: &str, f: impl FnOnce(&mut VolumeState)) {
    let mut st = inner.state.lock();
    if let Some(v) = st.pods.get_mut(uid).and_then(|e| e.volumes.get_mut(name)) {
        f(v);
        v.in_flight = false;
        v.tearing_down = false;
    }
}
