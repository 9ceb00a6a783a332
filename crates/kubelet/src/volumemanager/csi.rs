//! CSI volumes in the volume manager (upstream `operationexecutor` for the
//! `kubernetes.io/csi` plugin: `MountVolume` with `WaitForAttach`,
//! `MountDevice` and `SetUp`, `UnmountVolume`, `UnmountDevice`, and the
//! reconstruction of mounted volumes after a restart).
//!
//! An inline `csi:` volume, a claim bound to a PV with `spec.csi` and a
//! generic ephemeral volume's claim go to [`kubelet_csi::CsiPlugin`].
//! Operations on one device (driver and volume handle) run one at a time;
//! operations on other devices never wait for them. The device is unstaged
//! when the last pod using it has its volume torn down; a failed unstage is
//! retried by [`CsiVolumes::retry_unstages`]. Volumes found mounted after a
//! restart are adopted: the pod's first set-up takes the mount as it is,
//! without calling the driver.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use kubelet_csi::paths::{keys, load_volume_data};
use kubelet_csi::plugin::LIFECYCLE_PERSISTENT;
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
    /// Pods with a persistent volume of the device published.
    users: Mutex<HashMap<Device, BTreeSet<PodVolume>>>,
    /// Volumes found mounted after a restart, not yet claimed by their pod.
    adopted: Mutex<HashSet<PodVolume>>,
    /// Devices whose unstage failed after their last pod went.
    unstage: Mutex<HashSet<Device>>,
    /// The size each device was last grown to on this node.
    expanded: Mutex<HashMap<Device, i64>>,
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
            adopted: Mutex::default(),
            unstage: Mutex::default(),
            expanded: Mutex::default(),
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
        if pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
            return Some(Err(kubelet_volume::Error::Unsupported {
                volume: volume.name.clone(),
                kind: "block-mode PersistentVolume".into(),
            }));
        }
        let mounted = self
            .set_up_csi(pod, volume, CsiVolume::Persistent { pv, read_only })
            .await;
        if mounted.is_ok()
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
            .is_some_and(|s| *s >= size);
        if !done {
            let uid = kubelet_types::pod::uid(pod);
            let lock = self.lock(&device);
            let _held = lock.lock().await;
            self.plugin
                .node_expand(uid, pv, size)
                .await
                .map_err(plugin_error)?;
            self.expanded.lock().insert(device, size);
        }
        if let Err(e) = self.plugin.mark_resize_finished(pv, pvc).await {
            warn!(error = %e, "Could not record the finished resize in the claim's status; will retry");
        }
        Ok(())
    }

    async fn set_up_csi(
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
        let republish = self
            .plugin
            .requires_republish(&facts.driver)
            .await
            .unwrap_or(false);
        let lock = self.lock(&device);
        let _held = lock.lock().await;
        let target = self.plugin.layout().target_path(&uid, &facts.spec_name);
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
            self.users
                .lock()
                .entry(device.clone())
                .or_default()
                .insert(key);
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
        let data = match load_volume_data(dir).await {
            Ok(d) => d,
            Err(e) => return self.remove_unpublished(dir, e).await,
        };
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let device = (get(keys::DRIVER_NAME), get(keys::VOLUME_HANDLE));
        let lock = self.lock(&device);
        let _held = lock.lock().await;
        let torn = self
            .plugin
            .tear_down(&uid, &spec_name)
            .await
            .map_err(plugin_error)?;
        self.adopted
            .lock()
            .remove(&(uid.clone(), spec_name.clone()));
        self.plugin.forget_pod_volume(&uid, &spec_name);
        if torn.lifecycle_mode != LIFECYCLE_PERSISTENT {
            return Ok(());
        }
        let last = {
            let mut users = self.users.lock();
            let set = users.entry(device.clone()).or_default();
            set.remove(&(uid, spec_name));
            let last = set.is_empty();
            if last {
                users.remove(&device);
            }
            last
        };
        if last && let Err(e) = self.plugin.unmount_device(&device.0, &device.1).await {
            // The pod's volume is gone; the device is unstaged later.
            warn!(driver = %device.0, volume_handle = %device.1, error = %e, "UnmountDevice failed; will retry");
            self.unstage.lock().insert(device);
        }
        Ok(())
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
            match self.plugin.unmount_device(&device.0, &device.1).await {
                Ok(()) => {
                    self.unstage.lock().remove(&device);
                }
                Err(e) => {
                    warn!(driver = %device.0, volume_handle = %device.1, error = %e, "UnmountDevice failed; will retry");
                }
            }
        }
    }

    /// Records the CSI volumes of pod `uid` found on disk after a restart:
    /// mounted ones are adopted, and persistent ones count as users of
    /// their device.
    pub async fn reconstruct(&self, uid: &str) {
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

    /// The persistent devices pods use (published, staged, or found so
    /// after a restart), by upstream's unique volume name
    /// (`kubernetes.io/csi/<driver>^<handle>`), sorted.
    pub fn volumes_in_use(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .users
            .lock()
            .keys()
            .map(|(driver, handle)| kubelet_csi::pod_volumes::unique_volume_name(driver, handle))
            .collect();
        names.sort();
        names
    }

    /// The CSI volumes published for pods, as `(pod uid, spec name)`.
    pub fn published(&self) -> Vec<PodVolume> {
        self.users.lock().values().flatten().cloned().collect()
    }
}

/// The directory the volume manager keeps for a set-up volume: for CSI,
/// the directory holding `vol_data.json` and the `mount` target.
pub(crate) fn volume_dir(m: &MountedVolume) -> PathBuf {
    if m.plugin == names::CSI {
        m.host_path
            .parent()
            .map_or_else(|| m.host_path.clone(), Path::to_path_buf)
    } else {
        m.host_path.clone()
    }
}
