//! The pod-resources API's request counters (upstream
//! `pkg/kubelet/metrics` `PodResourcesEndpoint*`), all labelled with the
//! `server_api_version` that served the request.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::{Builder, KubeletMetrics};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ApiVersionLabel {
    server_api_version: &'static str,
}

type Counters = Family<ApiVersionLabel, Counter>;

/// The families, registered in the kubelet's one registry.
pub(crate) struct PodResourcesCounters {
    total: Counters,
    list: Counters,
    get: Counters,
    get_allocatable: Counters,
    errors_list: Counters,
    errors_get: Counters,
    errors_get_allocatable: Counters,
}

impl PodResourcesCounters {
    pub(crate) fn register(b: &mut Builder) -> Self {
        Self {
            total: b.add(
                "kubelet_pod_resources_endpoint_requests_total",
                "Cumulative number of requests to the PodResource endpoint. Broken down by server api version.",
                &Family::default(),
            ),
            list: b.add(
                "kubelet_pod_resources_endpoint_requests_list",
                "Number of requests to the PodResource List endpoint. Broken down by server api version.",
                &Family::default(),
            ),
            get_allocatable: b.add(
                "kubelet_pod_resources_endpoint_requests_get_allocatable",
                "Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version.",
                &Family::default(),
            ),
            errors_list: b.add(
                "kubelet_pod_resources_endpoint_errors_list",
                "Number of requests to the PodResource List endpoint which returned error. Broken down by server api version.",
                &Family::default(),
            ),
            errors_get_allocatable: b.add(
                "kubelet_pod_resources_endpoint_errors_get_allocatable",
                "Number of requests to the PodResource GetAllocatableResources endpoint which returned error. Broken down by server api version.",
                &Family::default(),
            ),
            get: b.add(
                "kubelet_pod_resources_endpoint_requests_get",
                "Number of requests to the PodResource Get endpoint. Broken down by server api version.",
                &Family::default(),
            ),
            errors_get: b.add(
                "kubelet_pod_resources_endpoint_errors_get",
                "Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version.",
                &Family::default(),
            ),
        }
    }
}

impl KubeletMetrics {
    /// A pod-resources request reached `method` (`list`, `get`,
    /// `get_allocatable`) of `server_api_version` (`v1`, `v1alpha1`): the
    /// total, and the method's counter for v1.
    pub fn pod_resources_request(&self, server_api_version: &'static str, method: &str) {
        let c = &self.pod_resources;
        let l = ApiVersionLabel { server_api_version };
        c.total.get_or_create(&l).inc();
        if server_api_version != "v1" {
            return;
        }
        let family = match method {
            "list" => &c.list,
            "get" => &c.get,
            "get_allocatable" => &c.get_allocatable,
            _ => return,
        };
        family.get_or_create(&l).inc();
    }

    /// A pod-resources request to `method` answered with an error.
    pub fn pod_resources_error(&self, server_api_version: &'static str, method: &str) {
        let c = &self.pod_resources;
        let family = match method {
            "list" => &c.errors_list,
            "get" => &c.errors_get,
            "get_allocatable" => &c.errors_get_allocatable,
            _ => return,
        };
        family
            .get_or_create(&ApiVersionLabel { server_api_version })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use crate::KubeletMetrics;

    #[test]
    fn requests_count_in_the_total_and_per_method() {
        let m = KubeletMetrics::new();
        m.pod_resources_request("v1", "list");
        m.pod_resources_request("v1", "get");
        m.pod_resources_error("v1", "get");
        m.pod_resources_request("v1alpha1", "list");
        let text = m.render();
        for line in [
            "kubelet_pod_resources_endpoint_requests_total{server_api_version=\"v1\"} 2",
            "kubelet_pod_resources_endpoint_requests_total{server_api_version=\"v1alpha1\"} 1",
            "kubelet_pod_resources_endpoint_requests_list{server_api_version=\"v1\"} 1",
            "kubelet_pod_resources_endpoint_requests_get{server_api_version=\"v1\"} 1",
            "kubelet_pod_resources_endpoint_errors_get{server_api_version=\"v1\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
