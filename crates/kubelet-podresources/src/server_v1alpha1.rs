//! The deprecated v1alpha1 `PodResourcesLister` (upstream
//! `server_v1alpha1.go`): `List` over every pod the kubelet knows, regular
//! containers only, devices without topology.

use tonic::{Request, Response, Status};

use crate::metrics::ApiMethod;
use crate::pb_v1alpha1::pod_resources_lister_server::PodResourcesLister;
use crate::pb_v1alpha1::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use crate::server::PodResourcesServer;

/// The v1alpha1 face of a [`PodResourcesServer`], sharing its providers,
/// rate limit and metrics.
#[derive(Clone)]
pub struct V1alpha1PodResourcesServer(pub PodResourcesServer);

#[tonic::async_trait]
impl PodResourcesLister for V1alpha1PodResourcesServer {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.0.admit(ApiMethod::V1alpha1List)?;
        let p = &self.0.providers;
        let pods = p.pods.pods();
        p.devices.update_allocated_devices();
        let pod_resources = pods
            .iter()
            .map(|pod| PodResources {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                containers: pod
                    .containers
                    .iter()
                    .map(|name| ContainerResources {
                        name: name.clone(),
                        devices: p
                            .devices
                            .devices(&pod.uid, name)
                            .into_iter()
                            .map(|d| ContainerDevices {
                                resource_name: d.resource_name,
                                device_ids: d.device_ids,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }
}
