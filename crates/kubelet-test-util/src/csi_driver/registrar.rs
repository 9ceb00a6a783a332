//! The node-driver-registrar's side of the kubelet plugin registration
//! API (`pluginregistration.v1` `Registration`): `GetInfo` names a
//! `CSIPlugin` with the driver's name, the CSI socket as its endpoint and
//! the versions the registrar offers (`GetInfo` can be faulted like any
//! driver call); `NotifyRegistrationStatus` is kept
//! for assertions.

use std::path::PathBuf;

use kubelet_pluginmanager::pb;
use kubelet_pluginmanager::pb::registration_server::Registration;
use tonic::{Request, Response, Status};

use super::Driver;

/// What the kubelet reported about a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationStatus {
    /// Whether the kubelet registered the plugin.
    pub registered: bool,
    /// Why not, when it did not.
    pub error: String,
}

pub(crate) struct Registrar {
    pub driver: Driver,
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::PluginInfo>, Status> {
        if let super::Gate::WorkThenFail(status) = self.driver.gate("GetInfo").await? {
            return Err(status);
        }
        Ok(Response::new(pb::PluginInfo {
            r#type: "CSIPlugin".into(),
            name: self.driver.config().name,
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: self.driver.config().registration_versions,
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<pb::RegistrationStatus>,
    ) -> Result<Response<pb::RegistrationStatusResponse>, Status> {
        let r = req.into_inner();
        tracing::info!(registered = r.plugin_registered, error = %r.error, "test CSI driver registration status");
        let n = {
            let mut all = self.driver.0.registrations.lock();
            all.push(RegistrationStatus {
                registered: r.plugin_registered,
                error: r.error,
            });
            all.len()
        };
        self.driver.0.registered.send_replace(n);
        Ok(Response::new(pb::RegistrationStatusResponse {}))
    }
}
