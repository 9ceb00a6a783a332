//! What the plugin reads back from disk and asks of mounted volumes
//! (upstream `csi_plugin.go` `ConstructVolumeSpec`, `csi_metrics.go`,
//! `expander.go`): volumes rebuilt from `vol_data.json` after a kubelet
//! restart, `NodeGetVolumeStats`, and `NodeExpandVolume`.

use std::path::PathBuf;

use crate::client::{VolumeStats, csi_access_mode, volume_capability};
use crate::paths::{keys, load_volume_data};
use crate::plugin::{CsiPlugin, LIFECYCLE_PERSISTENT};
use crate::{Error, Result, pb};

/// A pod's CSI volume found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconstructedVolume {
    /// The spec name (PV name or pod volume name).
    pub spec_name: String,
    /// The CSI driver.
    pub driver: String,
    /// The volume handle.
    pub volume_handle: String,
    /// `Persistent` or `Ephemeral`.
    pub lifecycle_mode: String,
    /// The VolumeAttachment name recorded at publish.
    pub attachment_id: String,
    /// The publish target.
    pub target: PathBuf,
    /// Whether something is mounted on the target now.
    pub mounted: bool,
}

impl CsiPlugin {
    /// The CSI volumes of pod `pod_uid` on disk, from each volume's
    /// `vol_data.json`; a directory without a readable file is skipped
    /// (and logged) without skipping the pod's other volumes, as upstream's
    /// reconstruction does; a target whose mount state cannot be read
    /// counts as mounted.
    pub async fn reconstruct(&self, pod_uid: &str) -> Result<Vec<ReconstructedVolume>> {
        let dir = self.layout.pod_csi_dir(pod_uid);
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("failed to read", dir)(e)),
        };
        let mut out = Vec::new();
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(Error::io("failed to read", &dir))?
        {
            let vol_dir = entry.path();
            let target = vol_dir.join("mount");
            // Unknown counts as mounted: nothing is unstaged under it.
            let mounted = kubelet_volume::mount::is_mount_point(&target)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(target = %target.display(), error = %e, "Cannot tell whether a CSI volume is mounted; taking it as mounted");
                    true
                });
            let data = match load_volume_data(&vol_dir).await {
                Ok(d) => d,
                // Only this volume is skipped; its tear-down refuses to
                // remove it while mounted, and its device is not unstaged
                // while the mount shows the staging path.
                Err(e) if mounted => {
                    tracing::warn!(dir = %vol_dir.display(), error = %e, "CSI volume without readable volume data is still mounted; keeping it as in use");
                    if let Some(v) = self.staged_behind(&vol_dir, &target).await {
                        out.push(v);
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(dir = %vol_dir.display(), error = %e, "Skipping CSI volume without volume data");
                    continue;
                }
            };
            let get = |k: &str| data.get(k).cloned().unwrap_or_default();
            let mode = get(keys::VOLUME_LIFECYCLE_MODE);
            out.push(ReconstructedVolume {
                spec_name: get(keys::SPEC_VOL_ID),
                driver: get(keys::DRIVER_NAME),
                volume_handle: get(keys::VOLUME_HANDLE),
                lifecycle_mode: if mode.is_empty() {
                    LIFECYCLE_PERSISTENT.into()
                } else {
                    mode
                },
                attachment_id: get(keys::ATTACHMENT_ID),
                target,
                mounted,
            });
        }
        out.sort_by(|a, b| a.spec_name.cmp(&b.spec_name));
        Ok(out)
    }

    /// A mounted volume without its own volume data, as the device whose
    /// staging path its target shows (found by the mount's other
    /// references, read from the device's `vol_data.json`), so the device
    /// counts as in use; `None` when no such device is found.
    async fn staged_behind(
        &self,
        vol_dir: &std::path::Path,
        target: &std::path::Path,
    ) -> Option<ReconstructedVolume> {
        let t = target.to_path_buf();
        let refs =
            tokio::task::spawn_blocking(move || kubelet_volume::mount::mount_refs_blocking(&t))
                .await
                .ok()?
                .ok()?;
        let plugin_dir = self.layout.plugin_dir();
        for r in refs {
            if !r.starts_with(&plugin_dir) || !r.ends_with(crate::paths::GLOBAL_MOUNT) {
                continue;
            }
            let Some(device_dir) = r.parent() else {
                continue;
            };
            let Ok(data) = load_volume_data(device_dir).await else {
                continue;
            };
            let get = |k: &str| data.get(k).cloned().unwrap_or_default();
            return Some(ReconstructedVolume {
                spec_name: vol_dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                driver: get(keys::DRIVER_NAME),
                volume_handle: get(keys::VOLUME_HANDLE),
                lifecycle_mode: LIFECYCLE_PERSISTENT.into(),
                attachment_id: String::new(),
                target: target.to_path_buf(),
                mounted: true,
            });
        }
        None
    }

    /// Usage of the filesystem volume `spec_name` of pod `pod_uid` from the
    /// driver (`NodeGetVolumeStats`); `None` when the driver lacks
    /// `GET_VOLUME_STATS` (upstream then reports no metrics).
    pub async fn volume_stats(
        &self,
        pod_uid: &str,
        spec_name: &str,
    ) -> Result<Option<VolumeStats>> {
        let data = load_volume_data(&self.layout.pod_volume_dir(pod_uid, spec_name)).await?;
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let (driver, handle) = (get(keys::DRIVER_NAME), get(keys::VOLUME_HANDLE));
        let client = self.client(&driver).await?;
        let caps = client.node_capabilities(self.timeouts.probe).await?;
        if !caps.get_volume_stats {
            return Ok(None);
        }
        let staging = (caps.stage_unstage
            && get(keys::VOLUME_LIFECYCLE_MODE) != crate::plugin::LIFECYCLE_EPHEMERAL)
            .then(|| self.layout.device_mount_path(&driver, &handle));
        let target = self.layout.target_path(pod_uid, spec_name);
        let stats = client
            .node_volume_stats(&handle, &target, staging.as_deref(), self.timeouts.probe)
            .await?;
        Ok(Some(stats))
    }

    /// Grows the filesystem of a published volume to `new_size` bytes
    /// (`NodeExpandVolume`); `None` when the driver lacks `EXPAND_VOLUME`
    /// (the resize needs no node step). Returns the driver's new capacity.
    pub async fn expand(
        &self,
        pod_uid: &str,
        spec_name: &str,
        new_size: i64,
        fs_type: &str,
        access_mode: &str,
    ) -> Result<Option<i64>> {
        let opts = ExpandOptions {
            fs_type,
            access_mode,
            ..ExpandOptions::default()
        };
        self.expand_with(pod_uid, spec_name, new_size, opts).await
    }

    /// [`CsiPlugin::expand`] with the PV's mount options and the secrets
    /// of its `nodeExpandSecretRef` (upstream `nodeExpandWithClient`).
    pub async fn expand_with(
        &self,
        pod_uid: &str,
        spec_name: &str,
        new_size: i64,
        opts: ExpandOptions<'_>,
    ) -> Result<Option<i64>> {
        let data = load_volume_data(&self.layout.pod_volume_dir(pod_uid, spec_name)).await?;
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let (driver, handle) = (get(keys::DRIVER_NAME), get(keys::VOLUME_HANDLE));
        let client = self.client(&driver).await?;
        let caps = client.node_capabilities(self.timeouts.probe).await?;
        if !caps.expand_volume {
            return Ok(None);
        }
        let staging = caps
            .stage_unstage
            .then(|| self.layout.device_mount_path(&driver, &handle));
        let req = pb::NodeExpandVolumeRequest {
            volume_id: handle,
            volume_path: self
                .layout
                .target_path(pod_uid, spec_name)
                .to_string_lossy()
                .into_owned(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: new_size,
                limit_bytes: 0,
            }),
            staging_target_path: staging
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            volume_capability: Some(volume_capability(
                csi_access_mode(opts.access_mode, caps.single_node_multi_writer),
                opts.fs_type,
                opts.mount_options,
                None,
            )),
            secrets: opts.secrets,
        };
        client
            .node_expand(req, self.timeouts.operation)
            .await
            .map(Some)
            .map_err(|e| e.phase("MountVolume.NodeExpandVolume", spec_name))
    }
}

/// What a `NodeExpandVolume` carries beside the volume and its size.
#[derive(Debug, Default)]
pub struct ExpandOptions<'a> {
    /// The PV's `csi.fsType`.
    pub fs_type: &'a str,
    /// The PV's first access mode (`ReadWriteOnce` when it has none).
    pub access_mode: &'a str,
    /// The PV's `mountOptions`.
    pub mount_options: &'a [String],
    /// The data of the PV's `csi.nodeExpandSecretRef`.
    pub secrets: std::collections::HashMap<String, String>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::Timeouts;
    use crate::paths::{keys, save_volume_data};
    use crate::tests::{DRIVER, env};

    #[tokio::test]
    async fn a_volume_without_readable_data_skips_only_itself() {
        let e = env(Timeouts::default());
        let layout = e.plugin.layout();
        let broken = layout.pod_volume_dir("u1", "pv-broken");
        tokio::fs::create_dir_all(&broken).await.expect("dir");
        tokio::fs::write(broken.join(crate::paths::VOL_DATA_FILE), "{not json")
            .await
            .expect("garbage");
        let good = layout.pod_volume_dir("u1", "pv-good");
        tokio::fs::create_dir_all(&good).await.expect("dir");
        let data = BTreeMap::from([
            (keys::DRIVER_NAME.to_string(), DRIVER.to_string()),
            (keys::VOLUME_HANDLE.to_string(), "h1".to_string()),
            (keys::SPEC_VOL_ID.to_string(), "pv-good".to_string()),
        ]);
        save_volume_data(&good, &data).await.expect("save");
        let found = e.plugin.reconstruct("u1").await.expect("reconstructed");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].spec_name, "pv-good");
        assert_eq!(found[0].volume_handle, "h1");
        // No mode recorded: persistent, as an older kubelet's volume.
        assert_eq!(found[0].lifecycle_mode, "Persistent");
        assert!(!found[0].mounted);
    }

    /// Unmounts its paths, in order, when dropped (a failed assertion too).
    struct Unmount(Vec<std::path::PathBuf>);

    impl Drop for Unmount {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = kubelet_volume::mount::unmount_blocking(p);
            }
        }
    }

    #[tokio::test]
    async fn a_mounted_volume_without_readable_data_is_its_staged_device_in_use() {
        let e = env(Timeouts::default());
        let layout = e.plugin.layout();
        let staging = layout.device_mount_path(DRIVER, "h2");
        let device_dir = staging.parent().expect("device dir").to_path_buf();
        let dir = layout.pod_volume_dir("u1", "pv-2");
        let target = dir.join("mount");
        for d in [&staging, &target] {
            tokio::fs::create_dir_all(d).await.expect("dir");
        }
        let data = BTreeMap::from([
            (keys::DRIVER_NAME.to_string(), DRIVER.to_string()),
            (keys::VOLUME_HANDLE.to_string(), "h2".to_string()),
        ]);
        save_volume_data(&device_dir, &data).await.expect("save");
        let _unmount = Unmount(vec![target.clone(), staging.clone()]);
        if kubelet_volume::mount::mount_tmpfs(&staging, None, 0o755)
            .await
            .is_err()
        {
            eprintln!("skipped: mounting needs root");
            return;
        }
        kubelet_volume::mount::bind_mount(&staging, &target, false)
            .await
            .expect("bind");
        tokio::fs::write(dir.join(crate::paths::VOL_DATA_FILE), "{not json")
            .await
            .expect("garbage");
        let found = e.plugin.reconstruct("u1").await.expect("reconstructed");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].driver, DRIVER);
        assert_eq!(found[0].volume_handle, "h2");
        assert_eq!(found[0].lifecycle_mode, "Persistent");
        assert!(found[0].mounted);
    }
}
