//! CSI volumes in the volume manager (upstream `operationexecutor` for the
//! `kubernetes.io/csi` plugin: `MountVolume` with `WaitForAttach`,
//! `MountDevice` and `SetUp`, `UnmountVolume`, `UnmountDevice`, and the
//! reconstruction of mounted volumes after a restart).
//!
//! An inline `csi:` volume, a claim bound to a PV with `spec.csi` and a
//! generic ephemeral volume's claim go to [`kubelet_csi::CsiPlugin`].
//! Operations on one device (driver and volume handle) run one at a time;
//! operations on other devices never wait for them. A pod counts as a user of
//! a persistent device from the moment its set-up starts (it may stage the
//! device even when publishing then fails), until its volume is torn down.
//! The device is unstaged when its last user went and no other mount shows
//! the staging path (upstream's `GetDeviceMountRefs` check); an unstage is
//! pending from before the driver is called until it succeeded, and
//! [`CsiVolumes::retry_unstages`] retries it. Volumes found mounted after a
//! restart are adopted: the pod's first set-up takes the mount as it is,
//! without calling the driver. The node's `status.volumesInUse` lists every
//! device with a user or a pending unstage.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use kubelet_csi::paths::{keys, load_volume_data};
use kubelet_csi::plugin::{LIFECYCLE_EPHEMERAL, LIFECYCLE_PERSISTENT};
use kubelet_csi::{CsiPlugin, CsiVolume, PodVolumeRef};
use kubelet_volume::plugin::names;
use kubelet_volume::{MountedVolume, VolumeHost};
use parking_lot::Mutex;
use tracing::{info, warn};

/// A device: driver and volume handle.
type Device = (String, String);
/// A pod's volume: pod UID and spec name.
type PodVolume = (String, String);

/// The CSI plugin as the volume manager uses it.
pub struct CsiVolumes {
    plugin: Arc<CsiPlugin>,
    /// One operation per device at a time.
    locks: Mutex<HashMap<Device, Arc<tokio::sync::Mutex<()>>>>,
    /// Pods with a persistent volume of the device set up, or with a set-up
    /// of it started (it may have staged the device), by spec name.
    users: Mutex<HashMap<Device, BTreeSet<PodVolume>>>,
    /// The directory of each volume whose set-up was started, by pod UID
    /// and the pod's name for the volume, until it is torn down.
    tried: Mutex<HashMap<PodVolume, PathBuf>>,
    /// Volumes found mounted after a restart, not yet claimed by their pod.
    adopted: Mutex<HashSet<PodVolume>>,
    /// Devices to unstage: their last user went and the unstage has not
    /// succeeded yet.
    unstage: Mutex<HashSet<Device>>,
    /// The size each device was last grown to on this node.
    expanded: Mutex<HashMap<Device, i64>>,
    /// The spec name of each raw block device (its paths are by spec name).
    block_specs: Mutex<HashMap<Device, String>>,
    /// Devices the driver could not grow while in use: not tried again
    /// until their next mount.
    in_use_expansion_failed: Mutex<HashSet<Device>>,
}

/// The result of a CSI set-up or tear-down as a `kubelet-volume` error,
/// its text already upstream's event message.
fn plugin_error(e: kubelet_csi::Error) -> kubelet_volume::Error {
    kubelet_volume::Error::Plugin(Box::new(e))
}

impl CsiVolumes {
    /// Volumes served through `plugin`.
    pub fn new(plugin: Arc<CsiPlugin>) -> Self {
        Self {
            plugin,
            locks: Mutex::default(),
            users: Mutex::default(),
            tried: Mutex::default(),
            adopted: Mutex::default(),
            unstage: Mutex::default(),
            expanded: Mutex::default(),
            block_specs: Mutex::default(),
            in_use_expansion_failed: Mutex::default(),
        }
    }

    /// The plugin.
    pub fn plugin(&self) -> &Arc<CsiPlugin> {
        &self.plugin
    }

    fn lock(&self, device: &Device) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().entry(device.clone()).or_default().clone()
    }

    /// Sets up `volume` of `pod` when it is a CSI volume; `None` when it is
    /// not (another plugin serves it).
    pub async fn set_up(
        &self,
        host: &dyn VolumeHost,
        pod: &Pod,
        volume: &Volume,
        pods_dir: &Path,
    ) -> Option<Result<MountedVolume, kubelet_volume::Error>> {
        if volume.csi.is_some() {
            return Some(
                self.set_up_csi(pod, volume, CsiVolume::Inline(volume))
                    .await,
            );
        }
        let resolved = match kubelet_volume::pvc::resolve_volume(host, pod, volume).await {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let (pv, read_only) = (&resolved.pv, resolved.read_only);
        if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_none() {
            // Not CSI: the claim's other plugins, with the PV already read.
            let req = kubelet_volume::SetUpRequest {
                pod,
                volume,
                pods_dir,
            };
            return Some(kubelet_volume::pvc::set_up_bound(host, req, pv, read_only).await);
        }
        let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        // Upstream `checkNodeAffinity` before any driver call.
        if let Err(e) = kubelet_volume::pvc::check_node_affinity(pv, &host.node_labels()) {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            return Some(Err(kubelet_volume::Error::Phased(format!(
                "{}.NodeAffinity check failed for volume {name:?} : {e}",
                if block { "MapVolume" } else { "MountVolume" }
            ))));
        }
        if let Err(e) = super::csi_block::check_volume_mode(pod, volume, block) {
            return Some(Err(kubelet_volume::Error::Invalid(e)));
        }
        let mounted = self
            .set_up_csi(pod, volume, CsiVolume::Persistent { pv, read_only })
            .await;
        if mounted.is_ok()
            && !block
            && let Err(e) = self.expand_if_needed(pod, pv, &resolved.pvc).await
        {
            return Some(Err(e));
        }
        Some(mounted)
    }

    /// Online expansion (upstream `nodeExpandVolume` from the reconciler):
    /// when the PV grew past the claim's status capacity, the driver grows
    /// the published volume once per size, then the claim's status is
    /// marked finished (retried with each set-up while it lags).
    async fn expand_if_needed(
        &self,
        pod: &Pod,
        pv: &PersistentVolume,
        pvc: &PersistentVolumeClaim,
    ) -> Result<(), kubelet_volume::Error> {
        let Some(size) = kubelet_csi::resize::resize_required(pv, pvc) else {
            return Ok(());
        };
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            return Ok(());
        };
        let device = (csi.driver.clone(), csi.volume_handle.clone());
        let done = self
            .expanded
            .lock()
            .get(&device)
            .is_some_and(|s| *s >= size)
            || self.in_use_expansion_failed.lock().contains(&device);
        if !done {
            let uid = kubelet_types::pod::uid(pod);
            let lock = self.lock(&device);
            let _held = lock.lock().await;
            if let Err(e) = self.plugin.node_expand(uid, pv, size).await {
                // A driver that cannot grow a volume in use: the mount goes
                // on, and the expansion waits for the volume's next mount
                // (upstream `MarkForInUseExpansionError`).
                if kubelet_csi::resize::is_in_use_error(&e) {
                    warn!(error = %e, "MountVolume.NodeExpandVolume failed: the volume cannot be expanded while in use; waiting for its next mount");
                    self.in_use_expansion_failed.lock().insert(device);
                    return Ok(());
                }
                // Resizers that track `allocatedResourceStatuses` (1.32+)
                // learn of a final failure from the claim (upstream
                // `NodeExpander`).
                let tracked = pvc
                    .status
                    .as_ref()
                    .and_then(|s| s.allocated_resource_statuses.as_ref())
                    .is_some_and(|m| m.contains_key("storage"));
                if tracked
                    && e.is_final()
                    && let Err(m) = self.plugin.mark_node_expansion_failed(pvc, &e).await
                {
                    warn!(error = %m, "Could not record the failed node expansion in the claim's status");
                }
                return Err(plugin_error(e));
            }
            self.expanded.lock().insert(device, size);
        }
        if let Err(e) = self.plugin.mark_resize_finished(pv, pvc).await {
            warn!(error = %e, "Could not record the finished resize in the claim's status; will retry");
        }
        Ok(())
    }

    pub(super) async fn set_up_csi(
        &self,
        pod: &Pod,
        volume: &Volume,
        csi: CsiVolume<'_>,
    ) -> Result<MountedVolume, kubelet_volume::Error> {
        let uid = kubelet_types::pod::uid(pod).to_string();
        let facts = csi.facts(&uid).map_err(plugin_error)?;
        let device = (facts.driver.clone(), facts.volume_handle.clone());
        let key = (uid.clone(), facts.spec_name.clone());
        let persistent = facts.lifecycle_mode == LIFECYCLE_PERSISTENT;
        // A user from now on: a failed set-up may have staged the device,
        // and the device is in use while it may be.
        if persistent {
            self.users
                .lock()
                .entry(device.clone())
                .or_default()
                .insert(key.clone());
        }
        let layout = self.plugin.layout();
        let dir = if facts.block {
            self.block_specs
                .lock()
                .insert(device.clone(), facts.spec_name.clone());
            layout.pod_device_map_path(&uid, &facts.spec_name)
        } else {
            layout.pod_volume_dir(&uid, &facts.spec_name)
        };
        self.tried
            .lock()
            .insert((uid.clone(), volume.name.clone()), dir);
        let republish = self
            .plugin
            .requires_republish(&facts.driver)
            .await
            .unwrap_or(false);
        let lock = self.lock(&device);
        let _held = lock.lock().await;
        let target = if facts.block {
            layout.block_publish_path(&facts.spec_name, &uid)
        } else {
            layout.target_path(&uid, &facts.spec_name)
        };
        let adopted = self.adopted.lock().remove(&key);
        // Set up again (a pod sync, a resize check): published once is
        // enough unless the driver asks for republishing.
        let published = self
            .plugin
            .pod_volumes(&uid)
            .iter()
            .any(|r| r.spec_name == facts.spec_name);
        let keep = (adopted || (published && !republish))
            && kubelet_volume::mount::is_mount_point(&target)
                .await
                .unwrap_or(false);
        let (path, read_only) = if keep {
            if adopted {
                info!(driver = %facts.driver, volume = %facts.spec_name, "Adopted the CSI volume mounted before the restart");
            }
            (target, facts.read_only)
        } else {
            let m = self.plugin.set_up(pod, csi).await.map_err(plugin_error)?;
            (m.path, m.read_only)
        };
        let path = if facts.block {
            super::csi_block::map(layout, &uid, &facts.spec_name, &path).await?
        } else {
            path
        };
        let claim = kubelet_volume::pvc::claim_of(pod, volume)
            .map(|(claim, ..)| (kubelet_types::pod::namespace(pod).to_string(), claim));
        self.plugin.record_pod_volume(
            &uid,
            PodVolumeRef {
                spec_name: facts.spec_name.clone(),
                name: volume.name.clone(),
                claim,
                unique_name: persistent
                    .then(|| kubelet_csi::pod_volumes::unique_volume_name(&device.0, &device.1)),
            },
        );
        if persistent {
            // Set up again (staged if it was pending unstage): in use.
            self.unstage.lock().remove(&device);
        }
        Ok(MountedVolume {
            name: volume.name.clone(),
            plugin: names::CSI,
            host_path: path,
            read_only,
            // Set up again with every pod sync: drivers with
            // `requiresRepublish` publish again (upstream
            // `MarkRemountRequired`), claims are checked for a resize.
            refresh: republish || persistent,
            block: facts.block,
        })
    }

    /// Tears down the CSI volume directory `dir`
    /// (`<pods>/<uid>/volumes/kubernetes.io~csi/<spec name>`): unpublish,
    /// then unstage when no other pod uses the device.
    pub async fn tear_down(&self, dir: &Path) -> Result<(), kubelet_volume::Error> {
        let (Some(spec_name), Some(uid)) = (
            dir.file_name().map(|n| n.to_string_lossy().into_owned()),
            dir.ancestors()
                .nth(3)
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned()),
        ) else {
            return Err(kubelet_volume::Error::Invalid(format!(
                "not a CSI volume directory: {}",
                dir.display()
            )));
        };
        let key = (uid.clone(), spec_name.clone());
        let block = super::csi_block::is_block_link(dir);
        let data_dir = if block {
            self.plugin.layout().block_data_dir(&spec_name)
        } else {
            dir.to_path_buf()
        };
        let data = load_volume_data(&data_dir).await;
        let (device, data) = match data {
            Ok(d) => {
                let get = |k: &str| d.get(k).cloned().unwrap_or_default();
                ((get(keys::DRIVER_NAME), get(keys::VOLUME_HANDLE)), Ok(()))
            }
            // A set-up that failed before it published: no volume data,
            // but the device it was for is known.
            Err(e) => match self.device_of(&key) {
                Some(device) => (device, Err(e)),
                None if block => {
                    return super::csi_block::unmap(self.plugin.layout(), &uid, &spec_name).await;
                }
                None => return self.remove_unpublished(dir, e).await,
            },
        };
        let lock = self.lock(&device);
        let _held = lock.lock().await;
        let ephemeral = match data {
            Ok(()) if block => {
                self.block_specs
                    .lock()
                    .insert(device.clone(), spec_name.clone());
                super::csi_block::unmap(self.plugin.layout(), &uid, &spec_name).await?;
                self.plugin
                    .tear_down_block(&uid, &spec_name)
                    .await
                    .map_err(plugin_error)?;
                false
            }
            Err(_) if block => {
                super::csi_block::unmap(self.plugin.layout(), &uid, &spec_name).await?;
                false
            }
            Ok(()) => {
                let torn = self
                    .plugin
                    .tear_down(&uid, &spec_name)
                    .await
                    .map_err(plugin_error)?;
                // Without a mode the volume is persistent (older kubelets).
                torn.lifecycle_mode == LIFECYCLE_EPHEMERAL
            }
            Err(e) => {
                self.remove_unpublished(dir, e).await?;
                false
            }
        };
        self.adopted.lock().remove(&key);
        self.tried.lock().retain(|_, d| d != dir);
        self.plugin.forget_pod_volume(&uid, &spec_name);
        if ephemeral {
            return Ok(());
        }
        let last = {
            let mut users = self.users.lock();
            let set = users.entry(device.clone()).or_default();
            set.remove(&key);
            let last = set.is_empty();
            if last {
                users.remove(&device);
            }
            last
        };
        if last {
            self.in_use_expansion_failed.lock().remove(&device);
            // Pending until it succeeded: a failed or cut-short unstage is
            // retried.
            self.unstage.lock().insert(device.clone());
            self.unstage_device(&device).await;
        }
        Ok(())
    }

    /// The device pod volume `key` (pod UID, spec name) uses or tried to.
    fn device_of(&self, key: &PodVolume) -> Option<Device> {
        self.users
            .lock()
            .iter()
            .find(|(_, users)| users.contains(key))
            .map(|(device, _)| device.clone())
    }

    /// The directory of the volume `name` of pod `uid` whose set-up was
    /// started and not torn down: a failed set-up may have left state
    /// (a staged device, a directory) that its tear-down undoes.
    pub fn set_up_dir(&self, uid: &str, name: &str) -> Option<PathBuf> {
        self.tried
            .lock()
            .get(&(uid.to_string(), name.to_string()))
            .cloned()
    }

    /// The outer deadline of one set-up or tear-down: longer than the sum
    /// of the plugin's own deadlines, so these end an operation first.
    pub fn operation_timeout(&self) -> std::time::Duration {
        self.plugin.timeouts().outer_bound()
    }

    /// Unstages `device`, pending in `unstage`, with its lock held: refused
    /// while another mount still shows its staging path (upstream
    /// `GetDeviceMountRefs` check), removed from `unstage` on success.
    async fn unstage_device(&self, device: &Device) {
        let block_spec = self.block_specs.lock().get(device).cloned();
        if let Some(spec) = block_spec {
            match self.plugin.unmount_block_device(&spec).await {
                Ok(()) => {
                    self.unstage.lock().remove(device);
                    self.block_specs.lock().remove(device);
                }
                Err(e) => {
                    warn!(driver = %device.0, volume_handle = %device.1, error = %e, "UnmapDevice failed; will retry");
                }
            }
            return;
        }
        let staging = self.plugin.layout().device_mount_path(&device.0, &device.1);
        match staging_refs(&staging).await {
            Ok(refs) if refs.is_empty() => {}
            Ok(refs) => {
                warn!(driver = %device.0, volume_handle = %device.1, refs = refs.len(), error = %format!("the device mount path {:?} is still mounted by other references {refs:?}", staging.display().to_string()), "UnmountDevice refused: GetDeviceMountRefs check failed; will retry");
                return;
            }
            Err(e) => {
                warn!(driver = %device.0, volume_handle = %device.1, error = %e, "UnmountDevice refused: GetDeviceMountRefs check failed; will retry");
                return;
            }
        }
        match self.plugin.unmount_device(&device.0, &device.1).await {
            Ok(()) => {
                self.unstage.lock().remove(device);
            }
            Err(e) => {
                warn!(driver = %device.0, volume_handle = %device.1, error = %e, "UnmountDevice failed; will retry");
            }
        }
    }

    /// A CSI directory without readable volume data: nothing was published
    /// through it that the kubelet can name; removed when nothing is
    /// mounted there.
    async fn remove_unpublished(
        &self,
        dir: &Path,
        e: kubelet_csi::Error,
    ) -> Result<(), kubelet_volume::Error> {
        if tokio::fs::symlink_metadata(dir).await.is_err() {
            return Ok(());
        }
        if kubelet_volume::mount::is_mount_point(&dir.join("mount")).await? {
            return Err(plugin_error(e));
        }
        warn!(dir = %dir.display(), error = %e, "Removing a CSI volume directory without volume data");
        kubelet_volume::tear_down(names::EMPTY_DIR, dir).await
    }

    /// Unstages devices whose unstage failed, when still no pod uses them.
    pub async fn retry_unstages(&self) {
        let pending: Vec<Device> = self.unstage.lock().iter().cloned().collect();
        for device in pending {
            let lock = self.lock(&device);
            let _held = lock.lock().await;
            if self.users.lock().contains_key(&device) {
                self.unstage.lock().remove(&device);
                continue;
            }
            self.unstage_device(&device).await;
        }
    }

    /// Records the CSI volumes of pod `uid` found on disk after a restart:
    /// mounted ones are adopted, and persistent ones count as users of
    /// their device.
    pub async fn reconstruct(&self, uid: &str) {
        for b in super::csi_block::reconstruct(self.plugin.layout(), uid).await {
            let key = (uid.to_string(), b.spec.clone());
            let device = (b.driver, b.handle);
            self.block_specs.lock().insert(device.clone(), b.spec);
            self.users
                .lock()
                .entry(device)
                .or_default()
                .insert(key.clone());
            if b.published {
                self.adopted.lock().insert(key);
            }
        }
        let found = match self.plugin.reconstruct(uid).await {
            Ok(f) => f,
            Err(e) => {
                warn!(pod.uid = uid, error = %e, "Cannot reconstruct CSI volumes");
                return;
            }
        };
        for v in found {
            let key = (uid.to_string(), v.spec_name.clone());
            if v.lifecycle_mode == LIFECYCLE_PERSISTENT {
                self.users
                    .lock()
                    .entry((v.driver.clone(), v.volume_handle.clone()))
                    .or_default()
                    .insert(key.clone());
            }
            if v.mounted {
                info!(pod.uid = uid, driver = %v.driver, volume = %v.spec_name, "Reconstructed a mounted CSI volume");
                self.adopted.lock().insert(key);
            }
        }
    }

    /// The persistent devices in use (upstream `GetVolumesInUse`), by
    /// upstream's unique volume name (`kubernetes.io/csi/<driver>^<handle>`),
    /// sorted: those with a user (set up, being set up, failed while
    /// perhaps staged, or found so after a restart) and those pending
    /// unstage.
    pub fn volumes_in_use(&self) -> Vec<String> {
        let mut devices: BTreeSet<Device> = self.users.lock().keys().cloned().collect();
        devices.extend(self.unstage.lock().iter().cloned());
        let names: BTreeSet<String> = devices
            .iter()
            .map(|(driver, handle)| kubelet_csi::pod_volumes::unique_volume_name(driver, handle))
            .collect();
        names.into_iter().collect()
    }
}

/// The other mount points showing the staging path `staging`, read off
/// the async runtime, but those that are this staging path seen elsewhere
/// (upstream `HasMountRefs`: a ref containing the path from
/// `/plugins/kubernetes.io/` on is the kubelet's own).
async fn staging_refs(staging: &Path) -> Result<Vec<PathBuf>, kubelet_volume::Error> {
    let staging = staging.to_path_buf();
    let whole = staging.to_string_lossy().into_owned();
    let own = whole
        .find(PLUGIN_PATH_PREFIX)
        .map_or(whole.clone(), |i| whole[i..].to_string());
    let refs =
        tokio::task::spawn_blocking(move || kubelet_volume::mount::mount_refs_blocking(&staging))
            .await
            .map_err(|e| kubelet_volume::Error::Invalid(format!("GetDeviceMountRefs: {e}")))??;
    Ok(refs
        .into_iter()
        .filter(|r| !r.to_string_lossy().contains(&own))
        .collect())
}

/// Where upstream's plugin paths start (`kubernetesPluginPathPrefix`).
const PLUGIN_PATH_PREFIX: &str = "/plugins/kubernetes.io/";

/// The directory the volume manager keeps for a set-up volume: for CSI,
/// the directory holding `vol_data.json` and the `mount` target.
pub(crate) fn volume_dir(m: &MountedVolume) -> PathBuf {
    if m.plugin == names::CSI && !m.block {
        m.host_path
            .parent()
            .map_or_else(|| m.host_path.clone(), Path::to_path_buf)
    } else {
        m.host_path.clone()
    }
}
