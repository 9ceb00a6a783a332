//! `/containerLogs/{namespace}/{pod}/{container}` (upstream
//! `Server.getContainerLogs`): the query decoded into `PodLogOptions`,
//! validated as the apiserver validates them, the pod and container looked
//! up, then the log streamed, chunk by chunk, while the host writes it.
//! The host's work stops when the client goes away.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::AsyncWrite;
use tokio_util::sync::CancellationToken;

use crate::serve::Sessions;
use crate::streaming::options::query_values;

/// Upstream `v1.PodLogOptions` as the kubelet reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodLogOptions {
    /// `follow`.
    pub follow: bool,
    /// `previous`: the last terminated instance.
    pub previous: bool,
    /// `timestamps`.
    pub timestamps: bool,
    /// `tailLines`.
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime` (RFC 3339).
    pub since_time: Option<jiff::Timestamp>,
}

/// Why the logs could not be served; the messages are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// No status for the container (upstream `validateContainerLogStatus`).
    #[error("container {container:?} in pod {pod:?} is not available")]
    NotAvailable {
        /// Container.
        container: String,
        /// Pod.
        pod: String,
    },
    /// `previous` without a terminated instance.
    #[error("previous terminated container {container:?} in pod {pod:?} not found")]
    PreviousNotFound {
        /// Container.
        container: String,
        /// Pod.
        pod: String,
    },
    /// Terminated and gone.
    #[error("container {container:?} in pod {pod:?} is terminated")]
    Terminated {
        /// Container.
        container: String,
        /// Pod.
        pod: String,
    },
    /// Waiting to start.
    #[error("container {container:?} in pod {pod:?} is waiting to start: {reason}")]
    Waiting {
        /// Container.
        container: String,
        /// Pod.
        pod: String,
        /// Why, in upstream's words.
        reason: String,
    },
    /// Nothing ran yet.
    #[error("container {container:?} in pod {pod:?} is waiting to start - no logs yet")]
    NoLogsYet {
        /// Container.
        container: String,
        /// Pod.
        pod: String,
    },
    /// The runtime failed.
    #[error("{0}")]
    Runtime(#[from] cri::CriError),
    /// Reading the log failed.
    #[error("{0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Where the host writes the log.
pub type LogSink = Box<dyn AsyncWrite + Send + Unpin>;

/// Writes the log into the sink until done or the token fires.
pub type LogStreamer =
    Box<dyn FnOnce(LogSink, CancellationToken) -> BoxFuture<'static, Result<(), LogsError>> + Send>;

/// What the logs endpoint reads of the kubelet (upstream
/// `GetKubeletContainerLogs`, split in two so that a refusal is a 400 before
/// any byte of the log is sent).
#[async_trait::async_trait]
pub trait ContainerLogsHost: Send + Sync + 'static {
    /// A desired pod by namespace and name.
    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>>;
    /// Picks the container instance and its log file; the returned streamer
    /// writes the log.
    async fn container_logs(
        &self,
        pod: &Pod,
        container: &str,
        opts: &PodLogOptions,
    ) -> Result<LogStreamer, LogsError>;
}

fn error_text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

/// How a query value decodes: Go's `strconv.ParseBool` and `ParseInt`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A query upstream's parameter codec cannot decode.
#[derive(Debug, thiserror::Error)]
#[error("Unable to decode query.")]
pub struct QueryError;

/// Decodes the query as upstream's parameter codec does.
pub fn decode_query(query: Option<&str>) -> Result<PodLogOptions, QueryError> {
    let e = |_| QueryError;
    let one = |name: &str| query_values(query, name).into_iter().next();
    let flag = |name: &str| match one(name) {
        None => Ok(false),
        Some(v) if v.is_empty() => Ok(false),
        Some(v) => parse_bool(&v).ok_or(QueryError),
    };
    let int = |name: &str| match one(name) {
        None => Ok(None),
        Some(v) => v.parse::<i64>().map(Some).map_err(e),
    };
    // Backwards compatibility: `tail`, where "all" means no limit.
    let tail_lines = match one("tail") {
        Some(t) if t == "all" => None,
        Some(t) if !t.is_empty() => Some(t.parse::<i64>().map_err(e)?),
        _ => int("tailLines")?,
    };
    let since_time = match one("sinceTime") {
        None => None,
        Some(v) => Some(v.parse::<jiff::Timestamp>().map_err(|_| QueryError)?),
    };
    Ok(PodLogOptions {
        follow: flag("follow")?,
        previous: flag("previous")?,
        timestamps: flag("timestamps")?,
        tail_lines,
        limit_bytes: int("limitBytes")?,
        since_seconds: int("sinceSeconds")?,
        since_time,
    })
}

/// Upstream `ValidatePodLogOptions`.
pub fn validate(o: &PodLogOptions) -> bool {
    !(o.tail_lines.is_some_and(|t| t < 0)
        || o.limit_bytes.is_some_and(|b| b < 1)
        || o.since_seconds.is_some_and(|s| s < 1)
        || (o.since_seconds.is_some() && o.since_time.is_some()))
}

async fn get_container_logs(
    State(host): State<Arc<dyn ContainerLogsHost>>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    req: axum::extract::Request,
) -> Response {
    let Ok(opts) = decode_query(query.as_deref()) else {
        return error_text(
            StatusCode::BAD_REQUEST,
            r#"{"message": "Unable to decode query."}"#,
        );
    };
    if let Some(stream) = query_values(query.as_deref(), "stream").into_iter().next()
        && stream != "All"
    {
        return error_text(
            StatusCode::BAD_REQUEST,
            format!(
                "unable to return the given log stream: {stream:?}. Please enable PodLogsQuerySplitStreams feature gate in kubelet"
            ),
        );
    }
    if !validate(&opts) {
        return error_text(
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#,
        );
    }
    let Some(pod) = host.get_pod_by_name(&namespace, &pod_name) else {
        return error_text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    let spec = pod.spec.as_ref();
    let known = spec.is_some_and(|s| {
        s.containers.iter().any(|c| c.name == container)
            || s.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    });
    if !known {
        return error_text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let streamer = match host.container_logs(&pod, &container, &opts).await {
        Ok(s) => s,
        Err(e) => return error_text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // The host writes into one end; the body reads the other. Dropping the
    // body (the client went away) cancels the host's work.
    let (rd, wr) = tokio::io::duplex(64 * 1024);
    let stop = CancellationToken::new();
    let guard = stop.clone().drop_guard();
    Sessions::of(req.extensions()).spawn(async move {
        if let Err(e) = streamer(Box::new(wr), stop).await {
            tracing::debug!(error = %e, "container log stream ended with an error");
        }
    });
    let stream = tokio_util::io::ReaderStream::new(rd);
    let stream = futures::StreamExt::map(stream, move |chunk| {
        let _ = &guard;
        chunk
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `/containerLogs/{namespace}/{pod}/{container}` (GET only, as upstream).
pub fn routes(host: Arc<dyn ContainerLogsHost>) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(get_container_logs),
        )
        .with_state(host)
}

#[cfg(test)]
mod tests;
