//! `/metrics` and the server's own request metrics (upstream
//! `Server.InstallDefaultHandlers` serving `legacyregistry.Handler()`, and
//! `Server.ServeHTTP` recording `kubelet_http_requests_total`,
//! `kubelet_http_requests_duration_seconds` and `kubelet_http_inflight_requests`).
//!
//! The exposition is the classic Prometheus text format 0.0.4
//! ([`kubelet_metrics::CONTENT_TYPE`]), which every Prometheus scraper
//! parses; see `kubelet_metrics::render` for how it differs from the
//! OpenMetrics text `prometheus-client` writes.
//!
//! The request metrics bucket the path as upstream's `getMetricBucket`: the
//! first path segment (two for `/metrics/...`) when it is one the server
//! serves, otherwise `other`; methods upstream does not list are `other`.
//! A request stays in flight, and its duration runs, until its response
//! body ends (a followed log stream counts while it streams). For an
//! upgraded connection (exec, attach, port-forward) that is the `101`
//! response, not the end of the stream.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use kubelet_metrics::{HttpLabels, KubeletMetrics};
use tokio::time::Instant;

/// Path buckets upstream registers with `addMetricsBucketMatcher`.
const PATH_BUCKETS: &[&str] = &[
    "healthz",
    "pods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
    "checkpoint",
    "run",
    "exec",
    "attach",
    "portForward",
    "containerLogs",
    "configz",
    "runningpods",
    "pprof",
    "logs",
    "debug",
];

/// Methods upstream counts by name (`metricsMethodBuckets`).
const METHOD_BUCKETS: &[&str] = &[
    "OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "CONNECT",
];

/// Path buckets upstream marks `long_running` (`longRunningRequestPathMap`).
/// Upstream spells port-forward `portforward` there, so `portForward`
/// requests count as not long-running; kubelet-rs keeps that.
const LONG_RUNNING: &[&str] = &["exec", "attach", "portforward", "debug"];

/// Which server a request came in on (the `server_type` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerType {
    /// The authenticated node API (10250).
    ReadWrite,
    /// The read-only port (10255).
    ReadOnly,
}

impl ServerType {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadWrite => "readwrite",
            Self::ReadOnly => "readonly",
        }
    }
}

/// `/metrics`: every kubelet family in the Prometheus text format;
/// `/metrics/probes`: the prober's.
pub fn routes(metrics: Arc<KubeletMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/metrics/probes", get(serve_probe_metrics))
        .with_state(metrics)
}

async fn serve_metrics(State(metrics): State<Arc<KubeletMetrics>>) -> Response {
    // Rendering is a few microseconds of CPU per family: no need to leave the runtime.
    (
        [(CONTENT_TYPE, kubelet_metrics::CONTENT_TYPE)],
        metrics.render(),
    )
        .into_response()
}

async fn serve_probe_metrics(State(metrics): State<Arc<KubeletMetrics>>) -> Response {
    (
        [(CONTENT_TYPE, kubelet_metrics::CONTENT_TYPE)],
        metrics.prober().render(),
    )
        .into_response()
}

/// Wraps `router` so every request it serves is counted and timed.
pub fn instrument(router: Router, metrics: Arc<KubeletMetrics>, server_type: ServerType) -> Router {
    router.layer(middleware::from_fn_with_state(
        (metrics, server_type),
        record_request,
    ))
}

/// The middleware [`instrument`] installs (usable with
/// `axum::middleware::from_fn_with_state((metrics, server_type), record_request)`).
pub async fn record_request(
    State((metrics, server_type)): State<(Arc<KubeletMetrics>, ServerType)>,
    req: Request,
    next: Next,
) -> Response {
    let path = path_bucket(req.uri().path());
    let labels = HttpLabels {
        method: method_bucket(req.method().as_str()),
        path,
        server_type: server_type.as_str(),
        long_running: if LONG_RUNNING.contains(&path) {
            "true"
        } else {
            "false"
        },
    };
    metrics.http_request_started(&labels);
    let guard = InFlight {
        metrics,
        labels,
        start: Instant::now(),
    };
    let (parts, body) = next.run(req).await.into_parts();
    Response::from_parts(
        parts,
        Body::new(TimedBody {
            inner: body,
            guard: Some(guard),
        }),
    )
}

/// Upstream `getMetricBucket` over `getURLRootPath`.
pub fn path_bucket(path: &str) -> &'static str {
    let mut parts = path.strip_prefix('/').unwrap_or(path).splitn(3, '/');
    let first = parts.next().unwrap_or_default();
    let root = match (first, parts.next()) {
        ("metrics", Some(second)) => PATH_BUCKETS
            .iter()
            .find(|b| b.strip_prefix("metrics/") == Some(second)),
        _ => PATH_BUCKETS.iter().find(|b| **b == first),
    };
    root.copied().unwrap_or("other")
}

/// Upstream `getMetricMethodBucket`.
pub fn method_bucket(method: &str) -> &'static str {
    METHOD_BUCKETS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

/// Ends a request's in-flight mark and observes its duration when dropped.
struct InFlight {
    metrics: Arc<KubeletMetrics>,
    labels: HttpLabels,
    start: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.metrics
            .http_request_finished(&self.labels, self.start.elapsed());
    }
}

/// A response body that ends its request's [`InFlight`] when it ends or is dropped.
struct TimedBody {
    inner: Body,
    guard: Option<InFlight>,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = r {
            self.guard.take();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
