//! The CSI Node client (upstream `csi_client.go`): dials a driver's unix
//! socket and makes each Node call under a deadline; maps Kubernetes access
//! modes and volume modes to CSI `VolumeCapability`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::pb::node_client::NodeClient;
use crate::pb::node_service_capability::rpc::Type as NodeCap;
use crate::pb::volume_capability::access_mode::Mode;
use crate::pb::{self, VolumeCapability};
use crate::{Error, Result};

/// Upstream's `fsTypeBlockName`: the fsType that marks a raw block volume.
pub const FS_TYPE_BLOCK: &str = "block";

/// What `NodeGetInfo` told about this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The driver's ID of this node.
    pub node_id: String,
    /// The most volumes the driver can publish on this node (0: no limit).
    pub max_volumes_per_node: i64,
    /// Topology segments of this node.
    pub topology: BTreeMap<String, String>,
}

/// The Node service capabilities the kubelet acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`.
    pub stage_unstage: bool,
    /// `GET_VOLUME_STATS`.
    pub get_volume_stats: bool,
    /// `EXPAND_VOLUME`.
    pub expand_volume: bool,
    /// `VOLUME_CONDITION`.
    pub volume_condition: bool,
    /// `SINGLE_NODE_MULTI_WRITER`.
    pub single_node_multi_writer: bool,
    /// `VOLUME_MOUNT_GROUP`.
    pub volume_mount_group: bool,
}

/// Usage of a published volume (`NodeGetVolumeStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Bytes available, total and used.
    pub bytes: Option<(i64, i64, i64)>,
    /// Inodes free, total and used.
    pub inodes: Option<(i64, i64, i64)>,
    /// `Some(message)` when the driver reports the volume abnormal.
    pub abnormal: Option<String>,
}

/// Maps a Kubernetes access mode to CSI's (upstream `asCSIAccessModeV1`).
pub fn csi_access_mode(k8s_mode: &str, single_node_multi_writer: bool) -> Mode {
    match k8s_mode {
        "ReadWriteOnce" if single_node_multi_writer => Mode::SingleNodeMultiWriter,
        "ReadWriteOnce" => Mode::SingleNodeWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadWriteOncePod" if single_node_multi_writer => Mode::SingleNodeSingleWriter,
        "ReadWriteOncePod" => Mode::SingleNodeWriter,
        _ => Mode::Unknown,
    }
}

/// The `VolumeCapability` for a volume: block when `fs_type` is
/// [`FS_TYPE_BLOCK`], else a mount with the fsType, flags and mount group.
pub fn volume_capability(
    access_mode: Mode,
    fs_type: &str,
    mount_flags: &[String],
    mount_group: Option<String>,
) -> VolumeCapability {
    use pb::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    let access_type = if fs_type == FS_TYPE_BLOCK {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: mount_flags.to_vec(),
            volume_mount_group: mount_group.unwrap_or_default(),
        })
    };
    VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode {
            mode: access_mode as i32,
        }),
    }
}

/// Runs one driver call under `deadline`; running out is Go's
/// "context deadline exceeded".
async fn deadline<T>(
    limit: Duration,
    call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(Error::Grpc(status)),
        Err(_) => Err(Error::Grpc(tonic::Status::deadline_exceeded(
            "context deadline exceeded",
        ))),
    }
}

/// A connection to one driver's Node service.
#[derive(Debug, Clone)]
pub struct CsiClient {
    endpoint: PathBuf,
    node: NodeClient<Channel>,
}

impl CsiClient {
    /// Dials `endpoint` (a unix socket), failing after `limit`.
    pub async fn connect(endpoint: &Path, limit: Duration) -> Result<Self> {
        let path = endpoint.to_path_buf();
        // The connector ignores the authority; tonic needs some URI.
        let ep = Endpoint::from_static("http://[::]:50051").connect_timeout(limit);
        let connect = ep.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }));
        let channel = match tokio::time::timeout(limit, connect).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(source)) => {
                return Err(Error::Dial {
                    endpoint: endpoint.to_path_buf(),
                    source,
                });
            }
            Err(_) => {
                return Err(Error::Grpc(tonic::Status::deadline_exceeded(
                    "context deadline exceeded",
                )));
            }
        };
        Ok(Self {
            endpoint: endpoint.to_path_buf(),
            node: NodeClient::new(channel),
        })
    }

    /// The socket this client talks to.
    pub fn endpoint(&self) -> &Path {
        &self.endpoint
    }

    /// `NodeGetInfo`.
    pub async fn node_get_info(&self, limit: Duration) -> Result<NodeInfo> {
        let mut c = self.node.clone();
        let r = deadline(limit, c.node_get_info(pb::NodeGetInfoRequest {})).await?;
        Ok(NodeInfo {
            node_id: r.node_id,
            max_volumes_per_node: r.max_volumes_per_node,
            topology: r
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
        })
    }

    /// `NodeGetCapabilities`, reduced to the ones the kubelet acts on.
    pub async fn node_capabilities(&self, limit: Duration) -> Result<NodeCapabilities> {
        let mut c = self.node.clone();
        let r = deadline(
            limit,
            c.node_get_capabilities(pb::NodeGetCapabilitiesRequest {}),
        )
        .await?;
        let mut caps = NodeCapabilities::default();
        for cap in r.capabilities {
            let Some(pb::node_service_capability::Type::Rpc(rpc)) = cap.r#type else {
                continue;
            };
            match NodeCap::try_from(rpc.r#type) {
                Ok(NodeCap::StageUnstageVolume) => caps.stage_unstage = true,
                Ok(NodeCap::GetVolumeStats) => caps.get_volume_stats = true,
                Ok(NodeCap::ExpandVolume) => caps.expand_volume = true,
                Ok(NodeCap::VolumeCondition) => caps.volume_condition = true,
                Ok(NodeCap::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                Ok(NodeCap::VolumeMountGroup) => caps.volume_mount_group = true,
                Ok(NodeCap::Unknown) | Err(_) => {}
            }
        }
        Ok(caps)
    }

    /// `NodeStageVolume`.
    pub async fn node_stage(&self, req: pb::NodeStageVolumeRequest, limit: Duration) -> Result<()> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidSpec("missing volume id".into()));
        }
        if req.staging_target_path.is_empty() {
            return Err(Error::InvalidSpec("missing staging target path".into()));
        }
        let mut c = self.node.clone();
        deadline(limit, c.node_stage_volume(req)).await.map(|_| ())
    }

    /// `NodeUnstageVolume`.
    pub async fn node_unstage(
        &self,
        volume_id: &str,
        staging: &Path,
        limit: Duration,
    ) -> Result<()> {
        let mut c = self.node.clone();
        let req = pb::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_string(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        deadline(limit, c.node_unstage_volume(req))
            .await
            .map(|_| ())
    }

    /// `NodePublishVolume`.
    pub async fn node_publish(
        &self,
        req: pb::NodePublishVolumeRequest,
        limit: Duration,
    ) -> Result<()> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidSpec("missing volume id".into()));
        }
        if req.target_path.is_empty() {
            return Err(Error::InvalidSpec("missing target path".into()));
        }
        let mut c = self.node.clone();
        deadline(limit, c.node_publish_volume(req))
            .await
            .map(|_| ())
    }

    /// `NodeUnpublishVolume`.
    pub async fn node_unpublish(
        &self,
        volume_id: &str,
        target: &Path,
        limit: Duration,
    ) -> Result<()> {
        let mut c = self.node.clone();
        let req = pb::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: target.to_string_lossy().into_owned(),
        };
        deadline(limit, c.node_unpublish_volume(req))
            .await
            .map(|_| ())
    }

    /// `NodeGetVolumeStats`.
    pub async fn node_volume_stats(
        &self,
        volume_id: &str,
        volume_path: &Path,
        staging: Option<&Path>,
        limit: Duration,
    ) -> Result<VolumeStats> {
        let mut c = self.node.clone();
        let req = pb::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_string(),
            volume_path: volume_path.to_string_lossy().into_owned(),
            staging_target_path: staging
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let r = deadline(limit, c.node_get_volume_stats(req)).await?;
        let mut stats = VolumeStats::default();
        for u in r.usage {
            let triple = Some((u.available, u.total, u.used));
            match pb::volume_usage::Unit::try_from(u.unit) {
                Ok(pb::volume_usage::Unit::Bytes) => stats.bytes = triple,
                Ok(pb::volume_usage::Unit::Inodes) => stats.inodes = triple,
                _ => {}
            }
        }
        stats.abnormal = r.volume_condition.filter(|c| c.abnormal).map(|c| c.message);
        Ok(stats)
    }

    /// `NodeExpandVolume`; returns the new capacity in bytes.
    pub async fn node_expand(
        &self,
        req: pb::NodeExpandVolumeRequest,
        limit: Duration,
    ) -> Result<i64> {
        let mut c = self.node.clone();
        deadline(limit, c.node_expand_volume(req))
            .await
            .map(|r| r.capacity_bytes)
    }
}

/// A `map<string,string>` field from a Kubernetes map.
pub fn to_map(m: Option<&BTreeMap<String, String>>) -> HashMap<String, String> {
    m.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes_map_as_upstream() {
        assert_eq!(
            csi_access_mode("ReadWriteOnce", false),
            Mode::SingleNodeWriter
        );
        assert_eq!(
            csi_access_mode("ReadWriteOnce", true),
            Mode::SingleNodeMultiWriter
        );
        assert_eq!(
            csi_access_mode("ReadWriteOncePod", true),
            Mode::SingleNodeSingleWriter
        );
        assert_eq!(
            csi_access_mode("ReadOnlyMany", false),
            Mode::MultiNodeReaderOnly
        );
        assert_eq!(
            csi_access_mode("ReadWriteMany", false),
            Mode::MultiNodeMultiWriter
        );
    }

    #[test]
    fn block_fs_type_is_a_block_capability() {
        let cap = volume_capability(Mode::SingleNodeWriter, FS_TYPE_BLOCK, &[], None);
        assert!(matches!(
            cap.access_type,
            Some(pb::volume_capability::AccessType::Block(_))
        ));
        let cap = volume_capability(
            Mode::SingleNodeWriter,
            "ext4",
            &["ro".into()],
            Some("1000".into()),
        );
        let Some(pb::volume_capability::AccessType::Mount(m)) = cap.access_type else {
            panic!("mount expected");
        };
        assert_eq!(
            (m.fs_type.as_str(), m.volume_mount_group.as_str()),
            ("ext4", "1000")
        );
    }
}
