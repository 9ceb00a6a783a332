//! Staging a volume on the node (upstream `csi_attacher.go` `MountDevice` /
//! `UnmountDevice` and `csi_block.go` `SetUpDevice`), and the whole mount
//! sequence the volume manager runs per pod volume: wait for attach, stage,
//! publish.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use crate::attach::{skip_attach, wait_for_attach};
use crate::client::{csi_access_mode, to_map, volume_capability};
use crate::mounter::{MountedCsiVolume, pod_fs_group, remove_mount_dir, secrets};
use crate::paths::{keys, load_volume_data, save_volume_data};
use crate::plugin::{CsiPlugin, CsiVolume, check_lifecycle_mode, pod_uid};
use crate::{Error, Result, pb};

impl CsiPlugin {
    /// The whole mount of one volume for `pod`: lifecycle-mode check, the
    /// attach wait when the driver needs attaching, staging when the driver
    /// stages (persistent volumes only), then publish. Errors carry
    /// upstream's phase text for the `FailedMount` event.
    pub async fn set_up(&self, pod: &Pod, volume: CsiVolume<'_>) -> Result<MountedCsiVolume> {
        let facts = volume.facts(pod_uid(pod))?;
        let name = facts.spec_name.clone();
        if matches!(volume, CsiVolume::Inline(_)) {
            return self
                .set_up_at(pod, volume, None, &BTreeMap::new())
                .await
                .map_err(|e| e.phase("MountVolume.SetUp", &name));
        }
        let csi_driver = self
            .host
            .csi_driver(&facts.driver)
            .await
            .map_err(|e| e.phase("MountVolume.SetUp", &name))?;
        check_lifecycle_mode(&facts.driver, csi_driver.as_ref(), facts.lifecycle_mode).map_err(
            |e| {
                e.step("mounter.SetupAt failed to check volume lifecycle mode")
                    .phase("MountVolume.SetUp", &name)
            },
        )?;
        let publish_context = if skip_attach(csi_driver.as_ref()) {
            BTreeMap::new()
        } else {
            wait_for_attach(
                self.host.as_ref(),
                &facts.driver,
                &facts.volume_handle,
                self.timeouts.attach,
                self.timeouts.attach_poll,
            )
            .await
            .map_err(|e| e.phase("MountVolume.WaitForAttach", &name))?
            .1
        };
        let staging = self
            .mount_device(pod, volume, &publish_context)
            .await
            .map_err(|e| e.phase("MountVolume.MountDevice", &name))?;
        self.set_up_at(pod, volume, staging.as_deref(), &publish_context)
            .await
            .map_err(|e| e.phase("MountVolume.SetUp", &name))
    }

    /// Stages a persistent volume (upstream `MountDevice`): saves
    /// `vol_data.json` beside the staging path, then `NodeStageVolume` when
    /// the driver has `STAGE_UNSTAGE_VOLUME`. Returns the staging path the
    /// publish call passes on, or `None` when the driver does not stage.
    pub async fn mount_device(
        &self,
        pod: &Pod,
        volume: CsiVolume<'_>,
        publish_context: &BTreeMap<String, String>,
    ) -> Result<Option<PathBuf>> {
        let CsiVolume::Persistent { pv, .. } = volume else {
            return Ok(None);
        };
        let facts = volume.facts(pod_uid(pod))?;
        let spec = pv.spec.as_ref();
        let csi = spec.and_then(|s| s.csi.as_ref());
        let (staging, data_dir) = if facts.block {
            let p = self.layout.block_staging_path(&facts.spec_name);
            (p, self.layout.block_data_dir(&facts.spec_name))
        } else {
            let p = self
                .layout
                .device_mount_path(&facts.driver, &facts.volume_handle);
            let d = p.parent().map(Path::to_path_buf).unwrap_or_default();
            (p, d)
        };
        if !facts.block && kubelet_volume::mount::is_mount_point(&staging).await? {
            tracing::debug!(staging = %staging.display(), "Skipping stage, already mounted");
            return Ok(Some(staging));
        }
        let client = self
            .client(&facts.driver)
            .await
            .map_err(|e| e.step("attacher.MountDevice failed to create newCsiDriverClient"))?;
        let caps = client.node_capabilities(self.timeouts.probe).await?;
        for dir in [&staging, &data_dir] {
            if facts.block && dir == &staging && !caps.stage_unstage {
                continue;
            }
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(Error::io("attacher.MountDevice failed to create dir", dir))?;
        }
        let mut data = BTreeMap::new();
        data.insert(keys::VOLUME_HANDLE.to_string(), facts.volume_handle.clone());
        data.insert(keys::DRIVER_NAME.to_string(), facts.driver.clone());
        if facts.block {
            data.insert(keys::SPEC_VOL_ID.to_string(), facts.spec_name.clone());
            data.insert(
                keys::NODE_NAME.to_string(),
                self.host.node_name().to_string(),
            );
        }
        save_volume_data(&data_dir, &data).await?;
        if !caps.stage_unstage {
            tracing::info!(driver = %facts.driver, "STAGE_UNSTAGE_VOLUME capability not set. Skipping MountDevice");
            return Ok(None);
        }

        let stage_secrets = match csi.and_then(|c| c.node_stage_secret_ref.as_ref()) {
            Some(r) => secrets(self.host.as_ref(), r, "").await.map_err(|e| {
                Error::InvalidSpec(format!(
                    "fetching NodeStageSecretRef {}/{} failed: {e}",
                    r.namespace.as_deref().unwrap_or_default(),
                    r.name.as_deref().unwrap_or_default()
                ))
            })?,
            None => Default::default(),
        };
        let (fs_group, _) = pod_fs_group(pod);
        let mount_group = caps
            .volume_mount_group
            .then_some(fs_group)
            .flatten()
            .map(|g| g.to_string());
        let mount_flags = spec
            .and_then(|s| s.mount_options.clone())
            .unwrap_or_default();
        let req = pb::NodeStageVolumeRequest {
            volume_id: facts.volume_handle.clone(),
            publish_context: to_map(Some(publish_context)),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(volume_capability(
                csi_access_mode(&facts.access_mode, caps.single_node_multi_writer),
                &facts.fs_type,
                &mount_flags,
                mount_group,
            )),
            secrets: stage_secrets,
            volume_context: to_map(csi.and_then(|c| c.volume_attributes.as_ref())),
        };
        if let Err(e) = client.node_stage(req, self.timeouts.operation).await {
            if e.is_final()
                && !facts.block
                && let Err(cleanup) = remove_mount_dir(&staging).await
            {
                tracing::error!(dir = %staging.display(), error = %cleanup, "Removing the staging dir after a NodeStage error failed");
            }
            return Err(e);
        }
        tracing::info!(driver = %facts.driver, staging = %staging.display(), "CSI volume staged");
        Ok(Some(staging))
    }

    /// Unstages the filesystem volume `volume_handle` of `driver` (upstream
    /// `UnmountDevice`), once no pod uses it: `NodeUnstageVolume` when the
    /// driver stages, then the staging directory and `vol_data.json` go.
    /// Without the device's directory (which [`CsiPlugin::mount_device`]
    /// creates before staging, and a successful unstage removes) it was
    /// never staged here, or is unstaged already: nothing to do.
    pub async fn unmount_device(&self, driver: &str, volume_handle: &str) -> Result<()> {
        let staging = self.layout.device_mount_path(driver, volume_handle);
        let device_dir = staging.parent().unwrap_or(&staging);
        if let Err(e) = tokio::fs::symlink_metadata(device_dir).await
            && e.kind() == std::io::ErrorKind::NotFound
        {
            tracing::debug!(driver, volume_handle, dir = %device_dir.display(), "UnmountDevice: the device was never staged on this node");
            return Ok(());
        }
        self.unstage(&staging, driver, volume_handle, false)
            .await
            .map_err(|e| e.phase("UnmountDevice", volume_handle))
    }

    /// Unstages the block volume `spec_name` (upstream `TearDownDevice`)
    /// once no pod uses it, then removes its metadata and empty directories
    /// (best effort, as upstream's `cleanupOrphanDeviceFiles`). Without
    /// `vol_data.json` (which [`CsiPlugin::mount_device`] writes before
    /// staging, and a successful unstage removes) it was never staged here,
    /// or is unstaged already: nothing to do.
    pub async fn unmount_block_device(&self, spec_name: &str) -> Result<()> {
        let data_dir = self.layout.block_data_dir(spec_name);
        let vol_data = data_dir.join(crate::paths::VOL_DATA_FILE);
        if let Err(e) = tokio::fs::symlink_metadata(&vol_data).await
            && e.kind() == std::io::ErrorKind::NotFound
        {
            tracing::debug!(
                spec_name,
                "UnmapDevice: the block volume was never staged on this node"
            );
            return Ok(());
        }
        let data = load_volume_data(&data_dir).await?;
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let staging = self.layout.block_staging_path(spec_name);
        self.unstage(
            &staging,
            &get(keys::DRIVER_NAME),
            &get(keys::VOLUME_HANDLE),
            true,
        )
        .await
        .map_err(|e| e.phase("UnmapDevice", spec_name))?;
        remove_if_present(&vol_data, true).await?;
        for dir in [
            data_dir.clone(),
            self.layout.volume_devices_dir().join(spec_name),
            self.layout.block_publish_dir(spec_name),
        ] {
            if let Err(e) = remove_if_present(&dir, false).await {
                tracing::warn!(dir = %dir.display(), error = %e, "UnmapDevice: could not remove a block volume directory");
            }
        }
        Ok(())
    }

    async fn unstage(
        &self,
        staging: &Path,
        driver: &str,
        volume_handle: &str,
        block: bool,
    ) -> Result<()> {
        let client = self
            .client(driver)
            .await
            .map_err(|e| e.step("attacher.UnmountDevice failed to create newCsiDriverClient"))?;
        let caps = client.node_capabilities(self.timeouts.probe).await?;
        if caps.stage_unstage {
            client
                .node_unstage(volume_handle, staging, self.timeouts.operation)
                .await?;
        }
        if block {
            // Only the volume's own staging directory: siblings are other volumes.
            remove_if_present(staging, false).await?;
        } else {
            remove_mount_dir(staging).await.map_err(|e| {
                e.step(format!(
                    "failed to clean up global mount {}",
                    staging.display()
                ))
            })?;
        }
        tracing::info!(driver, staging = %staging.display(), staged = caps.stage_unstage, "CSI volume unstaged");
        Ok(())
    }
}

/// Removes a file or an empty directory; a missing one is fine.
async fn remove_if_present(path: &Path, file: bool) -> Result<()> {
    let r = if file {
        tokio::fs::remove_file(path).await
    } else {
        tokio::fs::remove_dir(path).await
    };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io("failed to remove", path)(e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::Timeouts;
    use crate::pb::node_service_capability::rpc::Type as Cap;
    use crate::testing::Call;
    use crate::tests::{DRIVER, caps, env};

    #[tokio::test]
    async fn a_device_never_staged_here_needs_no_unstage_and_no_driver() {
        let e = env(Timeouts::default());
        // No driver registered: a call to it would fail.
        e.plugin
            .unmount_device(DRIVER, "never-staged")
            .await
            .expect("nothing to unstage");
    }

    #[tokio::test]
    async fn a_device_with_its_directory_is_unstaged_by_the_driver() {
        let e = env(Timeouts::default());
        let d = e.driver(caps(&[Cap::StageUnstageVolume])).await;
        let staging = e.plugin.layout().device_mount_path(DRIVER, "h1");
        tokio::fs::create_dir_all(&staging).await.expect("staging");
        e.plugin
            .unmount_device(DRIVER, "h1")
            .await
            .expect("unstaged");
        assert!(
            d.calls()
                .iter()
                .any(|c| matches!(c, Call::Unstage(r) if r.volume_id == "h1")),
            "{:?}",
            d.calls()
        );
        assert!(!staging.exists(), "the staging directory goes");
    }
}
