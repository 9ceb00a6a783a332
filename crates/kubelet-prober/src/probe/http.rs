//! HTTP probes (upstream `pkg/probe/http/{http.go,request.go}`): a GET to
//! `scheme://host:port/path` (host defaults to the pod IP) with the probe's
//! headers, `User-Agent: kube-probe/<major>.<minor>` and `Accept: */*`
//! unless set, no keep-alive, no proxy, and for https no certificate
//! verification. 2xx succeeds, 3xx that is not followed is a warning, the
//! rest fails. Redirects are followed up to 10 times on the same host; a
//! redirect to another host is not followed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use tracing::warn;

use super::{
    MAX_OUTPUT, Output, ProbeError, ProbeOutcome, go_io_error, join_host_port, resolve_port,
};

/// Upstream stops after this many requests in one probe.
const MAX_REQUESTS: usize = 10;

/// One probe's request: the URL and the headers to send.
#[derive(Clone, Debug)]
pub struct ProbeRequest {
    /// `scheme://host:port/path`.
    pub url: Uri,
    /// Headers incl. User-Agent, Accept and any Host override.
    pub headers: HeaderMap,
}

/// Builds the request for an `httpGet` action (upstream
/// `NewRequestForHTTPGetAction`).
pub fn request_for(
    action: &HTTPGetAction,
    container: &Container,
    pod_ip: &str,
) -> Result<ProbeRequest, ProbeError> {
    let scheme = match action.scheme.as_deref() {
        None | Some("") => "http".to_string(),
        Some(s) => s.to_lowercase(),
    };
    let host = action
        .host
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_ip);
    let port = resolve_port(&action.port, container)?;
    let path = action.path.as_deref().unwrap_or("");
    let sep = if path.is_empty() || path.starts_with('/') {
        ""
    } else {
        "/"
    };
    let raw = format!("{scheme}://{}{sep}{path}", join_host_port(host, port));
    let url = raw
        .parse::<Uri>()
        .map_err(|e| ProbeError::Request(format!("parse {raw:?}: {e}")))?;

    let mut headers = HeaderMap::new();
    for h in action.http_headers.iter().flatten() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
            ProbeError::Request(format!("net/http: invalid header field name {:?}", h.name))
        })?;
        let value = HeaderValue::from_str(&h.value).map_err(|_| {
            ProbeError::Request(format!(
                "net/http: invalid header field value for {:?}",
                h.name
            ))
        })?;
        headers.append(name, value);
    }
    match headers.get(header::USER_AGENT) {
        None => {
            headers.insert(
                header::USER_AGENT,
                HeaderValue::from_static(crate::USER_AGENT),
            );
        }
        // Go sends no User-Agent when it is set to "".
        Some(v) if v.is_empty() => {
            headers.remove(header::USER_AGENT);
        }
        Some(_) => {}
    }
    match headers.get(header::ACCEPT) {
        None => {
            headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        }
        Some(v) if v.is_empty() => {
            headers.remove(header::ACCEPT);
        }
        Some(_) => {}
    }
    // Upstream's transport disables keep-alive.
    headers
        .entry(header::CONNECTION)
        .or_insert(HeaderValue::from_static("close"));
    Ok(ProbeRequest { url, headers })
}

/// Sends HTTP probes; one per kubelet, shared by every worker.
#[derive(Clone)]
pub struct HttpProber {
    plain: Client<HttpConnector, Empty<Bytes>>,
    tls: Option<Client<HttpsConnector<HttpConnector>, Empty<Bytes>>>,
}

impl Default for HttpProber {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpProber {
    /// A prober with no connection reuse and, for https, no certificate
    /// verification (upstream `InsecureSkipVerify`).
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let plain = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .http1_title_case_headers(true)
            .build(connector.clone());
        connector.enforce_http(false);
        let tls = match insecure_tls_config() {
            Ok(cfg) => {
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(cfg)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(connector);
                Some(
                    Client::builder(TokioExecutor::new())
                        .pool_max_idle_per_host(0)
                        .http1_title_case_headers(true)
                        .build(https),
                )
            }
            Err(e) => {
                warn!(error = %e, "no TLS for https probes");
                None
            }
        };
        Self { plain, tls }
    }

    /// Runs one probe within `timeout` (upstream `DoHTTPProbe`). Transport
    /// errors and timeouts are failures; only a body read error is an error.
    pub async fn probe(&self, req: &ProbeRequest, timeout: Duration) -> Result<Output, ProbeError> {
        match tokio::time::timeout(timeout, self.follow(req)).await {
            Ok(r) => r,
            Err(_) => Ok((
                ProbeOutcome::Failure,
                format!(
                    "Get {:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                    req.url.to_string()
                ),
            )),
        }
    }

    async fn follow(&self, req: &ProbeRequest) -> Result<Output, ProbeError> {
        let first_host = req.url.host().map(str::to_string);
        let mut url = req.url.clone();
        let mut headers = req.headers.clone();
        let mut sent = 0usize;
        loop {
            sent += 1;
            let resp = match self.send(&url, &headers).await {
                Ok(r) => r,
                Err(msg) => {
                    return Ok((
                        ProbeOutcome::Failure,
                        format!("Get {:?}: {msg}", url.to_string()),
                    ));
                }
            };
            let status = resp.status().as_u16();
            let location = resp
                .headers()
                .get(header::LOCATION)
                .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned())
                .filter(|l| !l.is_empty());
            if let (true, Some(loc)) = (matches!(status, 301 | 302 | 303 | 307 | 308), location) {
                let next = match resolve_location(&url, &loc) {
                    Ok(n) => n,
                    Err(e) => {
                        return Ok((
                            ProbeOutcome::Failure,
                            format!(
                                "Get {:?}: failed to parse Location header {loc:?}: {e}",
                                url.to_string()
                            ),
                        ));
                    }
                };
                // Another host: stop and judge this response (a warning).
                if next.host().map(str::to_string) == first_host {
                    if sent >= MAX_REQUESTS {
                        return Ok((
                            ProbeOutcome::Failure,
                            format!("Get {:?}: stopped after 10 redirects", url.to_string()),
                        ));
                    }
                    // Go keeps a Host override only through a relative redirect.
                    if next_is_absolute(&loc) {
                        headers.remove(header::HOST);
                    }
                    if let Ok(v) = HeaderValue::from_str(&url.to_string()) {
                        headers.insert(header::REFERER, v);
                    }
                    url = next;
                    continue;
                }
            }
            let body = read_body(resp).await?;
            return Ok(classify(status, &body));
        }
    }

    async fn send(&self, url: &Uri, headers: &HeaderMap) -> Result<Response<Incoming>, String> {
        let mut req = Request::get(url.clone())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        *req.headers_mut() = headers.clone();
        let fut = match url.scheme_str() {
            Some("http") => self.plain.request(req),
            Some("https") => match &self.tls {
                Some(c) => c.request(req),
                None => return Err("TLS is not available".to_string()),
            },
            other => {
                return Err(format!(
                    "unsupported protocol scheme {:?}",
                    other.unwrap_or("")
                ));
            }
        };
        fut.await.map_err(|e| client_error(&e, url))
    }
}

/// Upstream's verdict on the final response.
fn classify(status: u16, body: &str) -> Output {
    match status {
        200..=299 => (ProbeOutcome::Success, body.to_string()),
        300..=399 => (
            ProbeOutcome::Warning,
            format!("Probe terminated redirects, Response body: {body}"),
        ),
        // Upstream keeps the body out of the user-facing message.
        _ => (
            ProbeOutcome::Failure,
            format!("HTTP probe failed with statuscode: {status}"),
        ),
    }
}

/// Reads at most 10 KiB of the body; more is silently truncated.
async fn read_body(resp: Response<Incoming>) -> Result<String, ProbeError> {
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < MAX_OUTPUT {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = data.len().min(MAX_OUTPUT - buf.len());
                    buf.extend_from_slice(&data[..take]);
                }
            }
            Some(Err(e)) => return Err(ProbeError::Body(e.to_string())),
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A transport error as Go's client words it after `Get "<url>": `.
fn client_error(e: &hyper_util::client::legacy::Error, url: &Uri) -> String {
    let mut io: Option<&std::io::Error> = None;
    let mut incomplete = false;
    let mut innermost = e.to_string();
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if io.is_none() {
            io = s.downcast_ref::<std::io::Error>();
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            incomplete |= h.is_incomplete_message();
        }
        innermost = s.to_string();
        src = s.source();
    }
    if e.is_connect() {
        let default_port = if url.scheme_str() == Some("https") {
            443
        } else {
            80
        };
        let addr = join_host_port(
            url.host()
                .unwrap_or("")
                .trim_start_matches('[')
                .trim_end_matches(']'),
            url.port_u16().unwrap_or(default_port),
        );
        return match io {
            Some(io) if io.get_ref().is_none() || io.raw_os_error().is_some() => {
                format!("dial tcp {addr}: connect: {}", go_io_error(io))
            }
            _ => format!("dial tcp {addr}: {innermost}"),
        };
    }
    if incomplete {
        return "EOF".to_string();
    }
    innermost
}

fn next_is_absolute(loc: &str) -> bool {
    scheme_of(loc).is_some()
}

/// The scheme of an absolute URL reference (`http:` in `http://x/`).
fn scheme_of(s: &str) -> Option<&str> {
    let colon = s.find(':')?;
    let scheme = &s[..colon];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic() && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)))
        .then_some(scheme)
}

/// Resolves a `Location` header against the URL that answered it.
fn resolve_location(base: &Uri, loc: &str) -> Result<Uri, String> {
    let loc = loc.split('#').next().unwrap_or("");
    let scheme = base.scheme_str().unwrap_or("http");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or("");
    let path = base.path();
    let abs = if scheme_of(loc).is_some() {
        loc.to_string()
    } else if loc.starts_with("//") {
        format!("{scheme}:{loc}")
    } else if loc.starts_with('/') {
        format!("{scheme}://{authority}{loc}")
    } else if loc.starts_with('?') || loc.is_empty() {
        format!("{scheme}://{authority}{path}{loc}")
    } else {
        let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        let dir = if dir.is_empty() { "/" } else { dir };
        format!("{scheme}://{authority}{dir}{loc}")
    };
    let uri = abs.parse::<Uri>().map_err(|e| e.to_string())?;
    if uri.authority().is_none() {
        return Err("missing host".to_string());
    }
    Ok(uri)
}

/// Upstream probes https with `InsecureSkipVerify`: no chain or name check,
/// but the handshake signatures are still verified.
fn insecure_tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
        .with_no_client_auth();
    Ok(cfg)
}

#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
