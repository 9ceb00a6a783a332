//! Container lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`
//! `handlerRunner`): runs a postStart or preStop [`LifecycleHandler`] as an
//! exec in the container (CRI `ExecSync`), an HTTP GET against the pod, or a
//! sleep. Every run has a deadline; a failure carries upstream's message.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cri::RuntimeService;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_types::pod;
use tracing::debug;

/// The `User-Agent` of hook requests (upstream `kube-lifecycle/<version>`).
const USER_AGENT: &str = "kube-lifecycle/1.33";

/// Why a hook failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// `ExecSync` failed or the command exited non-zero.
    #[error("{0}")]
    Exec(String),
    /// The HTTP request could not be built or sent.
    #[error("{0}")]
    Http(String),
    /// The hook did not finish before its deadline.
    #[error("hook did not finish within {0:?}")]
    Timeout(Duration),
    /// The handler names no action this runner knows.
    #[error("invalid handler: {0}")]
    Invalid(String),
}

/// A failed hook: the error and upstream's message for it (the waiting
/// message of a failed postStart).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HookFailure {
    /// Upstream's message, naming the hook, the container and the pod.
    pub message: String,
    /// The underlying error.
    #[source]
    pub error: HookError,
}

/// Runs lifecycle handlers (upstream `HandlerRunner`).
#[derive(Clone)]
pub struct HandlerRunner {
    runtime: Arc<dyn RuntimeService>,
    http: Client<HttpConnector, Empty<Bytes>>,
}

impl HandlerRunner {
    /// A runner that execs through `runtime`.
    pub fn new(runtime: Arc<dyn RuntimeService>) -> Self {
        Self {
            runtime,
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Runs `h` for container `c` (runtime ID `container_id`) of pod `p`,
    /// whose IPs are `pod_ips`, for at most `deadline`.
    pub async fn run(
        &self,
        container_id: &str,
        p: &Pod,
        c: &Container,
        h: &LifecycleHandler,
        pod_ips: &[String],
        deadline: Duration,
    ) -> Result<(), HookFailure> {
        let who = format!("for Container {:?} in Pod {:?}", c.name, pod::format_pod(p));
        if let Some(exec) = &h.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            return self.run_exec(container_id, &cmd, deadline).await.map_err(
                |(error, output)| HookFailure {
                    message: format!(
                        "Exec lifecycle hook ([{}]) {who} failed - error: {error}, message: {output:?}",
                        cmd.join(" ")
                    ),
                    error,
                },
            );
        }
        if let Some(get) = &h.http_get {
            return self
                .run_http(get, c, pod_ips, deadline)
                .await
                .map_err(|error| HookFailure {
                    message: format!(
                        "HTTP lifecycle hook ({}) {who} failed - error: {error}",
                        get.path.as_deref().unwrap_or("")
                    ),
                    error,
                });
        }
        if let Some(sleep) = &h.sleep {
            let want = Duration::from_secs(u64::try_from(sleep.seconds).unwrap_or(0));
            if want > deadline {
                // Upstream ends the sleep when the hook's context ends.
                tokio::time::sleep(deadline).await;
                return Err(HookFailure {
                    message: format!(
                        "Sleep lifecycle hook ({}) {who} failed - error: container terminated before sleep hook finished",
                        sleep.seconds
                    ),
                    error: HookError::Timeout(deadline),
                });
            }
            tokio::time::sleep(want).await;
            return Ok(());
        }
        let error = HookError::Invalid(format!("{h:?}"));
        Err(HookFailure {
            message: format!("Cannot run handler: {error}"),
            error,
        })
    }

    /// Upstream `RunInContainer`: the command's combined output, and an error
    /// when it exited non-zero.
    async fn run_exec(
        &self,
        id: &str,
        cmd: &[String],
        deadline: Duration,
    ) -> Result<(), (HookError, String)> {
        let call = self.runtime.exec_sync(id, cmd.to_vec(), deadline);
        // The runtime enforces `deadline`; this bounds a runtime that does not.
        let r = tokio::time::timeout(deadline + Duration::from_secs(1), call).await;
        let resp = match r {
            Err(_) => return Err((HookError::Timeout(deadline), String::new())),
            Ok(Err(e)) => return Err((HookError::Exec(e.message()), String::new())),
            Ok(Ok(resp)) => resp,
        };
        let mut output = String::from_utf8_lossy(&resp.stdout).into_owned();
        output.push_str(&String::from_utf8_lossy(&resp.stderr));
        if resp.exit_code != 0 {
            let error = HookError::Exec(format!(
                "command '{}' exited with {}: {}",
                cmd.join(" "),
                resp.exit_code,
                String::from_utf8_lossy(&resp.stderr)
            ));
            return Err((error, output));
        }
        Ok(())
    }

    /// Upstream `runHTTPHandler`: a GET to the pod (or `host`); only a
    /// transport failure fails the hook, whatever the status code.
    async fn run_http(
        &self,
        get: &HTTPGetAction,
        c: &Container,
        pod_ips: &[String],
        deadline: Duration,
    ) -> Result<(), HookError> {
        let req = http_request(get, c, pod_ips)?;
        debug!(uri = %req.uri(), "Running HTTP lifecycle hook");
        let send = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| HookError::Http(error_chain(&e)))?;
            // Drain the body so the connection is reused or closed cleanly.
            let _ = resp.into_body().collect().await;
            Ok(())
        };
        tokio::time::timeout(deadline, send)
            .await
            .map_err(|_| HookError::Timeout(deadline))?
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Upstream `ResolveContainerPort`: a number, or the name of a container port.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, HookError> {
    let n = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| HookError::Http(format!("couldn't find port: {name} in {}", c.name)))?,
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| HookError::Http(format!("invalid port number: {n}")))
}

/// The request upstream `NewRequestForHTTPGetAction` builds: host defaults to
/// the pod's first IP, headers are the hook's own plus `User-Agent` and
/// `Accept` unless set.
pub fn http_request(
    get: &HTTPGetAction,
    c: &Container,
    pod_ips: &[String],
) -> Result<http::Request<Empty<Bytes>>, HookError> {
    let host = match get.host.as_deref().filter(|h| !h.is_empty()) {
        Some(h) => h.to_string(),
        None => pod_ips
            .first()
            .cloned()
            .ok_or_else(|| HookError::Http("failed to find networking container".into()))?,
    };
    let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
    if scheme != "http" {
        return Err(HookError::Http(format!(
            "scheme {scheme} is not supported for lifecycle hooks yet"
        )));
    }
    let port = resolve_port(&get.port, c)?;
    let host_port = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let path = get.path.as_deref().unwrap_or("");
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let uri = format!("http://{host_port}{path}");
    let mut b = http::Request::get(uri.as_str());
    let mut has = (false, false);
    for h in get.http_headers.iter().flatten() {
        if h.name.eq_ignore_ascii_case("user-agent") {
            has.0 = true;
        }
        if h.name.eq_ignore_ascii_case("accept") {
            has.1 = true;
        }
        b = b.header(h.name.as_str(), h.value.as_str());
    }
    if !has.0 {
        b = b.header(http::header::USER_AGENT, USER_AGENT);
    }
    if !has.1 {
        b = b.header(http::header::ACCEPT, "*/*");
    }
    b.body(Empty::new())
        .map_err(|e| HookError::Http(format!("build request for {uri}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container() -> Container {
        serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "web", "containerPort": 8080}]
        }))
        .expect("container")
    }

    #[test]
    fn request_targets_the_pod_ip_and_named_port() {
        let get: HTTPGetAction = serde_json::from_value(serde_json::json!({
            "path": "echo?msg=poststart", "port": "web",
            "httpHeaders": [{"name": "X-Hook", "value": "1"}]
        }))
        .expect("get");
        let r = http_request(&get, &container(), &["10.0.0.5".into()]).expect("req");
        assert_eq!(r.uri(), "http://10.0.0.5:8080/echo?msg=poststart");
        assert_eq!(r.headers()["x-hook"], "1");
        assert_eq!(r.headers()["user-agent"], USER_AGENT);
        assert_eq!(r.headers()["accept"], "*/*");
        let get: HTTPGetAction = serde_json::from_value(
            serde_json::json!({"host": "fd00::1", "path": "/x", "port": 80}),
        )
        .expect("get");
        let r = http_request(&get, &container(), &[]).expect("req");
        assert_eq!(r.uri(), "http://[fd00::1]:80/x");
    }

    #[test]
    fn bad_ports_and_missing_ip_fail() {
        let c = container();
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
        assert!(resolve_port(&IntOrString::Int(0), &c).is_err());
        assert_eq!(resolve_port(&IntOrString::Int(81), &c).ok(), Some(81));
        let get: HTTPGetAction =
            serde_json::from_value(serde_json::json!({"port": 80})).expect("get");
        assert!(http_request(&get, &c, &[]).is_err());
    }
}
