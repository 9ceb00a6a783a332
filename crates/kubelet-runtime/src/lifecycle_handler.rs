//! Container lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`
//! `handlerRunner`): runs a postStart or preStop [`LifecycleHandler`] as an
//! exec in the container (CRI `ExecSync`), an HTTP GET against the pod, or a
//! sleep. Every run has a deadline; a failure carries upstream's message.
//! HTTPS hooks skip certificate verification, and one whose server answers
//! in plain HTTP is retried over HTTP, as upstream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cri::RuntimeService;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
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
    /// `None` when no TLS configuration could be built (HTTPS hooks fail).
    https: Option<Client<HttpsConnector<HttpConnector>, Empty<Bytes>>>,
}

/// The outcome of a hook that ran: `Some` when an HTTPS hook succeeded only
/// over plain HTTP, with upstream's `LifecycleHTTPFallback` event message.
pub type HookOutcome = Option<String>;

/// A client for HTTPS hooks: no certificate verification (upstream sets
/// `InsecureSkipVerify` for lifecycle hooks).
fn https_client() -> Option<Client<HttpsConnector<HttpConnector>, Empty<Bytes>>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(insecure::NoVerify(provider.clone()));
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Some(Client::builder(TokioExecutor::new()).build(connector))
}

impl HandlerRunner {
    /// A runner that execs through `runtime`.
    pub fn new(runtime: Arc<dyn RuntimeService>) -> Self {
        Self {
            runtime,
            http: Client::builder(TokioExecutor::new()).build_http(),
            https: https_client(),
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
    ) -> Result<HookOutcome, HookFailure> {
        let who = format!("for Container {:?} in Pod {:?}", c.name, pod::format_pod(p));
        if let Some(exec) = &h.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            return self
                .run_exec(container_id, &cmd, deadline)
                .await
                .map(|()| None)
                .map_err(
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
            return Ok(None);
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
    /// transport failure fails the hook, whatever the status code. An HTTPS
    /// request answered in plain HTTP is retried over HTTP without the
    /// `Authorization` header.
    async fn run_http(
        &self,
        get: &HTTPGetAction,
        c: &Container,
        pod_ips: &[String],
        deadline: Duration,
    ) -> Result<HookOutcome, HookError> {
        let req = http_request(get, c, pod_ips)?;
        debug!(uri = %req.uri(), "Running HTTP lifecycle hook");
        let work = async {
            if req.uri().scheme_str() != Some("https") {
                return self.send(&self.http, req).await.map(|()| None);
            }
            let Some(https) = &self.https else {
                return Err(HookError::Http(
                    "no TLS configuration for HTTPS hooks".into(),
                ));
            };
            let retry = plain_http_retry(&req);
            let err = match self.send(https, req).await {
                Ok(()) => return Ok(None),
                Err(e) => e,
            };
            match retry {
                Some((plain, host)) if is_http_response_error(&err) => {
                    debug!(error = %err, "HTTPS lifecycle hook got an HTTP response; retrying with HTTP");
                    self.send(&self.http, plain).await.map_err(|_| err)?;
                    Ok(Some(format!(
                        "request to HTTPS lifecycle hook {host} got HTTP response, retry with HTTP succeeded"
                    )))
                }
                _ => Err(err),
            }
        };
        tokio::time::timeout(deadline, work)
            .await
            .map_err(|_| HookError::Timeout(deadline))?
    }

    async fn send<C>(
        &self,
        client: &Client<C, Empty<Bytes>>,
        req: http::Request<Empty<Bytes>>,
    ) -> Result<(), HookError>
    where
        C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
    {
        let resp = client
            .request(req)
            .await
            .map_err(|e| HookError::Http(error_chain(&e)))?;
        // Drain the body so the connection is reused or closed cleanly.
        let _ = resp.into_body().collect().await;
        Ok(())
    }
}

/// The same request over plain HTTP, without `Authorization`, and its
/// `host:port` (upstream's fallback request).
fn plain_http_retry(
    req: &http::Request<Empty<Bytes>>,
) -> Option<(http::Request<Empty<Bytes>>, String)> {
    let authority = req.uri().authority()?.to_string();
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut b = http::Request::get(format!("http://{authority}{path}"));
    for (k, v) in req.headers() {
        if k != http::header::AUTHORIZATION {
            b = b.header(k, v);
        }
    }
    Some((b.body(Empty::new()).ok()?, authority))
}

/// Upstream `isHTTPResponseError`: the TLS handshake read an HTTP response
/// (rustls sees a record of an invalid content type).
fn is_http_response_error(e: &HookError) -> bool {
    matches!(e, HookError::Http(m) if m.contains("InvalidContentType"))
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
    if scheme != "http" && scheme != "https" {
        return Err(HookError::Http(format!("unsupported scheme: {scheme}")));
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
    let uri = format!("{scheme}://{host_port}{path}");
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

/// Certificate checks skipped for HTTPS hooks (upstream `InsecureSkipVerify`);
/// handshake signatures are still verified.
mod insecure {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, Error, SignatureScheme};

    /// Accepts any server certificate.
    #[derive(Debug)]
    pub(super) struct NoVerify(pub(super) Arc<CryptoProvider>);

    impl ServerCertVerifier for NoVerify {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
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

    /// A plain HTTP server on loopback answering 500 to `n` requests; sends
    /// each request line back through the channel.
    async fn plain_server(n: usize) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for _ in 0..n {
                let Ok((mut sock, _)) = l.accept().await else {
                    return;
                };
                // One read holds a whole request (or a TLS hello) on loopback.
                let mut buf = vec![0; 8192];
                let len = sock.read(&mut buf).await.unwrap_or(0);
                let text = String::from_utf8_lossy(&buf[..len]).into_owned();
                let first = text.split("\r\n").next().unwrap_or_default().to_string();
                let _ = tx.send(first);
                let _ = sock
                    .write_all(
                        b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await;
            }
        });
        (port, rx)
    }

    fn hook(json: serde_json::Value) -> LifecycleHandler {
        serde_json::from_value(json).expect("handler")
    }

    fn pod() -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}),
        )
        .expect("pod")
    }

    #[tokio::test]
    async fn http_hooks_reach_the_server_and_https_falls_back_to_http() {
        let r = HandlerRunner::new(Arc::new(cri::fake::FakeRuntime::new()));
        let (port, mut seen) = plain_server(3).await;
        let c = container();
        let ip = ["127.0.0.1".to_string()];
        // A 500 does not fail a hook (upstream checks transport errors only).
        let h = hook(serde_json::json!({"httpGet": {"path": "/echo?msg=poststart", "port": port}}));
        let out = r
            .run("id", &pod(), &c, &h, &ip, Duration::from_secs(10))
            .await
            .expect("hook");
        assert_eq!(out, None);
        assert_eq!(
            seen.recv().await.as_deref(),
            Some("GET /echo?msg=poststart HTTP/1.1")
        );
        // HTTPS against a plain server: the TLS hello reaches it, then the retry.
        let h = hook(
            serde_json::json!({"httpGet": {"path": "/x", "port": port, "scheme": "HTTPS",
            "httpHeaders": [{"name": "Authorization", "value": "secret"}]}}),
        );
        let out = r
            .run("id", &pod(), &c, &h, &ip, Duration::from_secs(10))
            .await
            .expect("hook");
        assert_eq!(
            out,
            Some(format!(
                "request to HTTPS lifecycle hook 127.0.0.1:{port} got HTTP response, retry with HTTP succeeded"
            ))
        );
        let _tls_hello = seen.recv().await;
        assert_eq!(seen.recv().await.as_deref(), Some("GET /x HTTP/1.1"));
    }

    #[tokio::test]
    async fn a_refused_http_hook_fails_with_upstreams_message() {
        let r = HandlerRunner::new(Arc::new(cri::fake::FakeRuntime::new()));
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        drop(l);
        let h = hook(serde_json::json!({"httpGet": {"path": "/echo", "port": port}}));
        let e = r
            .run(
                "id",
                &pod(),
                &container(),
                &h,
                &["127.0.0.1".into()],
                Duration::from_secs(10),
            )
            .await
            .expect_err("refused");
        assert!(
            e.message.starts_with(
                "HTTP lifecycle hook (/echo) for Container \"c\" in Pod \"p_ns(u)\" failed - error: "
            ),
            "{}",
            e.message
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_hook_sleeps_within_its_deadline() {
        let r = HandlerRunner::new(Arc::new(cri::fake::FakeRuntime::new()));
        let h = hook(serde_json::json!({"sleep": {"seconds": 5}}));
        let t0 = tokio::time::Instant::now();
        assert!(
            r.run("id", &pod(), &container(), &h, &[], Duration::from_secs(30))
                .await
                .is_ok()
        );
        assert_eq!(t0.elapsed().as_secs(), 5);
        let e = r
            .run("id", &pod(), &container(), &h, &[], Duration::from_secs(2))
            .await
            .expect_err("cut short");
        assert!(
            e.message
                .starts_with("Sleep lifecycle hook (5) for Container \"c\""),
            "{}",
            e.message
        );
    }
}
