//! The kubelet's Prometheus metrics (upstream `pkg/kubelet/metrics`): one
//! registry with upstream's metric names and labels, shared by the runtime,
//! the PLEG, the pod workers, the API client and the server.
