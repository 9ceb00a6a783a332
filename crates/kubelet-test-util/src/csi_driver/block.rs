//! Raw block volumes of the host-path driver (CSI `BlockVolume` access,
//! Kubernetes `volumeMode: Block`): the backing file of each volume, the
//! loop device bound to it while the volume is published somewhere, and
//! the rule that no loop device outlives its last publish, its volume's
//! DeleteVolume or the driver itself.

use std::path::{Path, PathBuf};

use kubelet_csi::pb;
use tonic::Status;

use super::{BLOCK_SIZE, CsiDriver, Driver, DriverConfig, Published, loopdev};

/// The regular file backing block volume `id`.
pub(crate) fn block_file(cfg: &DriverConfig, id: &str) -> PathBuf {
    cfg.data_dir.join(format!("{}.block", id.replace('/', "_")))
}

/// Creates the backing file of a block volume, `size` bytes (sparse), if
/// it is missing.
pub(crate) fn create_backing_file(file: &Path, size: u64) -> std::io::Result<()> {
    if file.exists() {
        return Ok(());
    }
    let size = if size == 0 { BLOCK_SIZE } else { size };
    std::fs::File::create(file)?.set_len(size)
}

/// Binds the loop device of `file` (attaching one if none is) onto the
/// file at `target`, creating the target and its parents when missing.
/// Blocking.
pub(crate) fn publish(file: &Path, target: &Path, readonly: bool) -> std::io::Result<()> {
    create_backing_file(file, BLOCK_SIZE)?;
    let dev = loopdev::attach(file, loopdev::DEADLINE)
        .map_err(|e| std::io::Error::other(format!("failed to get the loop device: {e}")))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if std::fs::symlink_metadata(target).is_err() {
        std::fs::File::create(target)?;
    }
    if !super::mount::is_mount_point(target) {
        super::mount::bind(&dev, target, readonly)?;
    }
    Ok(())
}

impl Driver {
    /// NodePublishVolume of a block volume, its checks done: the loop
    /// device bound onto the target file. A failed publish leaves no loop
    /// device no other publish uses.
    pub(crate) async fn publish_block(
        &self,
        r: pb::NodePublishVolumeRequest,
        want: Published,
    ) -> Result<pb::NodePublishVolumeResponse, Status> {
        let file = block_file(&self.config(), &r.volume_id);
        let target = PathBuf::from(&r.target_path);
        let _guard = self.0.block_lock.lock().await;
        self.0.volumes.lock().attached.insert(file.clone());
        let (f, t, readonly) = (file.clone(), target.clone(), r.readonly);
        let done = tokio::task::spawn_blocking(move || publish(&f, &t, readonly))
            .await
            .map_err(|e| Status::internal(e.to_string()))
            .and_then(|r| r.map_err(|e| Status::internal(e.to_string())));
        if let Err(e) = done {
            if let Err(release) = self.release_loop(&r.volume_id, file, &target).await {
                tracing::warn!(volume_id = %r.volume_id, error = %release, "test CSI driver kept a loop device after a failed publish");
            }
            return Err(e);
        }
        self.0.volumes.lock().published.insert(target, want);
        Ok(pb::NodePublishVolumeResponse {})
    }

    /// Whether a publish of block volume `volume_id` other than the one at
    /// `except` remains.
    pub(crate) fn block_published_elsewhere(&self, volume_id: &str, except: &Path) -> bool {
        self.0
            .volumes
            .lock()
            .published
            .iter()
            .any(|(t, p)| p.block && p.volume_id == volume_id && t != except)
    }

    /// Detaches the loop device of `file` (volume `volume_id`) unless a
    /// publish other than `except` still uses it. Call with the block lock
    /// held.
    pub(crate) async fn release_loop(
        &self,
        volume_id: &str,
        file: PathBuf,
        except: &Path,
    ) -> Result<(), Status> {
        if self.block_published_elsewhere(volume_id, except) {
            return Ok(());
        }
        let f = file.clone();
        let detached =
            tokio::task::spawn_blocking(move || loopdev::detach_all(&f, loopdev::DEADLINE))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(|e| Status::internal(format!("failed to detach the loop device: {e}")))?;
        if detached > 0 {
            tracing::debug!(
                volume_id,
                detached,
                "test CSI driver released a block volume's loop device"
            );
        }
        self.0.volumes.lock().attached.remove(&file);
        Ok(())
    }

    /// Detaches every loop device of block volume `volume_id` and removes
    /// its backing file (DeleteVolume).
    pub(crate) async fn delete_block(&self, volume_id: &str) -> Result<(), Status> {
        let file = block_file(&self.config(), volume_id);
        let _guard = self.0.block_lock.lock().await;
        let f = file.clone();
        tokio::task::spawn_blocking(move || {
            loopdev::detach_all(&f, loopdev::DEADLINE)?;
            match std::fs::remove_file(&f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(e.to_string()))?;
        self.0.volumes.lock().attached.remove(&file);
        Ok(())
    }

    /// Detaches the loop devices of every volume this driver attached one
    /// to, waiting for `losetup` on this thread (the driver's drop).
    pub(crate) fn detach_all_now(&self) {
        let files: Vec<PathBuf> = self.0.volumes.lock().attached.drain().collect();
        for file in files {
            match loopdev::detach_all(&file, loopdev::DEADLINE) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::debug!(file = %file.display(), n, "test CSI driver detached loop devices at its drop")
                }
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "test CSI driver could not detach a loop device")
                }
            }
        }
    }
}

impl CsiDriver {
    /// The regular file backing block volume `volume_id`
    /// (`<data_dir>/<volume id>.block`, `/` in the id as `_`), created by
    /// CreateVolume with a block capability or by the first stage or
    /// publish of the volume as a block volume ([`BLOCK_SIZE`] bytes). What
    /// a container writes to the device shows in this file.
    pub fn block_file(&self, volume_id: &str) -> PathBuf {
        block_file(&self.driver.config(), volume_id)
    }

    /// The loop device bound to block volume `volume_id`'s backing file
    /// (`losetup -j`), if one is: there is one while the volume is
    /// published somewhere.
    pub async fn loop_device(&self, volume_id: &str) -> std::io::Result<Option<PathBuf>> {
        let file = self.block_file(volume_id);
        let found = tokio::task::spawn_blocking(move || loopdev::find(&file, loopdev::DEADLINE))
            .await
            .map_err(std::io::Error::other)??;
        Ok(found.into_iter().next())
    }

    /// Detaches the loop devices of every block volume this driver
    /// attached one to, published or not (a test's end; dropping the
    /// driver does it too). Targets still bound to a device keep a device
    /// node without a backing file.
    pub async fn detach_loop_devices(&self) {
        let _guard = self.driver.0.block_lock.lock().await;
        let driver = self.driver.clone();
        let _ = tokio::task::spawn_blocking(move || driver.detach_all_now()).await;
    }
}
