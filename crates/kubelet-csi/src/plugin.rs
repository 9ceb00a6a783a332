//! The CSI volume plugin (upstream `csi_plugin.go` `csiPlugin`): its
//! configuration and timeouts, the volume it is asked to serve (a CSI
//! PersistentVolume or an inline `csi:` pod volume), the CSIDriver facts it
//! acts on (lifecycle modes, podInfoOnMount, fsGroupPolicy, tokenRequests)
//! and finding a registered driver's client.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;

use crate::client::CsiClient;
use crate::drivers::DriversStore;
use crate::paths::{Layout, ephemeral_volume_handle};
use crate::registration::RegistrationHandler;
use crate::{CsiHost, Error, Result};

/// `Persistent`: a CSI PersistentVolume.
pub const LIFECYCLE_PERSISTENT: &str = "Persistent";
/// `Ephemeral`: an inline `csi:` pod volume.
pub const LIFECYCLE_EPHEMERAL: &str = "Ephemeral";

/// Deadlines of the plugin's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Each stage/publish/unpublish/unstage call (upstream `csiTimeout`, 2 min).
    pub operation: Duration,
    /// Capability, stats and expand calls.
    pub probe: Duration,
    /// Dialling a driver's socket.
    pub dial: Duration,
    /// Waiting for the VolumeAttachment (upstream `waitForAttachTimeout`, 10 min).
    pub attach: Duration,
    /// How often the VolumeAttachment is re-read while waiting.
    pub attach_poll: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            operation: Duration::from_secs(120),
            probe: Duration::from_secs(30),
            dial: Duration::from_secs(10),
            attach: Duration::from_secs(600),
            attach_poll: Duration::from_millis(500),
        }
    }
}

impl Timeouts {
    /// A bound on one whole set-up or tear-down (API reads, the attach
    /// wait, stage, publish, expand, or unpublish and unstage, each with
    /// its dial and capability probe), longer than the sum of their own
    /// deadlines, so those end an operation first.
    pub fn outer_bound(&self) -> Duration {
        self.attach + self.operation * 3 + (self.probe + self.dial) * 4 + Duration::from_secs(60)
    }
}

/// A volume the CSI plugin serves.
#[derive(Debug, Clone, Copy)]
pub enum CsiVolume<'a> {
    /// A PersistentVolume with `spec.csi` (bound through a PVC or a generic
    /// ephemeral volume); `read_only` is the PVC volume's `readOnly`.
    Persistent {
        /// The PV.
        pv: &'a PersistentVolume,
        /// The pod volume's `persistentVolumeClaim.readOnly`.
        read_only: bool,
    },
    /// An inline ephemeral volume (`volumes[].csi` in the pod spec).
    Inline(&'a Volume),
}

/// The parts of a [`CsiVolume`] every operation uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFacts {
    /// The spec name: PV name or pod volume name (the directory name).
    pub spec_name: String,
    /// The CSI driver.
    pub driver: String,
    /// The volume handle (generated for inline volumes).
    pub volume_handle: String,
    /// `Persistent` or `Ephemeral`.
    pub lifecycle_mode: &'static str,
    /// Read-only publish.
    pub read_only: bool,
    /// The fsType (`block` for raw block PVs).
    pub fs_type: String,
    /// The first access mode of the PV (`ReadWriteOnce` for inline volumes).
    pub access_mode: String,
    /// Whether the PV is `volumeMode: Block`.
    pub block: bool,
}

impl CsiVolume<'_> {
    /// Extracts the facts, or says why this is no CSI volume.
    pub fn facts(&self, pod_uid: &str) -> Result<VolumeFacts> {
        match self {
            CsiVolume::Persistent { pv, read_only } => {
                let spec = pv.spec.as_ref();
                let csi = spec.and_then(|s| s.csi.as_ref()).ok_or_else(|| {
                    Error::InvalidSpec("volume source not found in volume.Spec".into())
                })?;
                let block = spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
                Ok(VolumeFacts {
                    spec_name: pv.metadata.name.clone().unwrap_or_default(),
                    driver: csi.driver.clone(),
                    volume_handle: csi.volume_handle.clone(),
                    lifecycle_mode: LIFECYCLE_PERSISTENT,
                    read_only: *read_only || csi.read_only == Some(true),
                    fs_type: if block {
                        crate::client::FS_TYPE_BLOCK.to_string()
                    } else {
                        csi.fs_type.clone().unwrap_or_default()
                    },
                    access_mode: spec
                        .and_then(|s| s.access_modes.as_ref())
                        .and_then(|m| m.first().cloned())
                        .unwrap_or_else(|| "ReadWriteOnce".into()),
                    block,
                })
            }
            CsiVolume::Inline(v) => {
                let csi = v.csi.as_ref().ok_or_else(|| {
                    Error::InvalidSpec("volume source not found in volume.Spec".into())
                })?;
                Ok(VolumeFacts {
                    spec_name: v.name.clone(),
                    driver: csi.driver.clone(),
                    volume_handle: ephemeral_volume_handle(pod_uid, &v.name),
                    lifecycle_mode: LIFECYCLE_EPHEMERAL,
                    read_only: csi.read_only == Some(true),
                    fs_type: csi.fs_type.clone().unwrap_or_default(),
                    access_mode: "ReadWriteOnce".into(),
                    block: false,
                })
            }
        }
    }
}

/// Upstream `supportsVolumeLifecycleMode`: without a CSIDriver only
/// persistent volumes; with one, the modes it lists (default Persistent).
pub fn check_lifecycle_mode(
    driver: &str,
    csi_driver: Option<&CSIDriver>,
    mode: &str,
) -> Result<()> {
    let Some(d) = csi_driver else {
        if mode == LIFECYCLE_PERSISTENT {
            return Ok(());
        }
        return Err(Error::LifecycleModeUnsupported {
            mode: mode.into(),
            driver: driver.into(),
            supported: None,
        });
    };
    let modes = d
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec![LIFECYCLE_PERSISTENT.to_string()]);
    if modes.iter().any(|m| m == mode) {
        return Ok(());
    }
    Err(Error::LifecycleModeUnsupported {
        mode: mode.into(),
        driver: driver.into(),
        supported: Some(modes),
    })
}

/// The CSIDriver's `fsGroupPolicy` (default `ReadWriteOnceWithFSType`).
pub fn fs_group_policy(csi_driver: Option<&CSIDriver>) -> String {
    csi_driver
        .and_then(|d| d.spec.fs_group_policy.clone())
        .unwrap_or_else(|| "ReadWriteOnceWithFSType".into())
}

/// The CSI volume plugin of one kubelet.
///
/// The volume manager calls, per volume of a pod: [`CsiPlugin::set_up`]
/// (attach wait, stage, publish, fsGroup) and later
/// [`CsiPlugin::tear_down`] (unpublish) and, once no pod uses the volume,
/// [`CsiPlugin::unmount_device`] (unstage). After a restart
/// [`CsiPlugin::reconstruct`] lists what `vol_data.json` files say is
/// mounted. [`CsiPlugin::volume_stats`] and [`CsiPlugin::expand`] serve
/// `/stats/summary` and resizes.
pub struct CsiPlugin {
    pub(crate) host: Arc<dyn CsiHost>,
    pub(crate) drivers: Arc<DriversStore>,
    pub(crate) layout: Layout,
    pub(crate) timeouts: Timeouts,
    pub(crate) pod_volumes: crate::pod_volumes::PodVolumes,
}

impl CsiPlugin {
    /// A plugin for the kubelet whose `--root-dir` is `root_dir`.
    pub fn new(host: Arc<dyn CsiHost>, root_dir: impl Into<PathBuf>, timeouts: Timeouts) -> Self {
        Self {
            host,
            drivers: Arc::new(DriversStore::default()),
            layout: Layout::new(root_dir),
            timeouts,
            pod_volumes: Default::default(),
        }
    }

    /// The handler to register with the plugin manager for `CSIPlugin` sockets.
    pub fn registration_handler(&self) -> RegistrationHandler {
        RegistrationHandler::new(self.host.clone(), self.drivers.clone())
    }

    /// The apiserver as the plugin reads it.
    pub fn host(&self) -> &Arc<dyn CsiHost> {
        &self.host
    }

    /// The registered drivers.
    pub fn drivers(&self) -> &Arc<DriversStore> {
        &self.drivers
    }

    /// Where volumes live on disk.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The deadlines of the plugin's calls.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// A client of the registered driver `driver`.
    pub(crate) async fn client(&self, driver: &str) -> Result<CsiClient> {
        let d = self
            .drivers
            .get(driver)
            .ok_or_else(|| Error::DriverNotRegistered(driver.to_string()))?;
        CsiClient::connect(&d.endpoint, self.timeouts.dial).await
    }

    /// Whether `driver`'s CSIDriver asks for periodic re-publishing
    /// (`requiresRepublish`): the volume manager then calls `set_up` again
    /// for mounted volumes, as upstream's remount.
    pub async fn requires_republish(&self, driver: &str) -> Result<bool> {
        Ok(self
            .host
            .csi_driver(driver)
            .await?
            .is_some_and(|d| d.spec.requires_republish == Some(true)))
    }
}

/// The pod's uid.
pub(crate) fn pod_uid(pod: &Pod) -> &str {
    kubelet_types::pod::uid(pod)
}
