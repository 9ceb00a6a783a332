//! The streaming endpoints of the node API (upstream `pkg/kubelet/server`
//! `getExec`, `getAttach`, `getPortForward`, `getRun` and `proxyStream`):
//! `/exec`, `/attach` and `/portForward` ask the runtime for a streaming URL
//! (CRI `Exec`/`Attach`/`PortForward`) and proxy the client's upgraded
//! connection to it; `/run` runs a command (CRI `ExecSync`) and returns its
//! output.
//!
//! The runtime (containerd 1.6) speaks SPDY/3.1 and the WebSocket
//! `channel.k8s.io` family up to `v4`, so those upgrades are proxied
//! transparently ([`proxy`]). Two WebSocket protocols of newer kubectl
//! versions are served by the kubelet: the port-forward tunnel
//! `SPDY/3.1+portforward.k8s.io` ([`tunnel`]), and `v5.channel.k8s.io`,
//! translated by `v5::serve` once [`V5_TRANSLATION`] is on.

pub mod options;
pub mod proxy;
pub mod spdy;
pub mod tunnel;
pub mod v5;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderValue, StatusCode, Uri};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

pub use options::{OptionsError, StreamOptions};

use crate::serve::Sessions;
pub use tunnel::ServerWebSocket;

/// The remote-command WebSocket protocols the runtime serves itself
/// (containerd 1.6: `wsstream` with `channel.k8s.io`, `base64.channel.k8s.io`
/// and their `v4.` forms).
pub const RUNTIME_EXEC_WS_PROTOCOLS: [&str; 4] = [
    "channel.k8s.io",
    "base64.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
];
/// The port-forward WebSocket protocols the runtime serves itself.
pub const RUNTIME_PORT_FORWARD_WS_PROTOCOLS: [&str; 2] =
    ["v4.channel.k8s.io", "v4.base64.channel.k8s.io"];
/// The remote-command protocol v5 (upstream `remotecommand.StreamProtocolV5Name`).
pub const V5_PROTOCOL: &str = "v5.channel.k8s.io";

/// LEAD SWITCH: whether `v5.channel.k8s.io` WebSocket requests are served
/// by translation in `v5::serve` (written by the spdy helper). While off,
/// they are proxied to the runtime like any other upgrade, and containerd
/// refuses the protocol itself, which is what the upstream kubelet does in
/// front of a runtime without v5. To switch on: declare `pub mod v5;` above,
/// replace the body of [`serve_v5`], and set this to `true`.
pub const V5_TRANSLATION: bool = true;

/// Serves an accepted `v5.channel.k8s.io` WebSocket by translating it to
/// SPDY toward the runtime at `runtime_url` ([`v5::serve`]); the runtime
/// connection is one of the server's `sessions`, ended at shutdown.
async fn serve_v5(
    ws: ServerWebSocket,
    runtime_url: Uri,
    opts: StreamOptions,
    sessions: Sessions,
) -> Result<(), StreamError> {
    v5::serve(ws, runtime_url, opts, &sessions).await
}

/// What the streaming endpoints read of the kubelet (upstream
/// `HostInterface.GetExec`, `GetAttach`, `GetPortForward`, `RunInContainer`).
#[async_trait::async_trait]
pub trait StreamingHost: Send + Sync + 'static {
    /// A desired pod by namespace and name (upstream `GetPodByName`).
    fn get_pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>>;
    /// Upstream `podManager.TranslatePodUID`: a mirror pod's UID becomes its
    /// static pod's; any other UID stays.
    fn translate_pod_uid(&self, uid: &str) -> String {
        uid.to_string()
    }
    /// The runtime's streaming URL for a command in a running container of
    /// `pod`; `pod_uid` (possibly a mirror pod's) narrows the pod when set.
    async fn get_exec(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
        cmd: Vec<String>,
        opts: StreamOptions,
    ) -> Result<String, HostError>;
    /// The runtime's streaming URL to attach to a running container.
    async fn get_attach(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
        opts: StreamOptions,
    ) -> Result<String, HostError>;
    /// The runtime's streaming URL to forward `ports` (WebSocket only; SPDY
    /// names them per stream) into the pod's sandbox.
    async fn get_port_forward(&self, pod: &Pod, ports: Vec<i32>) -> Result<String, HostError>;
    /// Runs `cmd` in a running container and returns its stdout then stderr.
    async fn run_in_container(
        &self,
        pod: &Pod,
        pod_uid: &str,
        container: &str,
        cmd: Vec<String>,
    ) -> Result<Vec<u8>, HostError>;
}

/// Why the host produced no streaming URL or command output.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No running container of that name in the pod.
    #[error("container not found ({0:?})")]
    ContainerNotFound(String),
    /// The runtime runs no such pod (upstream: the pod's full name).
    #[error("pod not found ({0:?})")]
    PodNotFound(String),
    /// The pod has no sandbox (upstream: `format.PodDesc`).
    #[error("failed to find sandboxID for pod {0}")]
    NoSandbox(String),
    /// `/run`'s command exited non-zero.
    #[error("command '{cmd}' exited with {code}: {stderr}")]
    ExitCode {
        /// The command, joined by spaces.
        cmd: String,
        /// Its exit code.
        code: i32,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A CRI call failed.
    #[error(transparent)]
    Runtime(#[from] cri::CriError),
}

/// Errors of a stream once it is being proxied or served.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The runtime's URL is not a plain-http URL this proxy can dial.
    #[error("unsupported streaming URL {0:?}")]
    Url(String),
    /// Connecting to the runtime failed.
    #[error("error dialing backend: {0}")]
    Dial(#[source] std::io::Error),
    /// Connecting to the runtime did not finish in time.
    #[error("error dialing backend: no connection within {0:?}")]
    DialTimeout(std::time::Duration),
    /// The HTTP exchange with the runtime failed.
    #[error("error sending request: {0}")]
    Http(#[source] hyper::Error),
    /// The runtime sent no response header in time.
    #[error("no upgrade response within {0:?}")]
    ResponseTimeout(std::time::Duration),
    /// The runtime answered neither `101` nor an error.
    #[error("invalid upgrade response: status code {0}")]
    UpgradeStatus(u16),
    /// The client's connection cannot be upgraded (HTTP/2, or a server
    /// without upgrades).
    #[error("request connection cannot be hijacked")]
    NoUpgrade,
    /// An upgraded connection failed.
    #[error("upgrade: {0}")]
    Upgrade(#[source] hyper::Error),
    /// The WebSocket failed.
    #[error("websocket: {0}")]
    WebSocket(#[source] tokio_tungstenite::tungstenite::Error),
    /// Reading or writing the runtime's connection failed.
    #[error("stream: {0}")]
    Io(#[source] std::io::Error),
    /// A tunnel carried a text message (upstream `TunnelingConnection`).
    #[error("invalid message type received")]
    MessageType,
    /// The protocol is not served.
    #[error("unsupported protocol {0}")]
    Unsupported(&'static str),
}

/// The streaming routes, state applied: `/exec` and `/attach` (GET, POST;
/// with and without the pod UID), `/portForward` (GET, POST) and `/run`
/// (POST).
pub fn routes(host: Arc<dyn StreamingHost>) -> Router {
    Router::new()
        .route("/exec/{ns}/{pod}/{container}", get(exec).post(exec))
        .route(
            "/exec/{ns}/{pod}/{uid}/{container}",
            get(exec_uid).post(exec_uid),
        )
        .route("/attach/{ns}/{pod}/{container}", get(attach).post(attach))
        .route(
            "/attach/{ns}/{pod}/{uid}/{container}",
            get(attach_uid).post(attach_uid),
        )
        .route(
            "/portForward/{ns}/{pod}",
            get(port_forward).post(port_forward),
        )
        .route(
            "/portForward/{ns}/{pod}/{uid}",
            get(port_forward_uid).post(port_forward_uid),
        )
        .route("/run/{ns}/{pod}/{container}", post(run))
        .route("/run/{ns}/{pod}/{uid}/{container}", post(run_uid))
        .with_state(host)
}

type Host = State<Arc<dyn StreamingHost>>;

#[derive(Debug, Deserialize)]
struct ContainerPath {
    ns: String,
    pod: String,
    #[serde(default)]
    uid: String,
    container: String,
}

#[derive(Debug, Deserialize)]
struct PodPath {
    ns: String,
    pod: String,
    #[serde(default)]
    uid: String,
}

async fn exec(host: Host, Path(p): Path<ContainerPath>, req: Request) -> Response {
    remote_command(host.0, p, req, true).await
}

async fn exec_uid(host: Host, Path(p): Path<ContainerPath>, req: Request) -> Response {
    remote_command(host.0, p, req, true).await
}

async fn attach(host: Host, Path(p): Path<ContainerPath>, req: Request) -> Response {
    remote_command(host.0, p, req, false).await
}

async fn attach_uid(host: Host, Path(p): Path<ContainerPath>, req: Request) -> Response {
    remote_command(host.0, p, req, false).await
}

async fn port_forward(host: Host, Path(p): Path<PodPath>, req: Request) -> Response {
    port_forward_inner(host.0, p, req).await
}

async fn port_forward_uid(host: Host, Path(p): Path<PodPath>, req: Request) -> Response {
    port_forward_inner(host.0, p, req).await
}

async fn run(host: Host, Path(p): Path<ContainerPath>, req: Request) -> Response {
    run_inner(host.0, p, req).await
}

async fn run_uid(host: Host, Path(p): Path<ContainerPath>, req: Request) -> Response {
    run_inner(host.0, p, req).await
}

/// A plain-text error body, as go-restful's `WriteError` and `http.Error` send.
pub(crate) fn text_error(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn pod_does_not_exist() -> Response {
    text_error(StatusCode::NOT_FOUND, "pod does not exist")
}

/// Whether the UID in the path names a pod other than `pod` (a mirror pod's
/// UID counts as its static pod's). Upstream's `FindPod` looks the pod up by
/// its full name and so never reaches another pod by UID; here a UID that
/// disagrees with the name is refused with 404, as `getPortForward` does.
fn uid_disagrees(host: &dyn StreamingHost, pod: &Pod, uid: &str) -> bool {
    !uid.is_empty() && pod.metadata.uid.as_deref() != Some(host.translate_pod_uid(uid).as_str())
}

fn pod_not_found() -> Response {
    text_error(StatusCode::NOT_FOUND, "pod not found")
}

/// Upstream `streaming.WriteError`: a CRI `NotFound` is 404, a
/// `ResourceExhausted` 429 with `Retry-After`, anything else 500.
fn host_error(e: &HostError) -> Response {
    tracing::info!(error = %e, "streaming request failed");
    let (status, retry) = match e {
        HostError::Runtime(cri::CriError::NotFound { .. }) => (StatusCode::NOT_FOUND, false),
        HostError::Runtime(cri::CriError::Rpc { code, .. })
            if *code == cri::Code::ResourceExhausted =>
        {
            (StatusCode::TOO_MANY_REQUESTS, true)
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, false),
    };
    let mut resp = text_error(status, &e.to_string());
    if retry {
        // Upstream waits out the streaming server's request-cache TTL.
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("60"));
    }
    resp
}

fn runtime_uri(url: &str) -> Result<Uri, StreamError> {
    url.parse::<Uri>()
        .map_err(|_| StreamError::Url(url.to_string()))
}

/// Upstream `getExec`/`getAttach`.
async fn remote_command(
    host: Arc<dyn StreamingHost>,
    p: ContainerPath,
    req: Request,
    exec: bool,
) -> Response {
    let (parts, _body) = req.into_parts();
    let query = parts.uri.query();
    let opts = match StreamOptions::from_query(query) {
        Ok(o) => o,
        Err(e) => return text_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Some(pod) = host.get_pod_by_name(&p.ns, &p.pod) else {
        return pod_does_not_exist();
    };
    if uid_disagrees(host.as_ref(), &pod, &p.uid) {
        return pod_not_found();
    }
    let url = if exec {
        let cmd = options::query_values(query, options::COMMAND_PARAM);
        host.get_exec(&pod, &p.uid, &p.container, cmd, opts).await
    } else {
        host.get_attach(&pod, &p.uid, &p.container, opts).await
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return host_error(&e),
    };
    let url = match runtime_uri(&url) {
        Ok(u) => u,
        Err(e) => return proxy::proxy_error(&e),
    };
    proxy_stream(parts, url, Some(opts)).await
}

/// Upstream `getPortForward`.
async fn port_forward_inner(host: Arc<dyn StreamingHost>, p: PodPath, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    let offered = options::websocket_protocols(&parts.headers);
    let websocket = options::is_websocket(&parts.headers);
    // The tunnel carries SPDY, whose streams name their ports.
    let tunnel = websocket && chosen_port_forward(&offered) == Some(Choice::Tunnel);
    let ports = match options::ports_from_query(parts.uri.query(), websocket && !tunnel) {
        Ok(p) => p,
        Err(e) => return text_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Some(pod) = host.get_pod_by_name(&p.ns, &p.pod) else {
        return pod_does_not_exist();
    };
    if !p.uid.is_empty() && pod.metadata.uid.as_deref() != Some(p.uid.as_str()) {
        return pod_not_found();
    }
    let url = match host.get_port_forward(&pod, ports).await {
        Ok(u) => u,
        Err(e) => return host_error(&e),
    };
    let url = match runtime_uri(&url) {
        Ok(u) => u,
        Err(e) => return proxy::proxy_error(&e),
    };
    proxy_stream(parts, url, None).await
}

/// Upstream `getRun`: `cmd` split on spaces, the output as the body.
async fn run_inner(host: Arc<dyn StreamingHost>, p: ContainerPath, req: Request) -> Response {
    let Some(pod) = host.get_pod_by_name(&p.ns, &p.pod) else {
        return pod_does_not_exist();
    };
    if uid_disagrees(host.as_ref(), &pod, &p.uid) {
        return pod_not_found();
    }
    let cmd = options::query_values(req.uri().query(), "cmd")
        .into_iter()
        .next()
        .unwrap_or_default();
    let cmd: Vec<String> = cmd.split(' ').map(str::to_string).collect();
    match host.run_in_container(&pod, &p.uid, &p.container, cmd).await {
        Ok(out) if out.is_empty() => StatusCode::OK.into_response(),
        Ok(out) => (
            StatusCode::OK,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            out,
        )
            .into_response(),
        Err(e) => text_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// How an upgrade request is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// Proxied to the runtime as it is.
    Runtime,
    /// `v5.channel.k8s.io`, translated by the kubelet.
    V5,
    /// The port-forward SPDY tunnel, relayed by the kubelet.
    Tunnel,
}

/// The first WebSocket protocol the client offers that is served at all
/// (upstream `wsstream` negotiation: the client's order wins).
fn chosen_remote_command(offered: &[String]) -> Option<Choice> {
    offered.iter().find_map(|p| {
        if RUNTIME_EXEC_WS_PROTOCOLS.contains(&p.as_str()) {
            Some(Choice::Runtime)
        } else if V5_TRANSLATION && p == V5_PROTOCOL {
            Some(Choice::V5)
        } else {
            None
        }
    })
}

fn chosen_port_forward(offered: &[String]) -> Option<Choice> {
    offered.iter().find_map(|p| {
        if RUNTIME_PORT_FORWARD_WS_PROTOCOLS.contains(&p.as_str()) {
            Some(Choice::Runtime)
        } else if p == tunnel::PORT_FORWARD_TUNNEL {
            Some(Choice::Tunnel)
        } else {
            None
        }
    })
}

/// Upstream `proxyStream`: the request must be an upgrade; WebSocket
/// protocols the runtime lacks are served here, everything else (SPDY, and
/// protocols nobody serves, which the runtime then refuses) goes to the
/// runtime as it is. `opts` is set for exec and attach.
async fn proxy_stream(mut parts: Parts, url: Uri, opts: Option<StreamOptions>) -> Response {
    if !options::is_upgrade(&parts.headers) {
        return text_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Upgrade request required\n",
        );
    }
    if options::is_websocket(&parts.headers) {
        let offered = options::websocket_protocols(&parts.headers);
        match opts {
            Some(opts) if chosen_remote_command(&offered) == Some(Choice::V5) => {
                let sessions = Sessions::of(&parts.extensions);
                return tunnel::accept_websocket(&mut parts, V5_PROTOCOL, move |ws| {
                    serve_v5(ws, url, opts, sessions)
                });
            }
            None if chosen_port_forward(&offered) == Some(Choice::Tunnel) => {
                let tunnelled = offered
                    .into_iter()
                    .filter(|p| p.starts_with(tunnel::SPDY_TUNNEL_PREFIX))
                    .collect();
                return tunnel::port_forward_tunnel(parts, url, tunnelled).await;
            }
            _ => {}
        }
    }
    proxy::transparent(parts, url).await
}

#[cfg(test)]
mod tests;
