//! The CSI Identity service of the test driver: its name and version,
//! its plugin capabilities (the controller service, topology constraints
//! when it reports topology, online expansion when it expands) and a
//! ready probe.

use kubelet_csi::pb;
use kubelet_csi::pb::identity_server::Identity;
use kubelet_csi::pb::plugin_capability::{self, service, volume_expansion};
use tonic::{Request, Response, Status};

use super::{Driver, Request as Rec};

fn service_cap(t: service::Type) -> pb::PluginCapability {
    pb::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        let cfg = self.config();
        self.call("GetPluginInfo", Rec::GetPluginInfo, async move {
            Ok(pb::GetPluginInfoResponse {
                name: cfg.name,
                vendor_version: cfg.vendor_version,
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        let cfg = self.config();
        let mut capabilities = vec![service_cap(service::Type::ControllerService)];
        if !cfg.topology.is_empty() {
            capabilities.push(service_cap(service::Type::VolumeAccessibilityConstraints));
        }
        if cfg.expand {
            capabilities.push(pb::PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: volume_expansion::Type::Online as i32,
                    },
                )),
            });
        }
        self.call(
            "GetPluginCapabilities",
            Rec::GetPluginCapabilities,
            async move { Ok(pb::GetPluginCapabilitiesResponse { capabilities }) },
        )
        .await
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        self.call("Probe", Rec::Probe, async {
            Ok(pb::ProbeResponse { ready: Some(true) })
        })
        .await
    }
}
