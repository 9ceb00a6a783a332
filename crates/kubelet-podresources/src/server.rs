//! The `PodResourcesLister` service (upstream `server_v1.go`): `List` over
//! the active pods, `Get` of one pod, `GetAllocatableResources`, each
//! behind the rate limit.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::debug;

use crate::metrics::{ApiMethod, NoMetrics, PodResourcesMetrics};
use crate::pb::pod_resources_lister_server::PodResourcesLister;
use crate::pb::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use crate::providers::{PodInfo, PodResourcesProviders};
use crate::ratelimit::{LIMIT_EXCEEDED, RateLimit};

/// The pod-resources v1 service over its providers.
#[derive(Clone)]
pub struct PodResourcesServer {
    pub(crate) providers: PodResourcesProviders,
    limit: Arc<RateLimit>,
    metrics: Arc<dyn PodResourcesMetrics>,
    get_enabled: bool,
}

/// The feature gate guarding `Get` (upstream `KubeletPodResourcesGet`:
/// alpha in 1.27, beta and on by default from 1.34).
pub const GET_FEATURE_GATE: &str = "KubeletPodResourcesGet";

/// `Get`'s error while [`GET_FEATURE_GATE`] is off (upstream's message).
pub(crate) const GET_DISABLED: &str = "PodResources API Get method disabled";

impl PodResourcesServer {
    /// A server reading `providers`, admitting requests through `limit`
    /// (upstream: `DefaultQPS`, `DefaultBurstTokens`, see [`RateLimit::default`]).
    pub fn new(providers: PodResourcesProviders, limit: RateLimit) -> Self {
        Self {
            providers,
            limit: Arc::new(limit),
            metrics: Arc::new(NoMetrics),
            get_enabled: true,
        }
    }

    /// Serves `Get` only when `enabled` (the [`GET_FEATURE_GATE`] gate);
    /// otherwise `Get` fails with upstream's "PodResources API Get method
    /// disabled".
    #[must_use]
    pub fn with_get_enabled(mut self, enabled: bool) -> Self {
        self.get_enabled = enabled;
        self
    }

    /// Counts requests in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<dyn PodResourcesMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub(crate) fn admit(&self, method: ApiMethod) -> Result<(), Status> {
        if self.limit.allow() {
            self.metrics.request(method);
            Ok(())
        } else {
            debug!("Pod resources request rejected by rate limit");
            Err(Status::resource_exhausted(LIMIT_EXCEEDED))
        }
    }

    fn pod_resources(&self, pod: &PodInfo) -> PodResources {
        let p = &self.providers;
        PodResources {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            containers: pod
                .v1_containers()
                .map(|name| ContainerResources {
                    name: name.clone(),
                    devices: p.devices.devices(&pod.uid, name),
                    cpu_ids: p.cpus.cpus(&pod.uid, name),
                    memory: p.memory.memory(&pod.uid, name),
                    dynamic_resources: Vec::new(),
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesServer {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.admit(ApiMethod::List)?;
        let pods = self.providers.pods.active_pods();
        self.providers.devices.update_allocated_devices();
        let pod_resources = pods.iter().map(|pod| self.pod_resources(pod)).collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.admit(ApiMethod::GetAllocatable)?;
        let p = &self.providers;
        Ok(Response::new(AllocatableResourcesResponse {
            devices: p.devices.allocatable_devices(),
            cpu_ids: p.cpus.allocatable_cpus(),
            memory: p.memory.allocatable_memory(),
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.admit(ApiMethod::Get)?;
        if !self.get_enabled {
            self.metrics.error(ApiMethod::Get);
            // A plain Go error upstream, which gRPC sends as Unknown.
            return Err(Status::unknown(GET_DISABLED));
        }
        let req = request.into_inner();
        let Some(pod) = self
            .providers
            .pods
            .pod_by_name(&req.pod_namespace, &req.pod_name)
        else {
            self.metrics.error(ApiMethod::Get);
            // Upstream returns a plain Go error, which gRPC sends as Unknown.
            return Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                req.pod_name, req.pod_namespace
            )));
        };
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(self.pod_resources(&pod)),
        }))
    }
}
