//! Resource stats of the node and its pods (upstream `pkg/kubelet/server/stats`
//! handler and the `/metrics/resource` collector): `GET|POST /stats/summary`
//! serves the [`summary::Summary`] (`only_cpu_and_memory=true` trims it as
//! upstream's `GetCPUAndMemoryStats`), and `GET /metrics/resource` renders
//! the CPU-and-memory summary as Prometheus text, which `kubectl top` reads
//! through metrics-server. The kubelet gathers the stats behind
//! [`StatsProvider`].

pub mod resource;
pub mod summary;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

pub use summary::Summary;

/// Errors of gathering stats.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The container runtime failed a stats call.
    #[error("container runtime: {0}")]
    Runtime(#[from] cri::CriError),
    /// A host file (cgroup, /proc) could not be read or parsed.
    #[error("reading {what}: {source}")]
    Host {
        /// What was read.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A blocking read did not complete (its task panicked or was cancelled).
    #[error("stats task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What the kubelet reports of resource usage (upstream `SummaryProvider`).
#[async_trait::async_trait]
pub trait StatsProvider: Send + Sync + 'static {
    /// The full summary (upstream `SummaryProvider.Get`).
    async fn summary(&self) -> Result<Summary, StatsError>;

    /// CPU and memory only (upstream `GetCPUAndMemoryStats`); a provider may
    /// override it to skip filesystem and network work.
    async fn cpu_and_memory_stats(&self) -> Result<Summary, StatsError> {
        Ok(self.summary().await?.cpu_and_memory_only())
    }
}

/// The stats routes, state applied: `/stats/summary` (GET and POST, with or
/// without a trailing slash) and `/metrics/resource`.
pub fn routes(provider: Arc<dyn StatsProvider>) -> Router {
    Router::new()
        .route("/stats/summary", get(summary_handler).post(summary_handler))
        .route(
            "/stats/summary/",
            get(summary_handler).post(summary_handler),
        )
        .route("/metrics/resource", get(resource_handler))
        .with_state(provider)
}

/// True when the form (query, and for POST a urlencoded body) carries exactly
/// one `only_cpu_and_memory` value and it is `true`, as upstream reads
/// `Request.Form`.
fn only_cpu_and_memory(query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> bool {
    let mut values: Vec<String> = Vec::new();
    let form_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if form_body {
        values.extend(
            form_urlencoded::parse(body)
                .filter(|(k, _)| k == "only_cpu_and_memory")
                .map(|(_, v)| v.into_owned()),
        );
    }
    if let Some(q) = query {
        values.extend(
            form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| k == "only_cpu_and_memory")
                .map(|(_, v)| v.into_owned()),
        );
    }
    values.len() == 1 && values[0] == "true"
}

async fn summary_handler(
    State(provider): State<Arc<dyn StatsProvider>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = if only_cpu_and_memory(query.as_deref(), &headers, &body) {
        provider.cpu_and_memory_stats().await
    } else {
        provider.summary().await
    };
    match result.map(|s| serde_json::to_vec_pretty(&s)) {
        Ok(Ok(json)) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(Err(err)) => internal_error(&err),
        Err(err) => internal_error(&err),
    }
}

fn internal_error(err: &dyn std::error::Error) -> Response {
    tracing::error!(path = "/stats/summary", error = %err, "HTTP InternalServerError serving");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("Internal Error: {err}"),
    )
        .into_response()
}

async fn resource_handler(State(provider): State<Arc<dyn StatsProvider>>) -> Response {
    let summary = match provider.cpu_and_memory_stats().await {
        Ok(s) => Some(s),
        Err(err) => {
            tracing::error!(error = %err, "Error getting summary for resourceMetric prometheus endpoint");
            None
        }
    };
    (
        [(header::CONTENT_TYPE, resource::CONTENT_TYPE)],
        resource::render(summary.as_ref()),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
