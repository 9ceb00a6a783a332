//! Test doubles: an in-process CSI driver (Identity + Node over a unix
//! socket, configurable capabilities, recorded calls) and an in-memory
//! [`CsiHost`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::pb::node_server::{Node as NodeSvc, NodeServer};
use crate::pb::{
    self,
    identity_server::{Identity, IdentityServer},
};
use crate::{CsiHost, Error, Result};

/// One call the fake driver received.
#[derive(Debug, Clone)]
pub enum Call {
    Stage(pb::NodeStageVolumeRequest),
    Unstage(pb::NodeUnstageVolumeRequest),
    Publish(pb::NodePublishVolumeRequest),
    Unpublish(pb::NodeUnpublishVolumeRequest),
    Stats(pb::NodeGetVolumeStatsRequest),
    Expand(pb::NodeExpandVolumeRequest),
}

/// How the fake driver behaves.
#[derive(Debug, Clone, Default)]
pub struct DriverConfig {
    pub caps: Vec<pb::node_service_capability::rpc::Type>,
    pub node_id: String,
    pub max_volumes: i64,
    pub topology: BTreeMap<String, String>,
    /// NodePublishVolume never answers.
    pub hang_publish: bool,
    /// NodePublishVolume fails with this status message (Internal).
    pub fail_publish: Option<String>,
}

#[derive(Clone)]
pub struct FakeDriver {
    pub config: Arc<Mutex<DriverConfig>>,
    pub calls: Arc<Mutex<Vec<Call>>>,
}

impl FakeDriver {
    /// Serves a driver on `socket` until the runtime ends.
    pub async fn serve(socket: &Path, config: DriverConfig) -> Self {
        let driver = FakeDriver {
            config: Arc::new(Mutex::new(config)),
            calls: Arc::default(),
        };
        let listener = tokio::net::UnixListener::bind(socket).expect("bind driver socket");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let server = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(driver.clone()))
            .add_service(NodeServer::new(driver.clone()))
            .serve_with_incoming(incoming);
        tokio::spawn(server);
        driver
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }
}

#[tonic::async_trait]
impl Identity for FakeDriver {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "fake.csi.k8s.io".into(),
            vendor_version: "1".into(),
            manifest: Default::default(),
        }))
    }
    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl NodeSvc for FakeDriver {
    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        let c = self.config.lock().clone();
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: c.node_id,
            max_volumes_per_node: c.max_volumes,
            accessible_topology: Some(pb::Topology {
                segments: c.topology.into_iter().collect(),
            }),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        let caps = self.config.lock().caps.clone();
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: caps
                .into_iter()
                .map(|t| pb::NodeServiceCapability {
                    r#type: Some(pb::node_service_capability::Type::Rpc(
                        pb::node_service_capability::Rpc { r#type: t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    async fn node_stage_volume(
        &self,
        r: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        std::fs::write(
            Path::new(&r.staging_target_path).join("staged"),
            &r.volume_id,
        )
        .map_err(|e| Status::internal(e.to_string()))?;
        self.calls.lock().push(Call::Stage(r));
        Ok(Response::new(pb::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        let _ = std::fs::remove_file(Path::new(&r.staging_target_path).join("staged"));
        self.calls.lock().push(Call::Unstage(r));
        Ok(Response::new(pb::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let (hang, fail) = {
            let c = self.config.lock();
            (c.hang_publish, c.fail_publish.clone())
        };
        self.calls.lock().push(Call::Publish(r.clone()));
        if hang {
            std::future::pending::<()>().await;
        }
        if let Some(msg) = fail {
            return Err(Status::internal(msg));
        }
        let target = PathBuf::from(&r.target_path);
        if matches!(
            r.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(pb::volume_capability::AccessType::Block(_))
        ) {
            std::fs::write(&target, b"").map_err(|e| Status::internal(e.to_string()))?;
        } else {
            std::fs::create_dir_all(&target).map_err(|e| Status::internal(e.to_string()))?;
            std::fs::write(target.join("data"), &r.volume_id)
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let target = PathBuf::from(&r.target_path);
        if target.is_dir() {
            let _ = std::fs::remove_dir_all(&target);
        }
        self.calls.lock().push(Call::Unpublish(r));
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        self.calls.lock().push(Call::Stats(r.into_inner()));
        Ok(Response::new(pb::NodeGetVolumeStatsResponse {
            usage: vec![pb::VolumeUsage {
                available: 70,
                total: 100,
                used: 30,
                unit: pb::volume_usage::Unit::Bytes as i32,
            }],
            volume_condition: Some(pb::VolumeCondition {
                abnormal: true,
                message: "disk sad".into(),
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        r: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let bytes = r
            .capacity_range
            .as_ref()
            .map(|c| c.required_bytes)
            .unwrap_or_default();
        self.calls.lock().push(Call::Expand(r));
        Ok(Response::new(pb::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        }))
    }
}

/// The apiserver's state as the fake host keeps it.
#[derive(Debug, Default)]
pub struct HostState {
    pub drivers: BTreeMap<String, CSIDriver>,
    pub attachments: BTreeMap<String, VolumeAttachment>,
    pub secrets: BTreeMap<(String, String), Secret>,
    pub csi_node: Option<CSINode>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub token_requests: Vec<(String, String, TokenRequest)>,
    pub va_reads: usize,
    pub claim_patches: Vec<(String, serde_json::Value)>,
}

#[derive(Default)]
pub struct FakeHost {
    pub state: Mutex<HostState>,
}

#[async_trait::async_trait]
impl CsiHost for FakeHost {
    fn node_name(&self) -> &str {
        "node-1"
    }
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>> {
        Ok(self.state.lock().drivers.get(name).cloned())
    }
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>> {
        let mut s = self.state.lock();
        s.va_reads += 1;
        Ok(s.attachments.get(name).cloned())
    }
    async fn persistent_volume(&self, _: &str) -> Result<Option<PersistentVolume>> {
        Ok(None)
    }
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret> {
        self.state
            .lock()
            .secrets
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| Error::host(format!("secrets \"{name}\" not found")))
    }
    async fn csi_node(&self, _: &str) -> Result<Option<CSINode>> {
        Ok(self.state.lock().csi_node.clone())
    }
    async fn create_csi_node(&self, node: CSINode) -> Result<CSINode> {
        self.state.lock().csi_node = Some(node.clone());
        Ok(node)
    }
    async fn update_csi_node(&self, node: CSINode) -> Result<CSINode> {
        self.state.lock().csi_node = Some(node.clone());
        Ok(node)
    }
    async fn node(&self) -> Result<Option<Node>> {
        // A real apiserver answers later: other tasks run meanwhile.
        tokio::task::yield_now().await;
        let s = self.state.lock();
        Ok(Some(Node {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                uid: Some("node-uid".into()),
                labels: Some(s.labels.clone()),
                annotations: Some(s.annotations.clone()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }
    async fn patch_node_metadata(
        &self,
        labels: BTreeMap<String, Option<String>>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<()> {
        tokio::task::yield_now().await;
        let mut s = self.state.lock();
        for (k, v) in labels {
            match v {
                Some(v) => s.labels.insert(k, v),
                None => s.labels.remove(&k),
            };
        }
        for (k, v) in annotations {
            match v {
                Some(v) => s.annotations.insert(k, v),
                None => s.annotations.remove(&k),
            };
        }
        Ok(())
    }
    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<()> {
        self.state
            .lock()
            .claim_patches
            .push((format!("{namespace}/{name}"), patch));
        Ok(())
    }
    async fn service_account_token(
        &self,
        namespace: &str,
        sa: &str,
        request: TokenRequest,
    ) -> Result<TokenRequestStatus> {
        let aud = request.spec.audiences.first().cloned().unwrap_or_default();
        self.state
            .lock()
            .token_requests
            .push((namespace.into(), sa.into(), request));
        Ok(TokenRequestStatus {
            token: format!("token-for-{aud}"),
            expiration_timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        })
    }
}
