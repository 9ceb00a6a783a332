//! The CSI Controller service of the test driver, as much as a host-path
//! driver has: volumes created and deleted as directories under the data
//! directory (block volumes as backing files, their loop devices detached
//! at deletion), publish (attach) and unpublish recorded and answered with an
//! empty publish context, and expansion that asks for a node expansion.

use kubelet_csi::pb;
use kubelet_csi::pb::controller_server::Controller;
use kubelet_csi::pb::controller_service_capability::rpc::Type as Cap;
use tonic::{Request, Response, Status};

use super::block::{block_file, create_backing_file};
use super::node::volume_dir;
use super::{Driver, Request as Rec};

fn rpc(t: Cap) -> pb::ControllerServiceCapability {
    pb::ControllerServiceCapability {
        r#type: Some(pb::controller_service_capability::Type::Rpc(
            pb::controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

fn missing(what: &str) -> Status {
    Status::invalid_argument(format!("{what} missing in request"))
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        let cfg = self.config();
        let mut capabilities = vec![rpc(Cap::CreateDeleteVolume)];
        if cfg.controller_publish {
            capabilities.push(rpc(Cap::PublishUnpublishVolume));
        }
        if cfg.expand {
            capabilities.push(rpc(Cap::ExpandVolume));
        }
        self.call(
            "ControllerGetCapabilities",
            Rec::ControllerGetCapabilities,
            async move { Ok(pb::ControllerGetCapabilitiesResponse { capabilities }) },
        )
        .await
    }

    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        let cfg = self.config();
        let rec = Rec::CreateVolume(r.clone());
        self.call("CreateVolume", rec, async move {
            if r.name.is_empty() {
                return Err(missing("Name"));
            }
            let capacity = r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
            let block = r.volume_capabilities.iter().any(|c| {
                matches!(
                    c.access_type,
                    Some(pb::volume_capability::AccessType::Block(_))
                )
            });
            if block {
                // A block volume is its backing file, of the asked size.
                let file = block_file(&cfg, &r.name);
                let size = u64::try_from(capacity).unwrap_or(0);
                tokio::task::spawn_blocking(move || create_backing_file(&file, size))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?
                    .map_err(|e| Status::internal(e.to_string()))?;
            } else {
                tokio::fs::create_dir_all(volume_dir(&cfg, &r.name))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
            }
            let topology = (!cfg.topology.is_empty()).then(|| pb::Topology {
                segments: cfg.topology.clone().into_iter().collect(),
            });
            Ok(pb::CreateVolumeResponse {
                volume: Some(pb::Volume {
                    capacity_bytes: capacity,
                    volume_id: r.name,
                    accessible_topology: topology.into_iter().collect(),
                    ..Default::default()
                }),
            })
        })
        .await
    }

    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        let cfg = self.config();
        self.call("DeleteVolume", Rec::DeleteVolume(r.clone()), async move {
            if r.volume_id.is_empty() {
                return Err(missing("Volume ID"));
            }
            // Deleting a volume that is gone is OK (the spec's idempotency);
            // a block volume's loop devices go before its file.
            self.delete_block(&r.volume_id).await?;
            let _ = tokio::fs::remove_dir_all(volume_dir(&cfg, &r.volume_id)).await;
            Ok(pb::DeleteVolumeResponse {})
        })
        .await
    }

    async fn controller_publish_volume(
        &self,
        req: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerPublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let rec = Rec::ControllerPublishVolume(r.clone());
        let on = self.config().controller_publish;
        self.call("ControllerPublishVolume", rec, async move {
            if !on {
                return Err(Status::unimplemented(
                    "PUBLISH_UNPUBLISH_VOLUME is not offered",
                ));
            }
            if r.volume_id.is_empty() {
                return Err(missing("Volume ID"));
            }
            if r.node_id.is_empty() {
                return Err(missing("Node ID"));
            }
            Ok(pb::ControllerPublishVolumeResponse::default())
        })
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let rec = Rec::ControllerUnpublishVolume(r.clone());
        self.call("ControllerUnpublishVolume", rec, async move {
            if r.volume_id.is_empty() {
                return Err(missing("Volume ID"));
            }
            Ok(pb::ControllerUnpublishVolumeResponse {})
        })
        .await
    }

    async fn controller_expand_volume(
        &self,
        req: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        let rec = Rec::ControllerExpandVolume(r.clone());
        let on = self.config().expand;
        self.call("ControllerExpandVolume", rec, async move {
            if !on {
                return Err(Status::unimplemented("EXPAND_VOLUME is not offered"));
            }
            if r.volume_id.is_empty() {
                return Err(missing("Volume ID"));
            }
            Ok(pb::ControllerExpandVolumeResponse {
                capacity_bytes: r.capacity_range.as_ref().map_or(0, |c| c.required_bytes),
                node_expansion_required: true,
            })
        })
        .await
    }
}
