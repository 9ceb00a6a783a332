//! The reconciler (upstream `volumemanager/reconciler`): every 100 ms, or
//! when woken, starts a set-up for each desired volume that is not set up
//! (or must be rewritten) and whose backoff has passed, and a tear-down for
//! each volume no longer desired; one operation per volume at a time
//! (upstream `nestedpendingoperations`). Also the reconstruction of volumes
//! found on disk after a restart (upstream `reconstruct`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kubelet_types::events::reason::FAILED_MOUNT;
use kubelet_types::events::{EventType, pod_ref};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{INITIAL_BACKOFF, Inner, MAX_BACKOFF, PodEntry, VolumeState};

/// Upstream `reconcilerLoopSleepPeriod`.
const LOOP_PERIOD: Duration = Duration::from_millis(100);
/// A deadline on each operation (the plugins bound their own API calls).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

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
            remove_dir: false,
            removing: false,
            volumes: BTreeMap::new(),
            errors: BTreeMap::new(),
        });
        let v = entry
            .volumes
            .entry(d.name)
            .or_insert_with(|| VolumeState::new(None, d.plugin));
        v.on_disk = Some(d.dir);
    }
}

/// Runs until shutdown.
pub(super) async fn run(inner: Arc<Inner>) {
    loop {
        reconcile(&inner);
        tokio::select! {
            () = inner.wake.notified() => {}
            () = tokio::time::sleep(LOOP_PERIOD) => {}
            () = inner.shutdown.cancelled() => return,
        }
    }
}

enum Op {
    SetUp(String, String),
    TearDown(String, String),
    RemoveDir(String),
}

/// One pass: decides the operations under the lock, starts them outside it.
fn reconcile(inner: &Arc<Inner>) {
    let now = Instant::now();
    let mut ops = Vec::new();
    let removed;
    {
        let mut st = inner.state.lock();
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
            let tear_all = !wanted && (e.pod.is_some() || e.remove_dir);
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
            match inner.ops.remove_pod_dir(&dir).await {
                Ok(()) => {
                    info!(dir = %dir.display(), "Removed the directory of a pod gone for good")
                }
                Err(e) => {
                    warn!(error = %e, "Cannot remove pod directory; will retry at the next orphan check")
                }
            }
            let mut st = inner.state.lock();
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
    let result = tokio::time::timeout(
        OPERATION_TIMEOUT,
        inner.ops.set_up(&pod, &volume, &inner.pods_dir),
    )
    .await;
    match result {
        Ok(Ok(mounted)) => {
            debug!(path = %mounted.host_path.display(), "MountVolume.SetUp succeeded");
            let dir = mounted.host_path.clone();
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
        Ok(Err(e)) => failed(inner, &pod, uid, name, e.to_string()),
        Err(_) => failed(
            inner,
            &pod,
            uid,
            name,
            format!("timed out after {OPERATION_TIMEOUT:?}"),
        ),
    }
}

fn failed(
    inner: &Arc<Inner>,
    pod: &k8s_openapi::api::core::v1::Pod,
    uid: &str,
    name: &str,
    err: String,
) {
    let message = format!("MountVolume.SetUp failed for volume {name:?} : {err}");
    warn!(error = %err, "MountVolume.SetUp failed");
    inner.recorder.event(
        &pod_ref(pod, None),
        EventType::Warning,
        FAILED_MOUNT,
        message,
    );
    finish(inner, uid, name, |v| {
        v.backoff = if v.backoff.is_zero() {
            INITIAL_BACKOFF
        } else {
            (v.backoff * 2).min(MAX_BACKOFF)
        };
        v.next_try = Some(Instant::now() + v.backoff);
    });
}

async fn tear_down(inner: &Arc<Inner>, uid: &str, name: &str) {
    let (plugin, dir, pod_gone) = {
        let st = inner.state.lock();
        let Some(e) = st.pods.get(uid) else { return };
        let pod_gone = !e.desired;
        let Some(v) = e.volumes.get(name) else {
            return;
        };
        let dir = v
            .on_disk
            .clone()
            .or_else(|| v.mounted.as_ref().map(|m| m.host_path.clone()));
        (v.plugin, dir, pod_gone)
    };
    if pod_gone && let Err(e) = inner.ops.clean_subpaths(&inner.pods_dir, uid).await {
        warn!(error = %e, "Cannot clean up the pod's subPath mounts");
    }
    let result = match &dir {
        // hostPath volumes have no directory of their own to tear down.
        Some(d) if plugin != kubelet_volume::plugin::names::HOST_PATH => {
            tokio::time::timeout(OPERATION_TIMEOUT, inner.ops.tear_down(plugin, d))
                .await
                .unwrap_or_else(|_| {
                    Err(kubelet_volume::Error::Invalid(format!(
                        "timed out after {OPERATION_TIMEOUT:?}"
                    )))
                })
        }
        _ => Ok(()),
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
