//! The volume manager (upstream `pkg/kubelet/volumemanager`): a desired
//! state (the volumes of pods that may run here), an actual state (what is
//! set up on disk), and a [`reconciler`] that brings one to the other.
//!
//! A pod's sync waits in [`VolumeManager::wait_for_attach_and_mount`] until
//! every volume it names is set up (upstream `WaitForAttachAndMount`, at most
//! two minutes); meanwhile failed set-ups are `FailedMount` events with
//! upstream's `MountVolume.SetUp failed for volume ...` message, retried with
//! upstream's exponential backoff. Volumes whose content comes from the
//! apiserver or the pod (configMap, secret, downwardAPI, projected) are set
//! up again when [`VolumeManager::objects_changed`] or a pod update says so,
//! which is how a ConfigMap update reaches its files within a second or two.
//!
//! Volumes are torn down after the pod's containers are gone
//! ([`VolumeManager::pod_terminated`]). After a kubelet restart the volumes
//! found on disk are adopted: a pod that comes back gets the same directories
//! (an emptyDir keeps its data), a pod being killed has them torn down
//! (no API object is needed for that), and once every pod source has
//! reported, the directories of pods nobody wants are torn down and removed.
//! A volume's subPath mounts go before it; while they cannot, the volume
//! stays set up and its tear-down is retried. Pod directories are removed
//! only as [`crate::kubelet_volumes`] allows, here and nowhere else.

mod csi;
mod csi_block;
mod in_use;
mod ops;
mod reconciler;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_types::events::Recorder;
use kubelet_types::pod;
use kubelet_volume::MountedVolume;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

pub use csi::CsiVolumes;
pub use in_use::VolumesInUseReporter;
pub use ops::{KubeletVolumeOps, VolumeOps};

/// How long a pod's sync waits for its volumes (upstream
/// `podAttachAndMountTimeout`).
pub const POD_ATTACH_AND_MOUNT_TIMEOUT: Duration = Duration::from_secs(120);

/// First retry delay of a failed set-up (upstream
/// `exponentialbackoff.initialDurationBeforeRetry`).
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest retry delay (upstream `maxDurationBeforeRetry`, 2m2s).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(122);

/// A pod's volumes could not all be set up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VolumeError {
    /// Not every volume was set up in time, or the pod names a volume no
    /// plugin serves (upstream's `unmounted volumes=[..], unattached
    /// volumes=[..], failed to process volumes=[..]: <cause>`).
    #[error(
        "unmounted volumes=[{}], unattached volumes=[{}], failed to process volumes=[{}]: {cause}",
        .unmounted.join(" "), .unattached.join(" "), .not_processed.join(" ")
    )]
    NotMounted {
        /// Volumes not set up.
        unmounted: Vec<String>,
        /// Upstream lists volumes of attachable plugins here; none of ours are.
        unattached: Vec<String>,
        /// Volumes that could not be added to the desired state.
        not_processed: Vec<String>,
        /// Why the wait ended.
        cause: String,
    },
    /// The wait was cut short (the pod is being killed, or the kubelet stops).
    #[error("waiting for volumes was cancelled")]
    Cancelled,
}

impl VolumeError {
    /// Whether the wait simply ran out of time (upstream records no
    /// `FailedMount` for that: the set-up failures already were).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::NotMounted { cause, .. } if cause == TIMEOUT)
    }
}

const TIMEOUT: &str = "context deadline exceeded";

/// One volume of one pod.
#[derive(Debug, Clone)]
pub(crate) struct VolumeState {
    /// The pod's volume (None: found on disk after a restart).
    pub spec: Option<Volume>,
    /// Plugin dir name (`kubernetes.io~configmap`).
    pub plugin: &'static str,
    /// Set up, with what containers mount.
    pub mounted: Option<MountedVolume>,
    /// A directory exists on disk for it (set up now or before a restart).
    pub on_disk: Option<PathBuf>,
    /// Set up again at the next chance (content changed).
    pub remount: bool,
    /// Bumped whenever the content may have changed; a set-up that started
    /// at an older generation leaves `remount` set.
    pub generation: u64,
    /// The generation the running set-up started at.
    pub started: u64,
    /// An operation is running.
    pub in_flight: bool,
    /// The running operation is a tear-down: the volume no longer counts
    /// as set up.
    pub tearing_down: bool,
    /// Not before this instant.
    pub next_try: Option<Instant>,
    /// The current retry delay.
    pub backoff: Duration,
}

impl VolumeState {
    fn new(spec: Option<Volume>, plugin: &'static str) -> Self {
        Self {
            spec,
            plugin,
            mounted: None,
            on_disk: None,
            remount: false,
            generation: 0,
            started: 0,
            in_flight: false,
            tearing_down: false,
            next_try: None,
            backoff: Duration::ZERO,
        }
    }
}

/// One pod in the volume manager.
#[derive(Debug, Clone)]
pub(crate) struct PodEntry {
    /// The pod (None: only its directories were found after a restart).
    pub pod: Option<Arc<Pod>>,
    /// Wanted: its volumes are set up and kept. Not wanted: torn down.
    pub desired: bool,
    /// The pod's containers are gone ([`VolumeManager::pod_terminated`]):
    /// its volumes are torn down, whether or not the pod was seen since a
    /// restart (a pod deleted while the kubelet was down is known only by
    /// what is on disk).
    pub terminated: bool,
    /// Remove `<pods>/<uid>` once everything is torn down.
    pub remove_dir: bool,
    /// `<pods>/<uid>` is being removed: nothing is set up for the UID
    /// until that is done.
    pub removing: bool,
    /// Volumes by the pod's name for them.
    pub volumes: BTreeMap<String, VolumeState>,
    /// Volumes that could not be added (no plugin), with the reason.
    pub errors: BTreeMap<String, String>,
}

#[derive(Default)]
pub(crate) struct State {
    pub pods: HashMap<String, PodEntry>,
    /// Pod directories whose removal failed, with the last reason (logged
    /// at warn once, then at debug until it changes or succeeds).
    pub refused_dirs: HashMap<String, String>,
}

pub(crate) struct Inner {
    pub ops: Arc<dyn VolumeOps>,
    pub pods_dir: PathBuf,
    pub state: Mutex<State>,
    /// Wakes the reconciler.
    pub wake: Notify,
    /// Reconciler passes so far (how often it looked, for tests and
    /// profiling).
    pub passes: std::sync::atomic::AtomicU64,
    /// Wakes waiters when an operation ends.
    pub changed: Notify,
    pub recorder: Arc<dyn Recorder>,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
    /// Whether orphaned directories found after a restart may be removed
    /// now (all sources ready, the pod unknown, none of its containers left).
    pub may_clean_orphan: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// True once the volumes found on disk are in the actual state: before
    /// that, a pod with no entry may still have volumes mounted (upstream
    /// `podVolumesExist` also looks at the disk).
    pub reconstructed: watch::Sender<bool>,
}

/// The volume manager. Cheap to clone.
#[derive(Clone)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

impl VolumeManager {
    /// A manager keeping volumes under `root_dir/pods`, setting them up
    /// through `ops`. `may_clean_orphan(uid)` says whether the directories
    /// of a pod found on disk but not (or no longer) wanted may go.
    pub fn new(
        ops: Arc<dyn VolumeOps>,
        root_dir: &Path,
        recorder: Arc<dyn Recorder>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
        may_clean_orphan: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                ops,
                pods_dir: root_dir.join("pods"),
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                passes: std::sync::atomic::AtomicU64::new(0),
                changed: Notify::new(),
                recorder,
                tracker,
                shutdown,
                may_clean_orphan,
                reconstructed: watch::Sender::new(false),
            }),
        }
    }

    /// Turns true once what earlier runs left on disk has been read back.
    pub fn reconstructed(&self) -> watch::Receiver<bool> {
        self.inner.reconstructed.subscribe()
    }

    /// `<root-dir>/pods`.
    pub fn pods_dir(&self) -> &Path {
        &self.inner.pods_dir
    }

    /// Adopts what earlier runs left on disk, then runs the reconciler
    /// until shutdown.
    pub async fn run(self) {
        reconciler::reconstruct(&self.inner).await;
        self.inner.reconstructed.send_replace(true);
        reconciler::run(self.inner.clone()).await;
    }

    /// Records `p` as desired (or updates it), marking the volumes whose
    /// content follows the pod or the apiserver for a rewrite (upstream
    /// `ReprocessPod`).
    pub fn add_pod(&self, p: &Arc<Pod>) {
        let uid = pod::uid(p).to_string();
        {
            let mut st = self.inner.state.lock();
            let entry = st.pods.entry(uid).or_insert_with(|| PodEntry {
                pod: None,
                desired: true,
                terminated: false,
                remove_dir: false,
                removing: false,
                volumes: BTreeMap::new(),
                errors: BTreeMap::new(),
            });
            entry.pod = Some(p.clone());
            entry.desired = true;
            entry.terminated = false;
            entry.remove_dir = false;
            entry.errors.clear();
            let used = expected_volumes(p);
            let volumes: Vec<Volume> = p
                .spec
                .as_ref()
                .and_then(|s| s.volumes.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|v| used.contains(&v.name))
                .collect();
            let names: Vec<String> = volumes.iter().map(|v| v.name.clone()).collect();
            for v in volumes {
                let plugin = match kubelet_volume::plugin_for(&v) {
                    Ok(plugin) => plugin,
                    Err(e) => {
                        entry.errors.insert(
                            v.name.clone(),
                            format!(
                                "failed to get Plugin from volumeSpec for volume {:?} err=no volume plugin matched: {e}",
                                v.name
                            ),
                        );
                        continue;
                    }
                };
                let state = entry
                    .volumes
                    .entry(v.name.clone())
                    .or_insert_with(|| VolumeState::new(None, plugin));
                if state.mounted.is_some() && (state.plugin != plugin) {
                    // The pod changed a volume's type under the same name: not
                    // allowed by validation; keep what is there.
                    continue;
                }
                state.plugin = plugin;
                let refresh = state.mounted.as_ref().is_some_and(|m| m.refresh);
                state.spec = Some(v);
                if refresh {
                    state.remount = true;
                    state.generation += 1;
                    state.next_try = None;
                }
            }
            // Pod volumes cannot change, so what the pod does not name was
            // found on disk (a local PV's directory is named after the PV):
            // kept while the pod runs, torn down with its other volumes.
            for (name, state) in &mut entry.volumes {
                if !names.contains(name) {
                    state.spec = None;
                }
            }
        }
        self.inner.wake.notify_one();
    }

    /// Waits until every volume of `p` is set up (upstream
    /// `WaitForAttachAndMount`), at most [`POD_ATTACH_AND_MOUNT_TIMEOUT`].
    pub async fn wait_for_attach_and_mount(&self, p: &Arc<Pod>) -> Result<(), VolumeError> {
        self.wait_for_attach_and_mount_within(p, POD_ATTACH_AND_MOUNT_TIMEOUT)
            .await
    }

    /// [`Self::wait_for_attach_and_mount`] with a given timeout.
    pub async fn wait_for_attach_and_mount_within(
        &self,
        p: &Arc<Pod>,
        timeout: Duration,
    ) -> Result<(), VolumeError> {
        let expected = expected_volumes(p);
        if expected.is_empty() {
            return Ok(());
        }
        self.add_pod(p);
        let uid = pod::uid(p).to_string();
        let deadline = Instant::now() + timeout;
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.check(&uid, &expected) {
                Check::Done => {
                    debug!("All volumes are attached and mounted for pod");
                    return Ok(());
                }
                Check::Failed(e) => return Err(e),
                Check::Waiting => {}
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => {
                    return match self.check(&uid, &expected) {
                        Check::Done => Ok(()),
                        Check::Failed(e) => Err(e),
                        Check::Waiting => Err(self.not_mounted(&uid, &expected, TIMEOUT.into())),
                    };
                }
                () = self.inner.shutdown.cancelled() => return Err(VolumeError::Cancelled),
            }
        }
    }

    fn check(&self, uid: &str, expected: &[String]) -> Check {
        let st = self.inner.state.lock();
        let Some(entry) = st.pods.get(uid) else {
            return Check::Waiting;
        };
        if !entry.errors.is_empty() {
            let cause = entry
                .errors
                .values()
                .cloned()
                .collect::<Vec<_>>()
                .join("; ");
            drop(st);
            return Check::Failed(self.not_mounted(uid, expected, cause));
        }
        let all = expected.iter().all(|n| {
            entry
                .volumes
                .get(n)
                .is_some_and(|v| v.mounted.is_some() && v.spec.is_some() && !v.tearing_down)
        });
        if all { Check::Done } else { Check::Waiting }
    }

    fn not_mounted(&self, uid: &str, expected: &[String], cause: String) -> VolumeError {
        let st = self.inner.state.lock();
        let entry = st.pods.get(uid);
        let mut unmounted: Vec<String> = expected
            .iter()
            .filter(|n| {
                entry
                    .and_then(|e| e.volumes.get(*n))
                    .is_none_or(|v| v.mounted.is_none())
            })
            .cloned()
            .collect();
        unmounted.sort();
        let mut not_processed: Vec<String> = entry
            .map(|e| e.errors.keys().cloned().collect())
            .unwrap_or_default();
        not_processed.sort();
        VolumeError::NotMounted {
            unmounted,
            unattached: vec![],
            not_processed,
            cause,
        }
    }

    /// The pod's set-up volumes by the pod's name for them (upstream
    /// `GetMountedVolumesForPod`).
    pub fn get_mounted_volumes_for_pod(&self, uid: &str) -> HashMap<String, MountedVolume> {
        let st = self.inner.state.lock();
        st.pods
            .get(uid)
            .map(|e| {
                e.volumes
                    .iter()
                    .filter_map(|(n, v)| v.mounted.clone().map(|m| (n.clone(), m)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The pod's containers are gone: tear its volumes down; with
    /// `remove_dir` (the pod is gone for good) remove `<pods>/<uid>` too.
    pub fn pod_terminated(&self, uid: &str, remove_dir: bool) {
        {
            let mut st = self.inner.state.lock();
            if let Some(e) = st.pods.get_mut(uid) {
                e.desired = false;
                e.terminated = true;
                e.remove_dir |= remove_dir;
            } else if remove_dir || !*self.inner.reconstructed.borrow() {
                // Before reconstruction the pod may have volumes on disk:
                // the mark waits for them (no pass runs before it).
                st.pods.insert(
                    uid.to_string(),
                    PodEntry {
                        pod: None,
                        desired: false,
                        terminated: true,
                        remove_dir,
                        removing: false,
                        volumes: BTreeMap::new(),
                        errors: BTreeMap::new(),
                    },
                );
            }
        }
        self.inner.wake.notify_one();
    }

    /// Waits until the pod has nothing set up any more (upstream
    /// `WaitForUnmount`), at most `timeout`; true when it has not. Nothing
    /// is decided before the volumes found on disk are known.
    pub async fn wait_for_unmount(&self, uid: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut reconstructed = self.inner.reconstructed.subscribe();
        tokio::select! {
            r = reconstructed.wait_for(|done| *done) => {
                if r.is_err() {
                    return false;
                }
            }
            () = tokio::time::sleep_until(deadline) => return false,
            () = self.inner.shutdown.cancelled() => return false,
        }
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let done = self.inner.state.lock().pods.get(uid).is_none_or(|e| {
                // Wanted again (a returning UID) with nothing left of before.
                e.desired
                    && !e.removing
                    && e.volumes
                        .values()
                        .all(|v| !v.tearing_down && v.mounted.is_none())
            });
            if done {
                return true;
            }
            tokio::select! {
                () = changed => {}
                // Also looked at again with the reconciler's period.
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = tokio::time::sleep_until(deadline) => return false,
                () = self.inner.shutdown.cancelled() => return false,
            }
        }
    }

    /// Objects in `namespace` changed (a ConfigMap or Secret update, a new
    /// token): rewrite the content volumes of the namespace's pods at once,
    /// and retry their failed set-ups without waiting out the backoff.
    pub fn objects_changed(&self, namespace: &str) {
        self.rewrite(Some(namespace));
    }

    /// [`Self::objects_changed`] for every namespace (notifications were lost).
    pub fn objects_changed_everywhere(&self) {
        self.rewrite(None);
    }

    fn rewrite(&self, namespace: Option<&str>) {
        {
            let mut st = self.inner.state.lock();
            for e in st.pods.values_mut().filter(|e| e.desired) {
                if namespace.is_some() && e.pod.as_deref().map(pod::namespace) != namespace {
                    continue;
                }
                for v in e.volumes.values_mut() {
                    let content = v.mounted.as_ref().is_none_or(|m| m.refresh);
                    if content {
                        v.remount = v.mounted.is_some();
                        v.generation += 1;
                        v.next_try = None;
                    }
                }
            }
        }
        self.inner.wake.notify_one();
    }
}

enum Check {
    Done,
    Waiting,
    Failed(VolumeError),
}

/// The volumes a pod's containers mount (upstream `GetPodVolumeNames`):
/// the only ones the populator adds and `getExpectedVolumes` waits for.
fn expected_volumes(p: &Pod) -> Vec<String> {
    let Some(spec) = p.spec.as_ref() else {
        return vec![];
    };
    let mounts = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .map(|m| m.name.clone())
                .chain(c.volume_devices.iter().flatten().map(|d| d.name.clone()))
        });
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .flat_map(|c| c.volume_mounts.iter().flatten().map(|m| m.name.clone()));
    let mut names: Vec<String> = mounts.chain(ephemeral).collect();
    let declared: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    names.retain(|n| declared.contains(&n.as_str()));
    names.sort();
    names.dedup();
    names
}
