//! [`ImageGcRuntime`] over CRI: the image and runtime services of a
//! [`cri::RemoteRuntime`] (each call under `--runtime-request-timeout`), and
//! `statvfs` of the image filesystem's mountpoint off the async runtime,
//! as upstream's CRI stats provider asks cAdvisor for it.

use std::collections::HashSet;
use std::time::Duration;

use cri::{ImageService, RemoteRuntime, RuntimeService};

use crate::{FsStats, ImageGcError, ImageGcRuntime, ImageInfo};

/// The CRI runtime as image garbage collection reads it.
#[derive(Clone, Debug)]
pub struct CriImageRuntime {
    remote: RemoteRuntime,
}

impl CriImageRuntime {
    /// Reads `remote`.
    pub fn new(remote: RemoteRuntime) -> Self {
        Self { remote }
    }
}

#[async_trait::async_trait]
impl ImageGcRuntime for CriImageRuntime {
    async fn list_images(&self) -> Result<Vec<ImageInfo>, ImageGcError> {
        let images = self.remote.list_images().await?;
        Ok(images
            .into_iter()
            .map(|i| ImageInfo {
                id: i.id,
                repo_tags: i.repo_tags,
                repo_digests: i.repo_digests,
                size: i.size,
                pinned: i.pinned,
            })
            .collect())
    }

    async fn container_images(&self) -> Result<HashSet<String>, ImageGcError> {
        let containers = self.remote.list_containers(None).await?;
        let mut refs = HashSet::new();
        for c in containers {
            if !c.image_ref.is_empty() {
                refs.insert(c.image_ref);
            }
            if let Some(spec) = c.image
                && !spec.image.is_empty()
            {
                refs.insert(spec.image);
            }
        }
        Ok(refs)
    }

    async fn image_id(&self, reference: &str) -> Result<Option<String>, ImageGcError> {
        Ok(self.remote.image_status(reference).await?.map(|i| i.id))
    }

    async fn runtime_sandbox_image(&self) -> Result<Option<String>, ImageGcError> {
        let timeout = self.remote.timeout();
        let mut client = self.remote.runtime_client();
        let mut req = tonic::Request::new(cri::pb::StatusRequest { verbose: true });
        req.set_timeout(timeout);
        let resp = match tokio::time::timeout(timeout, client.status(req)).await {
            Err(_) => {
                return Err(cri::CriError::Timeout {
                    op: "Status",
                    timeout,
                }
                .into());
            }
            Ok(Err(status)) => {
                return Err(
                    cri::CriError::from_status_with_deadline("Status", status, timeout).into(),
                );
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        Ok(resp.info.get("config").and_then(|c| sandbox_image_of(c)))
    }

    async fn remove_image(&self, id: &str) -> Result<(), ImageGcError> {
        Ok(self.remote.remove_image(id).await?)
    }

    async fn image_fs_stats(&self) -> Result<FsStats, ImageGcError> {
        let info = self.remote.image_fs_info().await?;
        let fs = info
            .image_filesystems
            .into_iter()
            .next()
            .ok_or(ImageGcError::NoImageFilesystem)?;
        let mountpoint = fs
            .fs_id
            .map(|id| id.mountpoint)
            .filter(|m| !m.is_empty())
            .ok_or(ImageGcError::NoImageFilesystem)?;
        let images_used = fs.used_bytes.map(|u| u.value).unwrap_or_default();
        let (capacity, available) = statvfs(&mountpoint, self.remote.timeout()).await?;
        Ok(FsStats {
            mountpoint,
            capacity,
            available,
            images_used,
        })
    }
}

/// The sandbox image in the runtime's verbose status `config` (containerd
/// 1.x `sandboxImage`; 2.x `pinnedImages.sandbox`).
fn sandbox_image_of(config: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(config).ok()?;
    v.get("sandboxImage")
        .or_else(|| v.get("pinnedImages").and_then(|p| p.get("sandbox")))
        .and_then(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .map(String::from)
}

/// Capacity and available bytes of the filesystem at `mountpoint`, read on
/// a blocking thread within `timeout`.
async fn statvfs(mountpoint: &str, timeout: Duration) -> Result<(u64, u64), ImageGcError> {
    let path = mountpoint.to_string();
    let task = tokio::task::spawn_blocking(move || nix::sys::statvfs::statvfs(path.as_str()));
    let stat = match tokio::time::timeout(timeout, task).await {
        Err(_) => {
            return Err(ImageGcError::StatvfsTimeout {
                mountpoint: mountpoint.to_string(),
                timeout,
            });
        }
        Ok(Err(_)) => {
            return Err(ImageGcError::StatvfsTask {
                mountpoint: mountpoint.to_string(),
            });
        }
        Ok(Ok(r)) => r.map_err(|source| ImageGcError::Statvfs {
            mountpoint: mountpoint.to_string(),
            source,
        })?,
    };
    // The field widths differ between targets (`fsblkcnt_t`, `c_ulong`).
    #[allow(clippy::useless_conversion)]
    let (frag, blocks, avail) = (
        u64::from(stat.fragment_size()),
        u64::from(stat.blocks()),
        u64::from(stat.blocks_available()),
    );
    Ok((blocks.saturating_mul(frag), avail.saturating_mul(frag)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_image_is_read_from_containerd_1_and_2_status_config() {
        let v1 = r#"{"containerd":{"snapshotter":"overlayfs"},"sandboxImage":"localhost:5000/pause:3.9"}"#;
        assert_eq!(
            sandbox_image_of(v1).as_deref(),
            Some("localhost:5000/pause:3.9")
        );
        let v2 = r#"{"pinnedImages":{"sandbox":"registry.k8s.io/pause:3.10"}}"#;
        assert_eq!(
            sandbox_image_of(v2).as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(sandbox_image_of(r#"{"sandboxImage":""}"#), None);
        assert_eq!(sandbox_image_of("not json"), None);
    }

    #[tokio::test]
    async fn statvfs_reads_a_real_filesystem() {
        let (capacity, available) = statvfs("/", Duration::from_secs(10))
            .await
            .expect("statvfs /");
        assert!(capacity > 0);
        assert!(available <= capacity);
        let err = statvfs("/no/such/dir", Duration::from_secs(10))
            .await
            .expect_err("missing");
        assert!(matches!(err, ImageGcError::Statvfs { .. }), "{err}");
    }
}
