//! The seam for the pod-resources request counters (upstream
//! `pod_resources_endpoint_requests_total`, `_requests_list`,
//! `_requests_get`, `_requests_get_allocatable` and `_errors_get`, all with
//! `server_api_version="v1"`). The kubelet implements it over its metrics
//! registry; requests refused by the rate limit are not counted, as
//! upstream's interceptor refuses them before the handler.

/// One method of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiMethod {
    /// `List`.
    List,
    /// `Get`.
    Get,
    /// `GetAllocatableResources`.
    GetAllocatable,
    /// v1alpha1 `List`: counted in the total only, with
    /// `server_api_version="v1alpha1"`.
    V1alpha1List,
}

impl ApiMethod {
    /// The metric name suffix upstream uses for the method.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Get => "get",
            Self::GetAllocatable => "get_allocatable",
            Self::V1alpha1List => "list",
        }
    }

    /// The `server_api_version` label.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1alpha1List => "v1alpha1",
            _ => "v1",
        }
    }
}

/// Receives the request counts.
pub trait PodResourcesMetrics: Send + Sync + 'static {
    /// A request reached `method` (counts in the total and the method's
    /// counter).
    fn request(&self, method: ApiMethod);
    /// `method` answered with an error.
    fn error(&self, method: ApiMethod);
}

/// Counts nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetrics;

impl PodResourcesMetrics for NoMetrics {
    fn request(&self, _: ApiMethod) {}
    fn error(&self, _: ApiMethod) {}
}
