//! How the kubelet's client talks to the apiserver: `kubeAPIQPS`,
//! `kubeAPIBurst`, the request deadline, metrics and the connection set the
//! heartbeats close.

use std::sync::Arc;
use std::time::Duration;

use super::{Connections, DEFAULT_REQUEST_TIMEOUT};

/// How a client talks to the apiserver.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sustained requests per second (`kubeAPIQPS`).
    pub qps: f64,
    /// Burst above `qps` (`kubeAPIBurst`).
    pub burst: u32,
    /// Deadline of each request; watches are bounded by their `timeoutSeconds`
    /// instead (see [`deadline`]).
    pub request_timeout: Duration,
    /// Where `rest_client_*` metrics are recorded, if anywhere.
    pub metrics: Option<Arc<kubelet_metrics::KubeletMetrics>>,
    /// The client's connections, for whoever closes them all after
    /// heartbeat failures ([`connrotation`]); a private set if `None`.
    pub connections: Option<Arc<Connections>>,
}

impl ClientOptions {
    /// `qps` and `burst`, with the default deadline.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            qps,
            burst,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            metrics: None,
            connections: None,
        }
    }

    /// The same, with its connections in `connections`.
    #[must_use]
    pub fn with_connections(self, connections: Arc<Connections>) -> Self {
        Self {
            connections: Some(connections),
            ..self
        }
    }

    /// The same, recording every request in `metrics` ([`metrics`]).
    #[must_use]
    pub fn with_metrics(self, metrics: Arc<kubelet_metrics::KubeletMetrics>) -> Self {
        Self {
            metrics: Some(metrics),
            ..self
        }
    }

    /// The same, with `request_timeout`.
    #[must_use]
    pub fn with_request_timeout(self, request_timeout: Duration) -> Self {
        Self {
            request_timeout,
            ..self
        }
    }
}
