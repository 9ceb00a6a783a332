//! The CSI Node service of the host-path test driver, with the spec's
//! answers: `InvalidArgument` for a missing volume id, path or
//! capability, `NotFound` for a volume the driver does not know,
//! `FailedPrecondition` for a publish of a volume that is not staged when
//! the driver stages, `AlreadyExists` for a target published differently,
//! and `OK` for every repeat of an operation already done (stage, publish,
//! unpublish, unstage are idempotent).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use kubelet_csi::pb;
use kubelet_csi::pb::node_server::Node;
use kubelet_csi::pb::node_service_capability::rpc::Type as Cap;
use kubelet_csi::pb::volume_capability::AccessType;
use tonic::{Request, Response, Status};

use super::block::{self, block_file};
use super::{
    BLOCK_SIZE, Driver, DriverConfig, EPHEMERAL_CONTEXT_KEY, Published, Request as Rec, loopdev,
    mount,
};

/// Where volume `id` lives: a directory for mount volumes.
pub(crate) fn volume_dir(cfg: &DriverConfig, id: &str) -> PathBuf {
    cfg.data_dir.join(id.replace('/', "_"))
}

fn required(value: &str, what: &str) -> Result<(), Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!(
            "{what} missing in request"
        )))
    } else {
        Ok(())
    }
}

fn io(e: std::io::Error) -> Status {
    Status::internal(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(io),
        Err(e) => Err(Status::internal(e.to_string())),
    }
}

fn is_block(cap: Option<&pb::VolumeCapability>) -> bool {
    matches!(
        cap.and_then(|c| c.access_type.as_ref()),
        Some(AccessType::Block(_))
    )
}

fn mount_group(cap: Option<&pb::VolumeCapability>) -> String {
    match cap.and_then(|c| c.access_type.as_ref()) {
        Some(AccessType::Mount(m)) => m.volume_mount_group.clone(),
        _ => String::new(),
    }
}

/// Gives group `gid` the volume directory, as a driver applying
/// VOLUME_MOUNT_GROUP does (setgid, group read/write).
fn apply_group(dir: &Path, gid: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let gid: u32 = gid
        .parse()
        .map_err(|_| std::io::Error::other(format!("invalid volume_mount_group {gid:?}")))?;
    nix::unistd::chown(dir, None, Some(nix::unistd::Gid::from_raw(gid)))?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o2070))
}

impl Driver {
    /// Whether the driver knows volume `id` (its data exists or it is staged
    /// or published somewhere).
    fn knows(&self, cfg: &DriverConfig, id: &str) -> bool {
        let v = self.0.volumes.lock();
        volume_dir(cfg, id).exists()
            || block_file(cfg, id).exists()
            || v.staged.contains_key(id)
            || v.published.values().any(|p| p.volume_id == id)
    }

    async fn stage(
        &self,
        r: pb::NodeStageVolumeRequest,
    ) -> Result<pb::NodeStageVolumeResponse, Status> {
        let cfg = self.config();
        if !cfg.stage_unstage {
            return Err(Status::unimplemented("STAGE_UNSTAGE_VOLUME is not offered"));
        }
        required(&r.volume_id, "Volume ID")?;
        required(&r.staging_target_path, "Staging target path")?;
        let Some(cap) = r.volume_capability.as_ref() else {
            return Err(Status::invalid_argument(
                "Volume Capability missing in request",
            ));
        };
        let staging = PathBuf::from(&r.staging_target_path);
        if let Some(at) = self.0.volumes.lock().staged.get(&r.volume_id)
            && *at != staging
        {
            return Err(Status::already_exists(format!(
                "volume {} is already staged at {}",
                r.volume_id,
                at.display()
            )));
        }
        let block = is_block(Some(cap));
        let group = mount_group(Some(cap));
        let dir = volume_dir(&cfg, &r.volume_id);
        let file = block_file(&cfg, &r.volume_id);
        let group_for = group.clone();
        blocking(move || {
            if block {
                block::create_backing_file(&file, BLOCK_SIZE)?;
                return std::fs::create_dir_all(&staging);
            }
            std::fs::create_dir_all(&dir)?;
            if !group_for.is_empty() {
                apply_group(&dir, &group_for)?;
            }
            std::fs::create_dir_all(&staging)?;
            if !mount::is_mount_point(&staging) {
                mount::bind(&dir, &staging, false)?;
            }
            Ok(())
        })
        .await?;
        let mut v = self.0.volumes.lock();
        v.staged
            .insert(r.volume_id.clone(), PathBuf::from(&r.staging_target_path));
        if !group.is_empty() {
            v.mount_groups.insert(r.volume_id.clone(), group);
        }
        Ok(pb::NodeStageVolumeResponse {})
    }

    async fn unstage(
        &self,
        r: pb::NodeUnstageVolumeRequest,
    ) -> Result<pb::NodeUnstageVolumeResponse, Status> {
        let cfg = self.config();
        required(&r.volume_id, "Volume ID")?;
        required(&r.staging_target_path, "Staging target path")?;
        if !self.knows(&cfg, &r.volume_id) {
            return Err(Status::not_found(format!(
                "volume id {} does not exist",
                r.volume_id
            )));
        }
        let staging = PathBuf::from(&r.staging_target_path);
        blocking(move || {
            if mount::is_mount_point(&staging) {
                mount::unmount(&staging)?;
            }
            Ok(())
        })
        .await?;
        self.0.volumes.lock().staged.remove(&r.volume_id);
        Ok(pb::NodeUnstageVolumeResponse {})
    }

    async fn publish(
        &self,
        r: pb::NodePublishVolumeRequest,
    ) -> Result<pb::NodePublishVolumeResponse, Status> {
        let cfg = self.config();
        required(&r.volume_id, "Volume ID")?;
        required(&r.target_path, "Target path")?;
        let Some(cap) = r.volume_capability.as_ref() else {
            return Err(Status::invalid_argument(
                "Volume Capability missing in request",
            ));
        };
        let block = is_block(Some(cap));
        let ephemeral = r
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .map(String::as_str)
            == Some("true");
        let want = Published {
            volume_id: r.volume_id.clone(),
            readonly: r.readonly,
            block,
            ephemeral,
        };
        let target = PathBuf::from(&r.target_path);
        if let Some(p) = self.0.volumes.lock().published.get(&target) {
            if *p == want && mount::is_mount_point(&target) {
                return Ok(pb::NodePublishVolumeResponse {});
            }
            if *p != want {
                return Err(Status::already_exists(format!(
                    "target {} is already published with another volume or mode",
                    r.target_path
                )));
            }
        }
        let staged_mount = cfg.stage_unstage && !ephemeral && !block;
        if cfg.stage_unstage && !ephemeral {
            if r.staging_target_path.is_empty() {
                return Err(Status::failed_precondition("staging target path not set"));
            }
            let staged = self.0.volumes.lock().staged.get(&r.volume_id).cloned();
            if staged.as_deref() != Some(Path::new(&r.staging_target_path)) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is not staged at {}",
                    r.volume_id, r.staging_target_path
                )));
            }
        }
        if block {
            return self.publish_block(r, want).await;
        }
        let source = if staged_mount {
            PathBuf::from(&r.staging_target_path)
        } else {
            volume_dir(&cfg, &r.volume_id)
        };
        let dir = volume_dir(&cfg, &r.volume_id);
        let group = mount_group(Some(cap));
        let readonly = r.readonly;
        let group_for = group.clone();
        blocking(move || {
            std::fs::create_dir_all(&dir)?;
            if !group_for.is_empty() {
                apply_group(&dir, &group_for)?;
            }
            std::fs::create_dir_all(&target)?;
            if !mount::is_mount_point(&target) {
                mount::bind(&source, &target, readonly)?;
            }
            Ok(())
        })
        .await?;
        let mut v = self.0.volumes.lock();
        v.published.insert(PathBuf::from(&r.target_path), want);
        if !group.is_empty() {
            v.mount_groups.insert(r.volume_id.clone(), group);
        }
        Ok(pb::NodePublishVolumeResponse {})
    }

    async fn unpublish(
        &self,
        r: pb::NodeUnpublishVolumeRequest,
    ) -> Result<pb::NodeUnpublishVolumeResponse, Status> {
        let cfg = self.config();
        required(&r.volume_id, "Volume ID")?;
        required(&r.target_path, "Target path")?;
        let target = PathBuf::from(&r.target_path);
        let published = self.0.volumes.lock().published.get(&target).cloned();
        let gone_ephemeral = self.0.volumes.lock().ended.contains(&r.volume_id);
        if published.is_none() && !gone_ephemeral && !self.knows(&cfg, &r.volume_id) {
            return Err(Status::not_found(format!(
                "volume id {} does not exist",
                r.volume_id
            )));
        }
        let ephemeral = published.as_ref().is_some_and(|p| p.ephemeral);
        let dir = volume_dir(&cfg, &r.volume_id);
        let file = block_file(&cfg, &r.volume_id);
        let block = published.as_ref().is_some_and(|p| p.block)
            || self.0.volumes.lock().attached.contains(&file);
        let _guard = match block {
            true => Some(self.0.block_lock.lock().await),
            false => None,
        };
        blocking(move || {
            if mount::is_mount_point(&target) {
                mount::unmount(&target)?;
            }
            match std::fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(&target)?,
                Ok(_) => std::fs::remove_file(&target)?,
                Err(_) => {}
            }
            if ephemeral {
                std::fs::remove_dir_all(&dir)?;
            }
            Ok(())
        })
        .await?;
        let target = PathBuf::from(&r.target_path);
        {
            let mut v = self.0.volumes.lock();
            v.published.remove(&target);
            if ephemeral {
                // A repeated unpublish of an ended ephemeral volume is still OK.
                v.ended.insert(r.volume_id.clone());
            }
        }
        if block {
            // The last publish of a block volume takes its loop device.
            self.release_loop(&r.volume_id, file, &target).await?;
        }
        Ok(pb::NodeUnpublishVolumeResponse {})
    }

    async fn stats(
        &self,
        r: pb::NodeGetVolumeStatsRequest,
    ) -> Result<pb::NodeGetVolumeStatsResponse, Status> {
        if !self.config().get_volume_stats {
            return Err(Status::unimplemented("GET_VOLUME_STATS is not offered"));
        }
        required(&r.volume_id, "Volume ID")?;
        required(&r.volume_path, "Volume path")?;
        let path = PathBuf::from(&r.volume_path);
        if !path.exists() {
            return Err(Status::not_found(format!(
                "Could not get file information from {}",
                r.volume_path
            )));
        }
        let unit = |u: pb::volume_usage::Unit| u as i32;
        let usage = blocking(move || {
            let meta = std::fs::metadata(&path)?;
            if meta.file_type().is_block_device() {
                // A block volume's usage is its device's size, in bytes.
                return Ok(vec![pb::VolumeUsage {
                    total: loopdev::device_size(&path)? as i64,
                    unit: unit(pb::volume_usage::Unit::Bytes),
                    ..Default::default()
                }]);
            }
            if meta.is_file() {
                return Ok(vec![pb::VolumeUsage {
                    total: meta.len() as i64,
                    unit: unit(pb::volume_usage::Unit::Bytes),
                    ..Default::default()
                }]);
            }
            let ([total, available, used], [inodes, ifree, iused]) = mount::usage(&path)?;
            Ok(vec![
                pb::VolumeUsage {
                    available,
                    total,
                    used,
                    unit: unit(pb::volume_usage::Unit::Bytes),
                },
                pb::VolumeUsage {
                    available: ifree,
                    total: inodes,
                    used: iused,
                    unit: unit(pb::volume_usage::Unit::Inodes),
                },
            ])
        })
        .await?;
        Ok(pb::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }

    async fn expand(
        &self,
        r: pb::NodeExpandVolumeRequest,
    ) -> Result<pb::NodeExpandVolumeResponse, Status> {
        let cfg = self.config();
        if !cfg.expand {
            return Err(Status::unimplemented("EXPAND_VOLUME is not offered"));
        }
        required(&r.volume_id, "Volume ID")?;
        required(&r.volume_path, "Volume path")?;
        if !Path::new(&r.volume_path).exists() {
            return Err(Status::not_found(format!(
                "Could not get file information from {}",
                r.volume_path
            )));
        }
        let size = r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        let file = block_file(&cfg, &r.volume_id);
        if is_block(r.volume_capability.as_ref()) && size > 0 {
            let _guard = self.0.block_lock.lock().await;
            blocking(move || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)?
                    .set_len(size as u64)?;
                // The loop device follows its file's new size.
                loopdev::refresh(&file, loopdev::DEADLINE)
            })
            .await?;
        }
        self.0
            .volumes
            .lock()
            .expanded
            .insert(r.volume_id.clone(), size);
        Ok(pb::NodeExpandVolumeResponse {
            capacity_bytes: size,
        })
    }
}

fn rpc(t: Cap) -> pb::NodeServiceCapability {
    pb::NodeServiceCapability {
        r#type: Some(pb::node_service_capability::Type::Rpc(
            pb::node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        req: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let r = req.into_inner();
        self.call(
            "NodeStageVolume",
            Rec::NodeStageVolume(r.clone()),
            self.stage(r),
        )
        .await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        let r = req.into_inner();
        self.call(
            "NodeUnstageVolume",
            Rec::NodeUnstageVolume(r.clone()),
            self.unstage(r),
        )
        .await
    }

    async fn node_publish_volume(
        &self,
        req: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        self.call(
            "NodePublishVolume",
            Rec::NodePublishVolume(r.clone()),
            self.publish(r),
        )
        .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let rec = Rec::NodeUnpublishVolume(r.clone());
        self.call("NodeUnpublishVolume", rec, self.unpublish(r))
            .await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        self.call(
            "NodeGetVolumeStats",
            Rec::NodeGetVolumeStats(r.clone()),
            self.stats(r),
        )
        .await
    }

    async fn node_expand_volume(
        &self,
        req: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        self.call(
            "NodeExpandVolume",
            Rec::NodeExpandVolume(r.clone()),
            self.expand(r),
        )
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        let cfg = self.config();
        let caps = [
            (cfg.stage_unstage, Cap::StageUnstageVolume),
            (cfg.get_volume_stats, Cap::GetVolumeStats),
            (cfg.expand, Cap::ExpandVolume),
            (cfg.volume_mount_group, Cap::VolumeMountGroup),
        ];
        let capabilities = caps
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, t)| rpc(t))
            .collect();
        self.call(
            "NodeGetCapabilities",
            Rec::NodeGetCapabilities,
            async move { Ok(pb::NodeGetCapabilitiesResponse { capabilities }) },
        )
        .await
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        let cfg = self.config();
        let topology = (!cfg.topology.is_empty()).then(|| pb::Topology {
            segments: cfg.topology.clone().into_iter().collect(),
        });
        self.call("NodeGetInfo", Rec::NodeGetInfo, async move {
            Ok(pb::NodeGetInfoResponse {
                node_id: cfg.node_id,
                max_volumes_per_node: cfg.max_volumes,
                accessible_topology: topology,
            })
        })
        .await
    }
}
