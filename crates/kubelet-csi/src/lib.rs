//! CSI volumes for kubelet-rs (upstream `pkg/volume/csi`): the CSI spec 1.x
//! client, driver registration, stage/publish, inline ephemeral volumes.
//!
//! # Wiring (for the kubelet crate)
//!
//! 1. Implement [`CsiHost`] over the kubelet's apiserver client (CSIDriver,
//!    VolumeAttachment, PV, Secret, CSINode, Node metadata patch, token requests).
//! 2. Build one [`CsiPlugin::new`]`(host, root_dir, Timeouts::default())` and
//!    register [`CsiPlugin::registration_handler`] with the plugin manager
//!    for [`kubelet_pluginmanager::CSI_PLUGIN`] sockets; call
//!    [`nodeinfo::initialize_csi_node`] once the Node exists.
//! 3. The volume manager, per pod volume:
//!    - a PVC bound to a PV with `spec.csi` (also generic ephemeral volumes):
//!      [`CsiPlugin::set_up`] with [`CsiVolume::Persistent`]; an inline
//!      `csi:` volume: [`CsiPlugin::set_up`] with [`CsiVolume::Inline`].
//!      It returns [`MountedCsiVolume::path`], the host path containers
//!      bind-mount (for block volumes, the device file). Its errors'
//!      `Display` is upstream's event text
//!      (`MountVolume.SetUp failed for volume "pv-1" : ...`) for `FailedMount`.
//!      Drivers whose CSIDriver has `requiresRepublish` ([`CsiPlugin::requires_republish`])
//!      get `set_up` again periodically.
//!    - on pod removal: [`CsiPlugin::tear_down`] (block: [`CsiPlugin::tear_down_block`]);
//!      when the last pod using a persistent volume is gone:
//!      [`CsiPlugin::unmount_device`]`(driver, handle)` (block: [`CsiPlugin::unmount_block_device`]).
//!    - after a kubelet restart: [`CsiPlugin::reconstruct`]`(pod_uid)` lists
//!      mounted CSI volumes from `vol_data.json`, to adopt without remounting.
//!    - `/stats/summary`: [`CsiPlugin::volume_stats`] for the volumes the
//!      volume manager records ([`CsiPlugin::record_pod_volume`],
//!      [`CsiPlugin::pod_volumes`]; [`CsiPlugin::volumes_in_use`] for the
//!      node's `status.volumesInUse`); resize: [`resize::resize_required`],
//!      [`CsiPlugin::node_expand`], [`CsiPlugin::mark_resize_finished`].
//!
//! Every driver call has a deadline ([`Timeouts`]); one slow driver only
//! delays the operations on its own volumes.

pub mod attach;
pub mod client;
pub mod drivers;
pub mod error;
pub mod host;
mod mounter;
pub mod nodeinfo;
pub mod paths;
pub mod plugin;
pub mod pod_volumes;
pub mod reconstruct;
pub mod registration;
pub mod resize;
mod stager;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use host::CsiHost;
pub use mounter::{MountedCsiVolume, TornDown};
pub use plugin::{CsiPlugin, CsiVolume, Timeouts};
pub use pod_volumes::PodVolumeRef;
pub use reconstruct::ReconstructedVolume;
pub use registration::RegistrationHandler;

/// Generated CSI v1 messages, clients and servers (`proto/csi/v1/csi.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}
